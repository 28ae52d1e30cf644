"""Train a model: `python -m pipeline.train [--config FILE] [--workdir DIR] [--set key=value ...]`.

Builds the vocabularies on first use, trains with checkpoints (a re-run with the same work
directory resumes from the last one), then evaluates on the test split.
"""

import argparse
import sys
from pathlib import Path

from pipeline.config import (
    DEFAULT_CONFIG,
    RELOCATABLE_DATA_KEYS,
    load_config,
    parse_export_formats,
)
from pipeline.distribution import EXIT_RESTART, WorkerLost, current_task
from pipeline.errors import UserError, report_user_errors
from pipeline.workdir import CONFIG_FILE


def parse_args(argv):
    parser = argparse.ArgumentParser(prog="python -m pipeline.train", description=__doc__)
    parser.add_argument("--config", type=Path, default=DEFAULT_CONFIG, help="experiment YAML")
    parser.add_argument(
        "--workdir",
        type=Path,
        help="where vocabularies, checkpoints and reports go (default: runs/<config name>)",
    )
    parser.add_argument(
        "--strategy",
        choices=("default", "mirrored", "multi_worker", "tpu"),
        help="tf.distribute strategy (overrides distribute.strategy)",
    )
    parser.add_argument(
        "--set",
        action="append",
        default=[],
        metavar="SECTION.KEY=VALUE",
        help="override one configuration value; repeatable",
    )
    return parser.parse_args(argv)


def log(message):
    print(message, flush=True)


def _check_workdir(workdir, config):
    """Refuses a work directory that holds a different model, so nothing is overwritten."""
    saved = workdir / CONFIG_FILE
    if not saved.is_file():
        return
    previous = load_config(saved)
    for section in ("data", "model"):
        changed = sorted(k for k in config[section] if config[section][k] != previous[section][k])
        if section == "data":  # paths may move; vocabulary and length settings may not
            changed = [k for k in changed if k not in RELOCATABLE_DATA_KEYS]
        if changed:
            keys = ", ".join(f"{section}.{k}" for k in changed)
            raise UserError(
                f"{workdir} holds a model trained with other settings ({keys} differ from "
                f"{saved}); use a new --workdir"
            )


@report_user_errors
def main(argv=None):
    args = parse_args(sys.argv[1:] if argv is None else argv)
    overrides = args.set + ([f"distribute.strategy={args.strategy}"] if args.strategy else [])
    config = load_config(args.config, overrides)
    workdir = args.workdir or Path("runs") / args.config.stem
    workdir.mkdir(parents=True, exist_ok=True)
    _check_workdir(workdir, config)
    log(f"Work directory: {workdir}")
    # TensorFlow loads only once the configuration is valid.
    from pipeline.callbacks import TrainingInterrupted
    from pipeline.trainer import run

    try:
        history = run(config, workdir, log)
    except WorkerLost as lost:
        log(f"\n{lost}")
        sys.exit(EXIT_RESTART)
    except TrainingInterrupted as stop:
        log(f"\nStopped ({stop}); saved {stop.checkpoint}. Run the same command to resume from it.")
        sys.exit(128 + stop.signum)
    if config["export"]["after_training"] and current_task(config["distribute"]).is_chief:
        from export.exporter import export_model

        formats = parse_export_formats(config["export"]["formats"], "export.formats")
        export_model(workdir, formats=formats, log=log)
    log(
        "\nDone. Everything is in " + str(workdir) + ":\n"
        f"  model.keras, vocab/, checkpoints/, logs/ (tensorboard --logdir {workdir / 'logs'})\n"
        f"  test_report.json, test_translations.txt"
        + (", export/ (SavedModel and ONNX)" if config["export"]["after_training"] else "")
        + "\n"
        "Next:\n"
        f"  echo 'Ein Hund läuft im Park.' | python -m pipeline.translate --workdir {workdir}\n"
        f"  python -m pipeline.evaluate --workdir {workdir} --split test"
    )
    return history


if __name__ == "__main__":
    main()
