"""Export a trained model: `python -m export --workdir DIR [--output OUT] [--version N]
[--formats saved_model,onnx,ctranslate2] [--model-name NAME]`.

Writes OUT/saved_model/<model_name>/<version>/ (TF Serving), OUT/onnx/ (ONNX Runtime) and, for
a Transformer on request, OUT/ctranslate2/ (CTranslate2, with weights of
export.ctranslate2_quantization).
"""

import argparse
import sys
from pathlib import Path

from pipeline.config import DEFAULT_EXPORT_FORMATS, EXPORT_FORMATS, parse_export_formats
from pipeline.core.errors import report_user_errors


def parse_args(argv):
    parser = argparse.ArgumentParser(prog="python -m export", description=__doc__)
    parser.add_argument("--workdir", type=Path, required=True, help="a trained work directory")
    parser.add_argument(
        "--output", type=Path, help="export root (default: export.directory, else WORKDIR/export)"
    )
    parser.add_argument(
        "--version", type=int, help="SavedModel version (default: one more than the highest)"
    )
    parser.add_argument(
        "--formats",
        default=",".join(DEFAULT_EXPORT_FORMATS),
        help=f"comma-separated: {', '.join(EXPORT_FORMATS)} (ctranslate2: Transformers only)",
    )
    parser.add_argument("--model-name", help="TF Serving model name (default: export.model_name)")
    parser.add_argument(
        "--wait",
        action="store_true",
        help="if another command is writing there, wait for it to end (default: refuse)",
    )
    parser.add_argument(
        "--verbose", action="store_true", help="the converters' messages on stderr, not in a log"
    )
    return parser.parse_args(argv)


@report_user_errors
def main(argv=None):
    args = parse_args(sys.argv[1:] if argv is None else argv)
    formats = parse_export_formats(args.formats, "--formats")
    from export.exporter import export_model  # TensorFlow loads once the arguments are valid

    return export_model(
        args.workdir,
        args.output,
        formats,
        args.version,
        args.model_name,
        verbose=args.verbose,
        wait=args.wait,
    )


if __name__ == "__main__":
    main()
