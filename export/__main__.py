"""Export a trained model: `python -m export --workdir DIR [--output OUT] [--version N]
[--formats saved_model,onnx,ctranslate2] [--model-name NAME] [--onnx-search greedy]
[--saved-model-precision bfloat16]`, or an
ensemble of models of one vocabulary as one model: `python -m export --ensemble DIR DIR ...
[--weights W ...] --output OUT`.

Writes OUT/saved_model/<model_name>/<version>/ (TF Serving), OUT/onnx/ (ONNX Runtime) and, for
a Transformer on request, OUT/ctranslate2/ (CTranslate2, with weights of
export.ctranslate2_quantization).
"""

import argparse
import sys
from pathlib import Path

from pipeline.config import (
    DEFAULT_EXPORT_FORMATS,
    EXPORT_FORMATS,
    ONNX_SEARCHES,
    SAVED_MODEL_PRECISIONS,
    parse_export_formats,
)
from pipeline.core.errors import UserError, report_user_errors


def parse_args(argv):
    parser = argparse.ArgumentParser(prog="python -m export", description=__doc__)
    models = parser.add_mutually_exclusive_group(required=True)
    models.add_argument("--workdir", type=Path, help="a trained work directory")
    models.add_argument(
        "--ensemble",
        type=Path,
        nargs="+",
        metavar="DIR",
        help="trained work directories of one vocabulary, exported as one model whose search "
        "averages their log-probabilities (needs --output)",
    )
    parser.add_argument(
        "--weights", type=float, nargs="+", metavar="W", help="--ensemble: each model's weight"
    )
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
        "--onnx-search",
        choices=ONNX_SEARCHES,
        help="the ONNX model's search: beam (its options as inputs) or greedy (alone, faster; "
        "default: export.onnx_search)",
    )
    parser.add_argument(
        "--saved-model-precision",
        choices=SAVED_MODEL_PRECISIONS,
        help="the SavedModel's weights and matrix products: float32 (the model's outputs) or "
        "bfloat16 (half the size, faster where the CPU has AVX512-BF16 or AMX; default: "
        "export.saved_model_precision)",
    )
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

    if args.weights and not args.ensemble:
        raise UserError("--weights goes with --ensemble")
    first, *others = args.ensemble or [args.workdir]
    return export_model(
        first,
        args.output,
        formats,
        args.version,
        args.model_name,
        verbose=args.verbose,
        wait=args.wait,
        ensemble=others,
        weights=args.weights,
        onnx_search=args.onnx_search,
        saved_model_precision=args.saved_model_precision,
    )


if __name__ == "__main__":
    main()
