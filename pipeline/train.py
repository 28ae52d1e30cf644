"""Train a model: `python -m pipeline.train [--config FILE] [--workdir DIR] [--set key=value ...]`.

Builds the vocabularies on first use, trains with checkpoints (a re-run with the same work
directory resumes from the last one), then evaluates on the test split.
"""

import argparse
import contextlib
import sys
from pathlib import Path

from pipeline.config import (
    DEFAULT_CONFIG,
    LANGUAGE_TOKEN_KEYS,
    RELOCATABLE_DATA_KEYS,
    load_config,
)
from pipeline.core import multilingual
from pipeline.core.errors import UserError, report_user_errors
from pipeline.training.distribution import EXIT_RESTART, WorkerLost, current_task
from pipeline.workdir import CONFIG_FILE, MODEL_FILE, exclusive_writer


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
        "--init-from",
        type=Path,
        metavar="DIR",
        help="fine-tune: start from the trained work directory DIR's weights and vocabularies "
        "(the model settings must match), with a fresh optimizer and schedule; DIR is only read",
    )
    parser.add_argument(
        "--wait",
        action="store_true",
        help="if another command is writing to the work directory, wait for it to end "
        "(default: refuse at once)",
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
    previous = load_config(saved, saved=True)
    for section in ("data", "model"):
        ours, theirs = config[section], previous[section]
        changed = sorted(k for k in ours if ours[k] != theirs.get(k))
        if section == "data":  # paths may move; vocabulary and length settings may not
            changed = [k for k in changed if k not in RELOCATABLE_DATA_KEYS]
        if changed:
            keys = ", ".join(f"{section}.{k}" for k in changed)
            raise UserError(
                f"{workdir} holds a model trained with other settings ({keys} differ from "
                f"{saved}); use a new --workdir"
            )


# Model settings a fine-tuned model may change: they have no weights and change no shape.
FINE_TUNABLE_MODEL_KEYS = ("dropout",)
# The sections a fine-tuning run takes from the trained work directory, key by key, where its
# own configuration is silent: the model, and how it translates (an imported checkpoint's
# search is its library's).
INHERITED_SECTIONS = ("model", "decode")


def inherited_overrides(config_path, overrides, init_from):
    """`--set` assignments giving a fine-tuning run the trained work directory's model and
    decode settings, and its vocabularies, wherever the configuration file and `overrides`
    give none: a config that names only data and a schedule fine-tunes any trained or
    imported model."""
    import yaml

    from pipeline.config import find_config, parse_overrides
    from pipeline.data.tokenizer import SIDES, vocabulary_paths

    saved = init_from / CONFIG_FILE
    if not saved.is_file():
        raise UserError(f"--init-from {init_from}: no trained model there ({CONFIG_FILE} and "
                        f"{MODEL_FILE} expected)")  # fmt: skip
    trained = load_config(saved, saved=True)
    try:
        raw = yaml.safe_load(find_config(config_path).read_text(encoding="utf-8")) or {}
    except (OSError, UnicodeDecodeError, yaml.YAMLError):
        raw = {}  # load_config reports what is wrong with the file
    raw = raw if isinstance(raw, dict) else {}
    given = parse_overrides(overrides)
    inherited = []
    for section in INHERITED_SECTIONS:
        named = {**(raw.get(section) or {}), **given.get(section, {})}
        if (
            section == "model"
            and named.get("type", trained["model"]["type"]) != (trained["model"]["type"])
        ):
            continue  # another architecture: fine_tuning_config refuses it by name
        inherited += [f"{section}.{key}={yaml.safe_dump(value, default_flow_style=True).strip()}"
                      for key, value in trained[section].items()
                      if key not in named]  # fmt: skip
    data_named = {**(raw.get("data") or {}), **given.get("data", {})}
    if trained["data"]["target_language_tokens"] and data_named.get("multiway_train"):
        raise UserError(f"--init-from {init_from}: a many-to-many import is fine-tuned on one "
                        "direction a run (data.train_* with data.source_language and "
                        "data.target_language), not on data.multiway_train")  # fmt: skip
    paths = vocabulary_paths(init_from)
    for side, path in zip(SIDES, paths, strict=True):
        if not data_named.get(f"{side}_vocabulary"):
            inherited.append(f"data.{side}_vocabulary={path.resolve()}")
    for key in LANGUAGE_TOKEN_KEYS:  # the language tokens its vocabulary holds
        tokens = trained["data"][key]
        if tokens and key not in data_named:
            inherited.append(
                f"data.{key}={yaml.safe_dump(tokens, default_flow_style=True).strip()}"
            )
    if "shared_vocabulary" not in data_named:
        inherited.append(f"data.shared_vocabulary={str(paths[0] == paths[1]).lower()}")
    return inherited


def fine_tuning_config(config, init_from):
    """`config` set to take its vocabularies from the trained work directory `init_from`,
    refusing a model whose settings differ from that directory's, or other vocabularies."""
    from pipeline.data.tokenizer import SIDES, vocabulary_paths

    saved = init_from / CONFIG_FILE
    if not saved.is_file() or not (init_from / MODEL_FILE).is_file():
        raise UserError(f"--init-from {init_from}: no trained model there ({CONFIG_FILE} and "
                        f"{MODEL_FILE} expected)")  # fmt: skip
    trained = load_config(saved, saved=True)["model"]
    differing = sorted(
        key
        for key in config["model"]
        if key not in FINE_TUNABLE_MODEL_KEYS and config["model"][key] != trained.get(key)
    )
    if differing:
        key = differing[0]
        raise UserError(
            f"--init-from {init_from}: model.{key} is {config['model'][key]!r} here but "
            f"{trained[key]!r} in {saved}"
            + (f" (and {len(differing) - 1} more model settings differ)" if differing[1:] else "")
            + "; a fine-tuned model keeps the trained model's settings (dropout aside)"
        )
    config = {**config, "data": dict(config["data"])}
    paths = vocabulary_paths(init_from)
    config["data"]["shared_vocabulary"] = paths[0] == paths[1]
    for side, path in zip(SIDES, paths, strict=True):
        given = config["data"][f"{side}_vocabulary"]
        if given and Path(given).read_bytes() != path.read_bytes():
            raise UserError(
                f"--init-from {init_from}: data.{side}_vocabulary ({given}) is not the "
                f"vocabulary the model was trained with ({path})"
            )
        config["data"][f"{side}_vocabulary"] = str(path)
    return config


# Entry-point group of the callables `(workdir, config, log)` run after training (on the chief):
# the export package registers its exporter there (pyproject.toml), so that training runs the
# export without depending on it.
AFTER_TRAINING_HOOKS = "seq2seq_tf.after_training"


def after_training_hooks(config):
    """The registered after-training callables, loaded; refused before any training when the
    configuration asks for an export that no hook would run."""
    from importlib.metadata import entry_points

    hooks = entry_points(group=AFTER_TRAINING_HOOKS)
    if config["export"]["after_training"] and not hooks:
        raise UserError(
            "export.after_training is set, but no exporter is registered: install the project "
            "(pip install -e .) or export with python -m export"
        )
    return [hook.load() for hook in hooks]


@report_user_errors
def main(argv=None):
    args = parse_args(sys.argv[1:] if argv is None else argv)
    overrides = args.set + ([f"distribute.strategy={args.strategy}"] if args.strategy else [])
    if args.init_from:
        overrides = inherited_overrides(args.config, overrides, args.init_from) + overrides
    config = load_config(args.config, overrides)
    if args.init_from:
        config = fine_tuning_config(config, args.init_from)
    workdir = args.workdir or Path("runs") / args.config.stem
    if args.init_from and workdir.resolve() == args.init_from.resolve():
        raise UserError(
            f"--init-from {args.init_from} is the work directory; fine-tune into a new one"
        )
    return train_in(config, workdir, args.wait, args.init_from)


def train_in(config, workdir, wait=False, init_from=None):
    """Trains (or resumes) `config`'s model in `workdir`, as the command does: the work
    directory's writer lock held (waiting for another holder with `wait`), then the
    after-training hooks. Returns the Keras history."""
    hooks = after_training_hooks(config)
    # Only the chief writes the work directory; the other workers share it unlocked.
    chief = current_task(config["distribute"]).is_chief
    with exclusive_writer(workdir, wait, log) if chief else contextlib.nullcontext():
        return _train(config, workdir, hooks, init_from, chief)


def _train(config, workdir, hooks, init_from, chief):
    workdir.mkdir(parents=True, exist_ok=True)
    _check_workdir(workdir, config)
    log(f"Work directory: {workdir}")
    # TensorFlow loads only once the configuration is valid.
    from pipeline.training.callbacks import TrainingInterrupted
    from pipeline.training.trainer import run

    try:
        history = run(config, workdir, log, init_from=init_from)
    except WorkerLost as lost:
        log(f"\n{lost}")
        sys.exit(EXIT_RESTART)
    except TrainingInterrupted as stop:
        log(f"\nStopped ({stop}); saved {stop.checkpoint}. Run the same command to resume from it.")
        sys.exit(128 + stop.signum)
    if chief:
        for hook in hooks:
            hook(workdir, config, log)
    settings = config["export"]
    data = config["data"]
    languages = multilingual.languages(data)  # the example sentence is German
    target = [f" --target-language {code}" for code in languages if code != "de"][:1]
    told = multilingual.told_languages(data)  # an imported model's, fine-tuned
    if told:
        pair = multilingual.pair_languages(data)
        target = ["".join(f" --{name.replace('_', '-')} {pair[name.split('_')[0]]}"
                          for name in reversed(told))]  # fmt: skip
    log(
        "\nDone. Everything is in " + str(workdir) + ":\n"
        f"  {CONFIG_FILE}, {MODEL_FILE}, vocab/, checkpoints/, logs/ "
        f"(tensorboard --logdir {workdir / 'logs'})\n"
        f"  test_report.json, test_translations.txt"
        + (f", export/ ({settings['formats']})" if settings["after_training"] else "")
        + "\n"
        "Next:\n"
        f"  echo 'Ein Hund läuft im Park.' | python -m pipeline.translate --workdir {workdir}"
        f"{''.join(target)}\n"
        f"  python -m pipeline.evaluate --workdir {workdir} --split test"
    )
    return history


if __name__ == "__main__":
    main()
