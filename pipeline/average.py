"""Checkpoint averaging: a model whose weights are the mean of the last N checkpoints', or of
the N best by validation loss, BLEU or chrF (kept with `train.keep_best`).

    python -m pipeline.average --workdir runs/X --last 3 [--up-to-step S] --output runs/X-averaged
    python -m pipeline.average --workdir runs/X --best 3 --output runs/X-best

writes a new work directory (configuration, vocabularies, `model.keras`) that
`pipeline.evaluate`, `pipeline.translate` and `export` take like any other; the source work
directory is left as it was. Training does the same at its end with `train.average_checkpoints`.
Averaging the last few checkpoints of a run smooths the noise of the final updates and usually
adds a little BLEU, for free at decoding time.
"""

import argparse
import shutil
import sys
from pathlib import Path

from pipeline.core.errors import UserError, report_user_errors

DEFAULT_LAST = 3  # checkpoints averaged without --last or --best


def parse_args(argv):
    parser = argparse.ArgumentParser(
        prog="python -m pipeline.average", description=__doc__.split("\n\n")[0]
    )
    parser.add_argument("--workdir", type=Path, required=True, help="a trained work directory")
    which = parser.add_mutually_exclusive_group()
    which.add_argument("--last", type=int, help=f"the last N checkpoints (default {DEFAULT_LAST})")
    which.add_argument(
        "--best",
        type=int,
        help="the N best checkpoints by the run's train.early_stopping_metric (those that "
        "train.keep_best kept)",
    )
    parser.add_argument(
        "--up-to-step",
        type=int,
        help="average the last checkpoints saved at or before this training step (default: "
        "the newest), e.g. to score one run at several lengths",
    )
    parser.add_argument(
        "--output", type=Path, required=True, help="the new work directory to write"
    )
    parser.add_argument(
        "--wait",
        action="store_true",
        help="if another command is writing to --output, wait for it to end (default: refuse)",
    )
    return parser.parse_args(argv)


@report_user_errors
def main(argv=None):
    args = parse_args(sys.argv[1:] if argv is None else argv)
    if args.best is None and args.last is None:
        args.last = DEFAULT_LAST
    for flag, count in (("--last", args.last), ("--best", args.best)):
        if count is not None and count < 1:
            raise UserError(f"{flag} must be at least 1, got {count}")
    if args.best is not None and args.up_to_step is not None:
        raise UserError("--up-to-step goes with --last: the best checkpoints are chosen by score")
    if args.output.resolve() == args.workdir.resolve():
        raise UserError("--output must differ from --workdir: the trained model is kept as it is")
    from pipeline.data.tokenizer import vocabulary_paths
    from pipeline.training.checkpoints import (
        average_checkpoints,
        best_checkpoints,
        last_checkpoints,
    )
    from pipeline.workdir import (
        CHECKPOINT_DIR,
        CONFIG_FILE,
        MODEL_FILE,
        exclusive_writer,
        load_trained,
        save_model_atomically,
        write_directory_atomically,
    )

    config, model = load_trained(args.workdir)[:2]
    if args.best is not None:
        chosen = best_checkpoints(args.workdir / CHECKPOINT_DIR, args.best)
        paths = [path for path, _ in chosen]
        names = ", ".join(f"{Path(path).name}: {entry['metric']} {entry['value']:.3f}"
                          for path, entry in chosen)  # fmt: skip
        wanted, which = args.best, "best"
    else:
        paths = last_checkpoints(args.workdir / CHECKPOINT_DIR, args.last, args.up_to_step)
        names = ", ".join(Path(path).name for path in paths)
        wanted, which = args.last, "last"
    if len(paths) < wanted:
        print(f"Only {len(paths)} checkpoints are kept; averaging those", file=sys.stderr)
    average_checkpoints(model, config["train"], paths)

    def fill(directory):
        shutil.copy2(args.workdir / CONFIG_FILE, directory / CONFIG_FILE)
        vocabulary_dir = vocabulary_paths(args.workdir)[0].parent
        shutil.copytree(vocabulary_dir, directory / vocabulary_dir.name)
        save_model_atomically(model, directory / MODEL_FILE)

    with exclusive_writer(args.output, args.wait):
        write_directory_atomically(args.output, fill)
    print(f"Averaged the {which} {len(paths)} checkpoints ({names}) into "
          f"{args.output / MODEL_FILE}")  # fmt: skip


if __name__ == "__main__":
    main()
