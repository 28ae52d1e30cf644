"""Teaches a multilingual model the directions it never trained on, from its own translations
through a pivot language (back-translation for zero-shot directions: Gu et al., 2019, "Improved
Zero-shot Neural Machine Translation via Ignoring Spurious Correlations"; Zhang et al., 2020,
"Improving Massively Multilingual Neural Machine Translation and Zero-Shot Translation").

    python -m pipeline.backtranslate --model runs/MODEL [--workdir DIR] [--pivot en]
        [--directions de-fr,fr-de] [--set section.key=value ...] [--wait]

A model trained into and out of English only translates German into French poorly: it has never
seen a German source with the French tag, and drifts into English. For each untrained direction
X->Z of its multi-way set, the model's ONNX export (MODEL/export/onnx, `python -m export`
writes it) translates the pivot language's training lines into X, and the model is fine-tuned
(`pipeline.train --init-from`) on its directions plus X->Z from these synthetic X sources to the
set's real Z lines (`data.multiway_synthetic`, `data.synthetic_directions`). Only the pivot's
pairs are used: no X-Z pair of the set is read.

Each language's translations stream to DIR/backtranslated/X/ a block at a time, resume after a
stop, and appear as a whole file only once complete (as `pipeline.distill`'s, whose `distill`
settings choose the search: `distill.beam_size`, `distill.int8`, `distill.batch_size`).
The fine-tuning takes the model's own configuration, with `--set` to change its schedule.
"""

import argparse
import json
import sys
from pathlib import Path

from pipeline.config import load_config
from pipeline.core import multilingual
from pipeline.core.errors import UserError, report_user_errors
from pipeline.distill import CORPUS_FILES, Distillation, log, teacher_export
from pipeline.workdir import CONFIG_FILE

BACKTRANSLATED_DIR = "backtranslated"  # in the work directory, a folder a language


def parse_args(argv):
    parser = argparse.ArgumentParser(
        prog="python -m pipeline.backtranslate",
        description=__doc__.split("\n\n")[0],
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--model", type=Path, required=True,
                        help="the multilingual model's trained, exported workdir")  # fmt: skip
    parser.add_argument("--workdir", type=Path,
                        help="the fine-tuned model's work directory (default: "
                             "runs/<model>_backtranslated)")  # fmt: skip
    parser.add_argument("--pivot",
                        help="the language translated into each synthetic source (default: the "
                             "one that the model translates into every source needed)")  # fmt: skip
    parser.add_argument("--directions",
                        help="the directions to learn, such as de-fr,fr-de (default: every "
                             "direction of the set the model has not trained)")  # fmt: skip
    parser.add_argument("--wait", action="store_true",
                        help="if another command writes to the work directory, wait")  # fmt: skip
    parser.add_argument("--set", action="append", default=[], metavar="SECTION.KEY=VALUE",
                        help="override a value of the model's config; repeatable")  # fmt: skip
    return parser.parse_args(argv)


def untrained_directions(data, asked=None):
    """The directions to learn: `asked` (a `data.directions` text), else every direction of
    the set that `data` does not train; refused when one is trained already or none is left."""
    known, trained = multilingual.languages(data), multilingual.training_directions(data)
    if asked:
        chosen = multilingual.parse_directions(asked, known, "--directions")
        for direction in chosen:
            if direction in trained:
                raise UserError(f"--directions: the model trains {direction} already")
        return chosen
    chosen = [d for d in multilingual.parse_directions(multilingual.ALL_DIRECTIONS, known)
              if d not in trained]  # fmt: skip
    if not chosen:
        raise UserError("the model trains every direction of its set already: nothing to learn")
    return chosen


def pivot_language(data, sources, asked=None):
    """The language whose lines become each of `sources` by a direction the model trains:
    `asked`, or else the first that has a trained direction into all of them."""
    trained = set(multilingual.training_directions(data))
    candidates = [asked] if asked else multilingual.languages(data)
    for pivot in candidates:
        if pivot not in sources and all(
            multilingual.Direction(pivot, source) in trained for source in sources
        ):
            return pivot
    needed = ", ".join(sources)
    if asked:
        raise UserError(f"--pivot {asked}: the model does not translate {asked} into each of "
                        f"{needed}, or {asked} is one of them")  # fmt: skip
    raise UserError(f"no language of the set is translated by the model into each of {needed}; "
                    "give fewer --directions")  # fmt: skip


@report_user_errors
def main(argv=None):
    args = parse_args(sys.argv[1:] if argv is None else argv)
    from pipeline.train import fine_tuning_config, train_in

    saved = args.model / CONFIG_FILE
    if not saved.is_file():
        raise UserError(f"--model {args.model}: no trained model there ({CONFIG_FILE} expected)")
    data = load_config(saved, saved=True)["data"]
    if not multilingual.is_multilingual(data):
        raise UserError(f"--model {args.model}: not a multilingual model (data.multiway_train); "
                        "back-translation through a pivot needs one")  # fmt: skip
    teacher_export(args.model)
    directions = untrained_directions(data, args.directions)
    sources = sorted({d.source for d in directions})
    pivot = pivot_language(data, sources, args.pivot)
    workdir = args.workdir or Path("runs") / f"{args.model.name}_backtranslated"
    settings = load_config(saved, args.set, saved=True)["distill"]
    if settings["interpolate"]:
        raise UserError("distill.interpolate chooses among translations by their reference: "
                        "back-translation's have none (the point is to learn without)")  # fmt: skip
    synthetic = dict(data["multiway_synthetic"] or {})
    for language in sources:
        log(f"Back-translation: {pivot} -> {language}, the sources of "
            f"{', '.join(str(d) for d in directions if d.source == language)}")  # fmt: skip
        made = Distillation(workdir / BACKTRANSLATED_DIR / language, data["multiway_train"][pivot],
                            [args.model], settings, target_language=language)  # fmt: skip
        if not made.done(False, None):
            made.translate()
            made.write_corpus(None, False, None)
        synthetic[language] = str(made.folder / CORPUS_FILES[1])
    learnt = [data["synthetic_directions"]] if data["synthetic_directions"] else []
    learnt += [str(direction) for direction in directions]
    overrides = [
        f"data.multiway_synthetic={json.dumps(synthetic)}",
        f"data.synthetic_directions={','.join(learnt)}",
    ]
    config = fine_tuning_config(load_config(saved, overrides + args.set, saved=True), args.model)
    return train_in(config, workdir, args.wait, args.model)


if __name__ == "__main__":
    main()
