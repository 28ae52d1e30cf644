"""One training run in a work directory: data, model, fit with checkpoints, test evaluation."""

import contextlib
import dataclasses
import hashlib
import json
import os
import shutil
import time
from collections.abc import Callable

import keras
import numpy as np
import tensorflow as tf

from pipeline import callbacks as training_callbacks
from pipeline.checkpoints import average_checkpoints, make_optimizer, training_checkpoint
from pipeline.config import save_config
from pipeline.corpus import read_split
from pipeline.dataset import count_batches, encode_corpus, make_dataset, with_known_length
from pipeline.distribution import WorkerLost, current_task, make_strategy, take_chiefs_state
from pipeline.errors import UserError, first_line
from pipeline.evaluation import score_translations
from pipeline.model_builder import build_model
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


@dataclasses.dataclass
class TrainingData:
    """`make(skip)`: the dataset for `fit`, `skip` steps into an epoch; `steps_per_epoch`;
    `repeats`: whether the data repeats (so `fit` must be told the steps of each epoch)."""

    make: Callable
    steps_per_epoch: int
    repeats: bool


def _datasets(config, corpora, source_tokenizer, target_tokenizer, strategy, log):
    data, train = config["data"], config["train"]

    def encoded(split):
        return encode_corpus(corpora[split], source_tokenizer, target_tokenizer, data, split, log)

    batching = dict(
        batch_size=train["batch_size"],  # per replica
        batch_tokens=train["batch_tokens"],
        bucket_width=train["bucket_width"],
        max_length=max(data["max_source_length"], data["max_target_length"]),
    )
    train_set = encoded("train")
    if not len(train_set):
        raise UserError(f"{corpora['train'].origin}: no usable training pairs")
    shuffling = dict(shuffle_buffer=train["shuffle_buffer"], seed=train["seed"])
    valid_data = None
    if corpora["valid"]:
        valid_data = with_known_length(make_dataset(encoded("valid"), **batching))
    if config["distribute"]["strategy"] == "default":
        whole = with_known_length(make_dataset(train_set, **shuffling, **batching))
        steps = train["steps_per_epoch"] or int(whole.cardinality())
        repeats = bool(train["steps_per_epoch"])  # fixed-step epochs run across data epochs
        if repeats:
            whole = whole.repeat()
        return TrainingData(lambda skip: whole.skip(skip), steps, repeats), valid_data

    # Each input pipeline (one a worker) reads its shard and feeds its replicas in turn.
    batches = count_batches(make_dataset(train_set, **batching))
    steps = train["steps_per_epoch"] or max(1, batches // strategy.num_replicas_in_sync)

    def make(skip):
        def per_pipeline(context):
            replicas_here = context.num_replicas_in_sync // context.num_input_pipelines
            dataset = make_dataset(train_set, **shuffling, **batching, input_context=context)
            return dataset.repeat().skip(skip * replicas_here)

        return strategy.distribute_datasets_from_function(per_pipeline)

    return TrainingData(make, steps, repeats=True), valid_data


def _restore(checkpoint, manager):
    """Restores the latest checkpoint, if any; a damaged or foreign one is a `UserError`."""
    path = manager.latest_checkpoint
    if not path:
        return False
    try:
        checkpoint.restore(path).assert_existing_objects_matched()
    except Exception as error:  # the checkpoint reader raises many types for a damaged file
        raise UserError(
            f"{path}: cannot restore this checkpoint: it is damaged or belongs to another model "
            f"or vocabulary ({first_line(error)}); nothing was changed"
        ) from None
    return True


def _remaining_work(training, epochs, completed_epochs, step, log):
    """(data, first epoch, end epoch, steps per epoch or None) for each `fit` still to run.

    A run stopped mid-epoch resumes with the rest of that epoch only (skipping the batches
    it had done), so that a kill loses at most the steps since the last checkpoint.
    """
    if completed_epochs >= epochs:
        return []
    per_epoch = training.steps_per_epoch
    whole_epochs = per_epoch if training.repeats else None
    done = step - completed_epochs * per_epoch
    if not 0 < done < per_epoch:
        return [(training.make(0), completed_epochs, epochs, whole_epochs)]
    log(f"Finishing epoch {completed_epochs + 1}: {per_epoch - done} steps left")
    work = [(training.make(done), completed_epochs, completed_epochs + 1, per_epoch - done)]
    if completed_epochs + 1 < epochs:
        work.append((training.make(0), completed_epochs + 1, epochs, whole_epochs))
    return work


def _callbacks(config, workdir, task, manager, completed_epochs, translator, corpora, has_valid,
               log):  # fmt: skip
    train = config["train"]
    checkpointer = training_callbacks.CheckpointEveryNSteps(
        manager, completed_epochs, train["checkpoint_every_steps"]
    )
    callbacks = [
        training_callbacks.StopOnNonFiniteLoss(manager),  # before any checkpoint of the step
        training_callbacks.TargetTokensPerSecond(),
        checkpointer,
    ]
    if train["bleu_every_epochs"] and task.is_chief:
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
    if task.is_chief:
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
    """Trains (or resumes) the model of `config` in `workdir`; returns the Keras history.

    Under a multi-worker strategy every worker calls this; only the chief writes to
    `workdir`, the others to their scratch folders (see `pipeline.distribution`).
    """
    train = config["train"]
    strategy = make_strategy(config["distribute"])  # before any TensorFlow op
    task = current_task(config["distribute"])
    output = task.output_dir(workdir)
    output.mkdir(parents=True, exist_ok=True)
    replicas = strategy.num_replicas_in_sync
    learning_rate = train["learning_rate"] * (
        replicas if config["distribute"]["scale_learning_rate"] else 1
    )
    log(
        f"Strategy: {config['distribute']['strategy']}, {replicas} replica(s), this process "
        f"{task}{' (chief)' if task.is_chief else ''}; batch {train['batch_size']} per replica, "
        f"{train['batch_size'] * replicas} global; learning rate {learning_rate:g}"
    )
    keras.utils.set_random_seed(train["seed"])
    corpora = {split: read_split(config["data"], split) for split in ("train", "valid", "test")}
    source_tokenizer, target_tokenizer = prepare_tokenizers(
        output, config["data"], corpora["train"], log
    )
    log(f"Vocabularies: {source_tokenizer.vocab_size} source, {target_tokenizer.vocab_size} target")
    training, valid_data = _datasets(
        config, corpora, source_tokenizer, target_tokenizer, strategy, log
    )

    with strategy.scope():
        model = build_model(config, source_tokenizer.vocab_size, target_tokenizer.vocab_size)
        optimizer = make_optimizer(train, learning_rate)
        model.compile(optimizer=optimizer, jit_compile=train["jit_compile"])
        optimizer.build(model.trainable_variables)  # now, so that replicas need no sample batch
        completed_epochs = tf.Variable(0, dtype=tf.int64, trainable=False)
        checkpoint = training_checkpoint(model, optimizer, completed_epochs)
        manager = tf.train.CheckpointManager(
            checkpoint, str(output / CHECKPOINT_DIR), max_to_keep=train["keep_checkpoints"]
        )
        # Workers other than the chief take the chief's state rather than read their own.
        restored = task.is_chief and _restore(checkpoint, manager)
        take_chiefs_state(
            strategy, [*model.weights, *optimizer.variables, completed_epochs], task.is_chief
        )
    log(f"Model: {model.count_params():,} parameters")
    step = int(optimizer.iterations.numpy())
    if step:
        source = manager.latest_checkpoint if restored else "the chief's checkpoint"
        log(f"Resuming from {source} (step {step}, {int(completed_epochs.numpy())} epochs done)")
    if task.is_chief:  # only now, when nothing has failed, does the configuration change
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
        config, workdir, task, manager, completed_epochs, translator, corpora,
        valid_data is not None, log,
    )  # fmt: skip

    start = time.perf_counter()
    history = {}
    try:
        for data, first_epoch, end_epoch, steps in _remaining_work(
            training, train["epochs"], int(completed_epochs.numpy()),
            int(optimizer.iterations.numpy()), log,
        ):  # fmt: skip
            fitted = model.fit(
                data,
                epochs=end_epoch,
                initial_epoch=first_epoch,
                steps_per_epoch=steps,
                validation_data=valid_data,
                callbacks=callbacks,
                shuffle=False,  # the dataset shuffles itself, seeded
                verbose=1 if task.is_chief else 2,
            ).history
            for key, values in fitted.items():
                history.setdefault(key, []).extend(values)
    except (tf.errors.UnavailableError, tf.errors.AbortedError) as error:
        if config["distribute"]["strategy"] != "multi_worker":
            raise
        raise WorkerLost(
            f"another worker stopped ({first_line(error)}); the last checkpoint here is "
            f"{manager.latest_checkpoint}. Restart every worker with the same command to resume"
        ) from None
    finally:
        callbacks[-1].restore_handlers()
    training_seconds = time.perf_counter() - start
    log(f"Weights fingerprint: {weights_fingerprint(model)}")
    if not task.is_chief:  # the chief holds the results
        shutil.rmtree(output, ignore_errors=True)
        with contextlib.suppress(OSError):
            output.parent.rmdir()  # the scratch root, once no worker uses it
        return history
    if history and train["average_checkpoints"] > 1:
        paths = manager.checkpoints[-train["average_checkpoints"] :]
        average_checkpoints(model, train, paths)
        names = ", ".join(os.path.basename(path) for path in paths)
        log(f"Weights: the mean of the last {len(paths)} checkpoints ({names})")
    # With nothing left to train, keep the saved model: it may hold early stopping's best weights.
    if history or not (workdir / MODEL_FILE).exists():
        save_model_atomically(model, workdir / MODEL_FILE)
        log(f"Trained for {training_seconds:.0f} s; model saved to {workdir / MODEL_FILE}")
    if corpora["test"]:
        _evaluate_test(translator, corpora["test"], workdir, training_seconds, log)
    return history


def weights_fingerprint(model):
    """A short hash of every weight: equal on workers that hold the same model."""
    digest = hashlib.sha256()
    for weight in model.weights:
        digest.update(np.ascontiguousarray(keras.ops.convert_to_numpy(weight)).tobytes())
    return digest.hexdigest()[:16]
