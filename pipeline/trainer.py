"""One training run in a work directory: data, model, fit with checkpoints, test evaluation."""

import json
import time

import keras
import tensorflow as tf

from pipeline import callbacks as training_callbacks
from pipeline.config import save_config
from pipeline.corpus import read_split
from pipeline.dataset import encode_corpus, make_dataset, with_known_length
from pipeline.errors import UserError, first_line
from pipeline.evaluation import score_translations
from pipeline.model_builder import build_model
from pipeline.schedules import LearningRateSchedule
from pipeline.tokenizer import prepare_tokenizers
from pipeline.translation import SearchOptions, Translator
from pipeline.workdir import (
    CHECKPOINT_DIR,
    CONFIG_FILE,
    LOG_DIR,
    MODEL_FILE,
    TEST_REPORT,
    TEST_TRANSLATIONS,
    save_model_atomically,
    write_text_atomically,
)


def _datasets(config, corpora, source_tokenizer, target_tokenizer, log):
    data, train = config["data"], config["train"]

    def encoded(split):
        return encode_corpus(corpora[split], source_tokenizer, target_tokenizer, data, split, log)

    batching = dict(
        batch_size=train["batch_size"],
        batch_tokens=train["batch_tokens"],
        bucket_width=train["bucket_width"],
        max_length=max(data["max_source_length"], data["max_target_length"]),
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
    return train_data, valid_data


def _optimizer(train):
    schedule = LearningRateSchedule(
        train["lr_schedule"],
        train["learning_rate"],
        train["warmup_steps"],
        train["decay_steps"],
        train["decay_rate"],
    )
    return keras.optimizers.Adam(schedule, global_clipnorm=train["clip_norm"] or None)


def _restore(checkpoint, manager, model):
    """Restores the latest checkpoint, if any; a damaged or foreign one is a `UserError`."""
    path = manager.latest_checkpoint
    if not path:
        return False
    model.optimizer.build(model.trainable_variables)
    try:
        checkpoint.restore(path).assert_existing_objects_matched()
    except Exception as error:  # the checkpoint reader raises many types for a damaged file
        raise UserError(
            f"{path}: cannot restore this checkpoint: it is damaged or belongs to another model "
            f"or vocabulary ({first_line(error)}); nothing was changed"
        ) from None
    return True


def _remaining_work(train_data, train, completed_epochs, step, log):
    """(data, first epoch, steps or None for whole epochs) for each `fit` still to run.

    A run stopped mid-epoch resumes with the rest of that epoch only (skipping the batches
    it had done), so that a kill loses at most the steps since the last checkpoint.
    """
    if completed_epochs >= train["epochs"]:
        return []
    steps_per_epoch = train["steps_per_epoch"] or int(train_data.cardinality())
    done = step - completed_epochs * steps_per_epoch
    if not 0 < done < steps_per_epoch:
        return [(train_data, completed_epochs, None)]
    log(f"Finishing epoch {completed_epochs + 1}: {steps_per_epoch - done} steps left")
    work = [(train_data.skip(done), completed_epochs, steps_per_epoch - done)]
    if completed_epochs + 1 < train["epochs"]:
        work.append((train_data, completed_epochs + 1, None))
    return work


def _callbacks(config, workdir, manager, completed_epochs, translator, corpora, has_valid, log):
    train = config["train"]
    checkpointer = training_callbacks.CheckpointEveryNSteps(
        manager, completed_epochs, train["checkpoint_every_steps"]
    )
    callbacks = [
        training_callbacks.StopOnNonFiniteLoss(manager),  # before any checkpoint of the step
        training_callbacks.TargetTokensPerSecond(),
        checkpointer,
    ]
    if train["bleu_every_epochs"]:
        sources = corpora["valid"].sources[: train["bleu_subset"]]
        references = corpora["valid"].targets[: len(sources)]
        callbacks.append(
            training_callbacks.ValidationBleu(
                translator, sources, references, train["bleu_every_epochs"], log
            )
        )
    if train["early_stopping_patience"] and has_valid:
        callbacks.append(
            keras.callbacks.EarlyStopping(
                patience=train["early_stopping_patience"], restore_best_weights=True, verbose=1
            )
        )
    callbacks.append(keras.callbacks.TensorBoard(str(workdir / LOG_DIR)))
    # Last: on a signal, the other callbacks' train-end work (best weights) happens first.
    callbacks.append(training_callbacks.StopOnSignal(checkpointer, log))
    return callbacks


def _evaluate_test(translator, corpus, workdir, training_seconds, log):
    log(f"Translating the test split ({len(corpus)} sentences)...")
    hypotheses = translator.translate_best(corpus.sources)
    report = score_translations(hypotheses, corpus.targets)
    report["training_seconds"] = round(training_seconds, 1)
    write_text_atomically(workdir / TEST_TRANSLATIONS, "".join(h + "\n" for h in hypotheses))
    write_text_atomically(workdir / TEST_REPORT, json.dumps(report, indent=2) + "\n")
    log(
        f"Test: BLEU {report['bleu']} (lowercased {report['bleu_lowercase']}), "
        f"chrF {report['chrf']}  [{report['bleu_signature']}]"
    )


def run(config, workdir, log=print):
    """Trains (or resumes) the model of `config` in `workdir`; returns the Keras history."""
    train = config["train"]
    keras.utils.set_random_seed(train["seed"])
    corpora = {split: read_split(config["data"], split) for split in ("train", "valid", "test")}
    source_tokenizer, target_tokenizer = prepare_tokenizers(
        workdir, config["data"], corpora["train"], log
    )
    log(f"Vocabularies: {source_tokenizer.vocab_size} source, {target_tokenizer.vocab_size} target")
    train_data, valid_data = _datasets(config, corpora, source_tokenizer, target_tokenizer, log)

    model = build_model(config, source_tokenizer.vocab_size, target_tokenizer.vocab_size)
    optimizer = _optimizer(train)
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
    # Only now, when nothing has failed, does the work directory's configuration change.
    save_config(config, workdir / CONFIG_FILE)
    log(f"Configuration written to {workdir / CONFIG_FILE}")
    translator = Translator(
        model,
        source_tokenizer,
        target_tokenizer,
        SearchOptions.from_config(config["decode"]),
        config["decode"]["batch_size"],
    )
    callbacks = _callbacks(
        config, workdir, manager, completed_epochs, translator, corpora, valid_data is not None, log
    )

    start = time.perf_counter()
    history = {}
    try:
        for data, first_epoch, steps in _remaining_work(
            train_data, train, int(completed_epochs.numpy()), int(optimizer.iterations.numpy()), log
        ):
            fitted = model.fit(
                data,
                epochs=train["epochs"] if steps is None else first_epoch + 1,
                initial_epoch=first_epoch,
                steps_per_epoch=steps or train["steps_per_epoch"],
                validation_data=valid_data,
                callbacks=callbacks,
                shuffle=False,  # the dataset shuffles itself, seeded
                verbose=1,
            ).history
            for key, values in fitted.items():
                history.setdefault(key, []).extend(values)
    finally:
        callbacks[-1].restore_handlers()
    training_seconds = time.perf_counter() - start
    # With nothing left to train, keep the saved model: it may hold early stopping's best weights.
    if history or not (workdir / MODEL_FILE).exists():
        save_model_atomically(model, workdir / MODEL_FILE)
        log(f"Trained for {training_seconds:.0f} s; model saved to {workdir / MODEL_FILE}")
    if corpora["test"]:
        _evaluate_test(translator, corpora["test"], workdir, training_seconds, log)
    return history
