"""Import a pretrained translation model: `python -m pipeline.import_model SOURCE --workdir DIR`.

SOURCE is a checkpoint's directory in the Hugging Face layout (config.json, model.safetensors
or pytorch_model.bin, generation_config.json, and the tokenizer's files), or a Hub id such as
Helsinki-NLP/opus-mt-de-en where huggingface_hub is installed and the network allows. DIR
becomes an ordinary work directory: translate, evaluate, export or fine-tune it
(`pipeline.train --init-from DIR`) as any trained one. It translates as transformers'
`generate()` does with the checkpoint's generation config; search flags change that as for
any model. Supported: Marian (OPUS-MT); M2M100, NLLB-200 and mBART-50. The checkpoint's
licence, where its model card or config names one, is printed: it applies to the import.
"""

import argparse
import shutil
import sys
from pathlib import Path

from pipeline.core.errors import UserError, report_user_errors
from pipeline.core.multilingual import RequestLanguages, model_languages


def parse_args(argv):
    parser = argparse.ArgumentParser(
        prog="python -m pipeline.import_model",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("source", help="a checkpoint directory (Hugging Face layout) or Hub id")
    parser.add_argument(
        "--workdir",
        type=Path,
        required=True,
        help="the work directory to create (it must not hold a model yet)",
    )
    return parser.parse_args(argv)


def log(message):
    print(message, flush=True)


def import_checkpoint(source, workdir, log=log):
    """Converts the checkpoint `source` (a directory or Hub id) into the work directory
    `workdir`, which must not hold a model; returns its configuration."""
    from pipeline.pretrained import FAMILIES
    from pipeline.pretrained.checkpoint import Checkpoint, resolve
    from pipeline.pretrained.imported import write_work_directory
    from pipeline.workdir import CONFIG_FILE, MODEL_FILE, exclusive_writer

    workdir = Path(workdir)
    if (workdir / CONFIG_FILE).exists() or (workdir / MODEL_FILE).exists():
        raise UserError(f"{workdir} already holds a model; import into a new --workdir")
    checkpoint = Checkpoint(resolve(source, log))
    family = checkpoint.config.get("model_type")
    if family not in FAMILIES:
        raise UserError(f"{checkpoint.directory / 'config.json'}: model_type {family!r} is not "
                        f"supported (supported: {', '.join(FAMILIES)})")  # fmt: skip
    stored = checkpoint.stored_as()
    weights = f", its weights stored as {stored} (read as float32)" if stored else ""
    log(f"Reading the {family} checkpoint {checkpoint.directory}{weights}")
    licence = checkpoint.licence()
    if licence:
        log(f"Licence: {licence}, as the checkpoint states it; the imported model and its "
            "exports are used under its terms")  # fmt: skip
    imported = FAMILIES[family].convert(checkpoint)
    if imported.unproducible:
        log(
            f"{len(imported.unproducible):,} vocabulary tokens are no piece of either "
            f"SentencePiece model, so no text segments into them (as with transformers' "
            f"tokenizer): "
            f"{', '.join(imported.unproducible[:5])}{' ...' if imported.unproducible[5:] else ''}"
        )
    if not imported.search["renormalized"]:
        log(
            "generation_config.json: renormalize_logits is false; the search leaves the tokens "
            "the model never outputs out of its softmax, as renormalize_logits: true does"
        )
    if imported.search["sampled"]:
        log(
            "generation_config.json: do_sample is true; the toolkit's search is beam search "
            "all the same (sampling: python -m pipeline.translate --sampling-temperature T)"
        )
    created = not workdir.exists()
    try:
        with exclusive_writer(workdir):
            config = write_work_directory(imported, workdir, log)
    except BaseException:
        if created:  # nothing half-written: not even the lock file
            shutil.rmtree(workdir, ignore_errors=True)
        raise
    decode = config["decode"]
    inputs = RequestLanguages.of(model_languages(config["data"])).inputs
    flags = "".join(f" --{name.replace('_', '-')} CODE" for name in reversed(inputs))
    codes = (f"  (CODE: the checkpoint's language codes, listed in {workdir / CONFIG_FILE})\n"
             if inputs else "")  # fmt: skip
    log(
        f"Imported into {workdir}: translates as transformers' generate() does (beam "
        f"{decode['beam_size']}, length penalty {decode['length_penalty']}, at most "
        f"{decode['max_length_cap']} tokens)\n"
        f"Next:\n  python -m pipeline.translate --workdir {workdir}{flags} < input.txt\n"
        f"{codes}  python -m export --workdir {workdir}"
    )
    return config


@report_user_errors
def main(argv=None):
    args = parse_args(sys.argv[1:] if argv is None else argv)
    import_checkpoint(args.source, args.workdir)


if __name__ == "__main__":
    main()
