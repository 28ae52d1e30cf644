"""Train a model: `python -m pipeline.train [--config FILE] [--workdir DIR] [--set key=value ...]`.

Builds the vocabularies on first use, trains with checkpoints (a re-run with the same work
directory resumes from the last one), then evaluates on the test split.
"""

import argparse
import json
import sys
import time
from pathlib import Path

from pipeline.config import DEFAULT_CONFIG, load_config, save_config
from pipeline.errors import UserError, report_user_errors


def parse_args(argv):
    parser = argparse.ArgumentParser(prog="python -m pipeline.train", description=__doc__)
    parser.add_argument("--config", type=Path, default=DEFAULT_CONFIG, help="experiment YAML")
    parser.add_argument(
        "--workdir",
        type=Path,
        help="where vocabularies, checkpoints and reports go (default: runs/<config name>)",
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
    saved = workdir / "config.yaml"
    if not saved.is_file():
        return
    previous = load_config(saved)
    for section in ("data", "model"):
        changed = sorted(k for k in config[section] if config[section][k] != previous[section][k])
        if section == "data":  # paths may move; vocabulary and length settings may not
            changed = [k for k in changed if not k.endswith(("_source", "_target", "_tsv"))]
        if changed:
            keys = ", ".join(f"{section}.{k}" for k in changed)
            raise UserError(
                f"{workdir} holds a model trained with other settings ({keys} differ from "
                f"{saved}); use a new --workdir"
            )


def _restore(checkpoint, manager, model):
    import tensorflow as tf

    path = manager.latest_checkpoint
    if not path:
        return False
    model.optimizer.build(model.trainable_variables)
    try:
        checkpoint.restore(path).assert_existing_objects_matched()
    except (tf.errors.OpError, AssertionError, ValueError) as error:
        raise UserError(f"{path}: cannot restore this checkpoint ({error})") from None
    return True


def run(config, workdir):
    import keras
    import tensorflow as tf

    from pipeline import callbacks as training_callbacks
    from pipeline.corpus import read_split
    from pipeline.dataset import encode_corpus, make_dataset, with_known_length
    from pipeline.evaluation import score_translations
    from pipeline.model_builder import build_model
    from pipeline.schedules import LearningRateSchedule
    from pipeline.tokenizer import prepare_tokenizers
    from pipeline.translation import SearchOptions, Translator
    from pipeline.workdir import (
        CHECKPOINT_DIR,
        LOG_DIR,
        MODEL_FILE,
        TEST_REPORT,
        TEST_TRANSLATIONS,
        save_model_atomically,
        write_text_atomically,
    )

    data, train = config["data"], config["train"]
    keras.utils.set_random_seed(train["seed"])
    corpora = {split: read_split(data, split) for split in ("train", "valid", "test")}
    source_tokenizer, target_tokenizer = prepare_tokenizers(workdir, data, corpora["train"], log)
    sizes = source_tokenizer.vocab_size, target_tokenizer.vocab_size
    log(f"Vocabularies: {sizes[0]} source, {sizes[1]} target pieces")

    def encoded(split):
        return encode_corpus(corpora[split], source_tokenizer, target_tokenizer, data, split, log)

    max_length = max(data["max_source_length"], data["max_target_length"])
    batching = dict(
        batch_size=train["batch_size"],
        batch_tokens=train["batch_tokens"],
        bucket_width=train["bucket_width"],
        max_length=max_length,
    )
    train_set = encoded("train")
    if not len(train_set):
        raise UserError(f"{corpora['train'].origin}: no usable training pairs")
    train_data = with_known_length(
        make_dataset(
            train_set, shuffle_buffer=train["shuffle_buffer"], seed=train["seed"], **batching
        )
    )
    if train["steps_per_epoch"]:  # epochs of a fixed number of steps run across data epochs
        train_data = train_data.repeat()
    valid_data = None
    if corpora["valid"]:
        valid_data = with_known_length(make_dataset(encoded("valid"), **batching))

    model = build_model(config, source_tokenizer.vocab_size, target_tokenizer.vocab_size)
    optimizer = keras.optimizers.Adam(
        LearningRateSchedule(
            train["lr_schedule"],
            train["learning_rate"],
            train["warmup_steps"],
            train["decay_steps"],
            train["decay_rate"],
        ),
        global_clipnorm=train["clip_norm"] or None,
    )
    model.compile(optimizer=optimizer, jit_compile=train["jit_compile"])
    log(f"Model: {model.count_params():,} parameters")

    completed_epochs = tf.Variable(0, dtype=tf.int64, trainable=False)
    checkpoint = tf.train.Checkpoint(model=model, optimizer=optimizer, epochs=completed_epochs)
    manager = tf.train.CheckpointManager(
        checkpoint, str(workdir / CHECKPOINT_DIR), max_to_keep=train["keep_checkpoints"]
    )
    if _restore(checkpoint, manager, model):
        log(
            f"Resuming from {manager.latest_checkpoint} (step {int(optimizer.iterations.numpy())}, "
            f"{int(completed_epochs.numpy())} epochs done)"
        )

    translator = Translator(
        model, source_tokenizer, target_tokenizer,
        SearchOptions.from_config(config["decode"]), config["decode"]["batch_size"],
    )  # fmt: skip
    callbacks = [
        training_callbacks.TargetTokensPerSecond(),
        training_callbacks.CheckpointEveryNSteps(
            manager, completed_epochs, train["checkpoint_every_steps"]
        ),
    ]
    if train["bleu_every_epochs"]:
        subset = corpora["valid"].sources[: train["bleu_subset"]]
        callbacks.append(
            training_callbacks.ValidationBleu(
                translator,
                subset,
                corpora["valid"].targets[: len(subset)],
                train["bleu_every_epochs"],
                log,
            )
        )
    if train["early_stopping_patience"] and valid_data is not None:
        callbacks.append(
            keras.callbacks.EarlyStopping(
                patience=train["early_stopping_patience"], restore_best_weights=True, verbose=1
            )
        )
    callbacks.append(keras.callbacks.TensorBoard(str(workdir / LOG_DIR)))

    start = time.perf_counter()
    history = {}
    if int(completed_epochs.numpy()) < train["epochs"]:
        history = model.fit(
            train_data,
            epochs=train["epochs"],
            initial_epoch=int(completed_epochs.numpy()),
            steps_per_epoch=train["steps_per_epoch"],
            validation_data=valid_data,
            callbacks=callbacks,
            shuffle=False,  # the dataset shuffles itself, seeded
            verbose=1,
        ).history
    training_seconds = time.perf_counter() - start
    # With nothing left to train, keep the saved model: it may hold early stopping's best weights.
    if history or not (workdir / MODEL_FILE).exists():
        save_model_atomically(model, workdir / MODEL_FILE)
        log(f"Trained for {training_seconds:.0f} s; model saved to {workdir / MODEL_FILE}")

    if corpora["test"]:
        log(f"Translating the test split ({len(corpora['test'])} sentences)...")
        hypotheses = translator.translate_best(corpora["test"].sources)
        report = score_translations(hypotheses, corpora["test"].targets)
        report["training_seconds"] = round(training_seconds, 1)
        write_text_atomically(workdir / TEST_TRANSLATIONS, "".join(h + "\n" for h in hypotheses))
        write_text_atomically(workdir / TEST_REPORT, json.dumps(report, indent=2) + "\n")
        log(
            f"Test: BLEU {report['bleu']} (lowercased {report['bleu_lowercase']}), "
            f"chrF {report['chrf']}  [{report['bleu_signature']}]"
        )
    return history


@report_user_errors
def main(argv=None):
    args = parse_args(sys.argv[1:] if argv is None else argv)
    config = load_config(args.config, args.set)
    workdir = args.workdir or Path("runs") / args.config.stem
    workdir.mkdir(parents=True, exist_ok=True)
    _check_workdir(workdir, config)
    save_config(config, workdir / "config.yaml")
    log(f"Work directory: {workdir} (configuration written to {workdir / 'config.yaml'})")
    history = run(config, workdir)
    log(
        "\nDone. Everything is in " + str(workdir) + ":\n"
        f"  model.keras, vocab/, checkpoints/, logs/ (tensorboard --logdir {workdir / 'logs'})\n"
        f"  test_report.json, test_translations.txt\n"
        "Next:\n"
        f"  echo 'Ein Hund läuft im Park.' | python -m pipeline.translate --workdir {workdir}\n"
        f"  python -m pipeline.evaluate --workdir {workdir} --split test"
    )
    return history


if __name__ == "__main__":
    main()
