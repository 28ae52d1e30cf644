"""One training run in a work directory: data, model, fit with checkpoints, test evaluation."""

import contextlib
import hashlib
import json
import os
import shutil
import time

import keras
import numpy as np
import tensorflow as tf

from pipeline import callbacks as training_callbacks
from pipeline.atomic_files import write_text_atomically
from pipeline.checkpoints import (
    EARLY_STOPPING,
    EPOCH_STEPS,
    TIME_BUDGET,
    TRAINING_TIME,
    average_checkpoints,
    holds_entry,
    make_optimizer,
    training_checkpoint,
)
from pipeline.config import save_config
from pipeline.corpus import read_split, scan_training_corpora
from pipeline.dataset import (
    ESTIMATE_SAMPLE,
    StreamCounters,
    batching_options,
    encode_corpus,
    estimate_steps_per_pass,
    make_dataset,
    make_training_stream,
    with_known_length,
)
from pipeline.distribution import WorkerLost, current_task, make_strategy, take_chiefs_state
from pipeline.errors import UnusableFileError, UserError, first_line
from pipeline.evaluation import score_translations
from pipeline.model_builder import build_model
from pipeline.model_types import MODEL_TYPES
from pipeline.schedules import schedule_from_config
from pipeline.tokenizer import prepare_tokenizers, training_tokenizers, vocabularies_to_build
from pipeline.translation import SearchOptions, Translator
from pipeline.workdir import (
    CHECKPOINT_DIR,
    CONFIG_FILE,
    LOG_DIR,
    MODEL_FILE,
    TEST_REPORT,
    TEST_TRANSLATIONS,
    load_trained,
    save_model_atomically,
)

PROFILE_AFTER = 10  # train.profile_steps starts after these (graph tracing, warm-up)


class TrainingStream:
    """The training batches of this run: an endless stream per input pipeline, and where it
    stands in each corpus, so that checkpoints record it and a resumed run continues there.

    `positions` (variables in the checkpoint) count, per corpus, the lines read since the
    start of the first pass. A restarted stream continues from the last lines read; pairs that
    were still waiting in the shuffle buffer (at most `train.shuffle_buffer`) are not replayed.
    """

    def __init__(self, config, corpora, tokenizers, strategy, positions, log):
        self.config, self.corpora, self.tokenizers = config, corpora, tokenizers
        self.strategy, self.positions, self.log = strategy, positions, log
        self.counters = None

    def current_positions(self):
        if self.counters is None:
            return [int(position.numpy()) for position in self.positions]
        return self.counters.positions()

    def record(self):
        """Copies the stream's positions into the checkpointed variables."""
        for variable, position in zip(self.positions, self.current_positions(), strict=True):
            variable.assign(position)

    def start(self, step):
        """A new stream from the current positions; `step` varies the shuffling seed."""
        data, train = self.config["data"], self.config["train"]
        self.counters = StreamCounters(self.corpora, self.current_positions())
        for corpus, position in zip(self.corpora, self.counters.start):
            if position:
                data_pass, line = divmod(position, corpus.lines)
                self.log(f"Training stream: {corpus.name} continues at line {line + 1:,} of "
                         f"pass {data_pass + 1}")  # fmt: skip
        seed = (train["seed"] * 1_000_003 + step) % 2**31

        def per_pipeline(context=None):
            dataset, sharding = make_training_stream(
                self.corpora, *self.tokenizers, data, batching_options(self.config), self.counters,
                train["shuffle_buffer"], seed, context,
            )  # fmt: skip
            for corpus, how in zip(self.corpora, sharding):
                self.log(f"Input pipeline {context.input_pipeline_id}: {corpus.name}: {how}")
            return dataset

        if self.config["distribute"]["strategy"] == "default":
            return per_pipeline()
        return self.strategy.distribute_datasets_from_function(per_pipeline)


def _validation_data(config, corpus, tokenizers, log):
    if corpus is None:
        return None
    encoded = encode_corpus(corpus, *tokenizers, config["data"], "valid", log)
    if not len(encoded):
        return None
    return with_known_length(make_dataset(encoded, **batching_options(config)))


def _restore(checkpoint, manager):
    """Restores the latest checkpoint, if any; a damaged or foreign one is an
    `UnusableFileError`."""
    path = manager.latest_checkpoint
    if not path:
        return False
    try:
        checkpoint.restore(path).assert_existing_objects_matched()
    except Exception as error:  # the checkpoint reader raises many types for a damaged file
        raise UnusableFileError(
            path,
            "cannot restore this checkpoint: it is damaged or belongs to another model or "
            f"vocabulary ({first_line(error)}); nothing was changed",
        ) from None
    return True


def _remaining_work(steps_per_epoch, epochs, completed_epochs, step, log):
    """(first epoch, end epoch, steps per epoch) for each `fit` still to run.

    A run stopped mid-epoch resumes with the rest of that epoch only, so that a kill loses at
    most the steps since the last checkpoint and epochs keep their length.
    """
    if completed_epochs >= epochs:
        return []
    done = step - completed_epochs * steps_per_epoch
    if not 0 < done < steps_per_epoch:
        return [(completed_epochs, epochs, steps_per_epoch)]
    log(f"Finishing epoch {completed_epochs + 1}: {steps_per_epoch - done} steps left")
    work = [(completed_epochs, completed_epochs + 1, steps_per_epoch - done)]
    if completed_epochs + 1 < epochs:
        work.append((completed_epochs + 1, epochs, steps_per_epoch))
    return work


def _callbacks(config, workdir, task, manager, completed_epochs, translator, float32_model,
               corpora, has_valid, stream, clock, budget, early_stopping, started,
               log):  # fmt: skip
    train = config["train"]

    def before_save():
        stream.record()
        clock.record()

    checkpointer = training_callbacks.CheckpointEveryNSteps(
        manager, completed_epochs, train["checkpoint_every_steps"], before_save=before_save
    )
    callbacks = [
        training_callbacks.FirstStepTime(started, log),
        training_callbacks.StopOnNonFiniteLoss(manager),  # before any checkpoint of the step
        training_callbacks.TargetTokensPerSecond(),
        # Before the checkpoint that keeps their decisions, the clock before the budget:
        clock,
        *[callback for callback in (budget, early_stopping) if callback],
        checkpointer,
        training_callbacks.ReportAtTrainingEnd(lambda: stream.counters.summary(), log),
    ]
    if train["bleu_every_epochs"] and task.is_chief:
        sources = corpora["valid"].sources[: train["bleu_subset"]]
        references = corpora["valid"].targets[: len(sources)]
        callbacks.append(
            training_callbacks.ValidationBleu(
                translator, float32_model, sources, references, train["bleu_every_epochs"]
            )
        )
    has_attention = MODEL_TYPES[config["model"]["type"]].attends(config["model"])
    if train["attention_images"] and has_valid and has_attention and task.is_chief:
        callbacks.append(
            training_callbacks.AttentionImages(
                translator, float32_model, corpora["valid"].sources[: train["attention_images"]],
                workdir / LOG_DIR / "validation",
            )
        )  # fmt: skip
    callbacks.append(training_callbacks.EpochProgress(train["epochs"], log))  # after BLEU
    if task.is_chief:
        profiled = train["profile_steps"]
        steps = (PROFILE_AFTER + 1, PROFILE_AFTER + profiled) if profiled else 0
        callbacks.append(keras.callbacks.TensorBoard(str(workdir / LOG_DIR), profile_batch=steps))
    # Last: on a signal, the other callbacks' train-end work (the stream's report) happens first.
    callbacks.append(training_callbacks.StopOnSignal(checkpointer, log))
    return callbacks


def _evaluate_test(translator, corpus, workdir, training_seconds, log):
    log(f"Translating the test split ({len(corpus)} sentences)...")
    hypotheses = translator.translate(corpus.sources)
    report = score_translations(hypotheses, corpus.targets)
    report["training_seconds"] = round(training_seconds, 1)
    write_text_atomically(workdir / TEST_TRANSLATIONS, "".join(h + "\n" for h in hypotheses))
    write_text_atomically(workdir / TEST_REPORT, json.dumps(report, indent=2) + "\n")
    log(
        f"Test: BLEU {report['bleu']} (lowercased {report['bleu_lowercase']}), "
        f"chrF {report['chrf']}  [{report['bleu_signature']}]"
    )


def _initialise_from(model, init_from, log):
    """Sets `model`'s weights to those of the model trained in `init_from`."""
    trained = load_trained(init_from)[1]
    try:
        model.set_weights(trained.get_weights())
    except ValueError as error:
        raise UserError(
            f"--init-from {init_from}: its weights do not fit this model ({first_line(error)})"
        ) from None
    log(f"Initialised from {init_from / MODEL_FILE} (fine-tuning: fresh optimizer and schedule)")


def run(config, workdir, log=print, init_from=None):
    """Trains (or resumes) the model of `config` in `workdir`; returns the Keras history.
    With `init_from` (a trained work directory), a run that has no checkpoint yet starts
    from that directory's weights.

    Under a multi-worker strategy every worker calls this; only the chief writes to
    `workdir`, the others to their scratch folders (see `pipeline.distribution`).
    """
    started = time.perf_counter()
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
    data = config["data"]
    building = vocabularies_to_build(output, data)
    training_corpora, source_sample, target_sample = scan_training_corpora(
        data, data["vocab_sample_size"] if building else ESTIMATE_SAMPLE, train["seed"], log
    )
    corpora = {split: read_split(data, split) for split in ("valid", "test")}
    tokenizers = prepare_tokenizers(
        output, data, {"source": source_sample, "target": target_sample}, log
    )
    source_tokenizer, target_tokenizer = tokenizers
    log(f"Vocabularies: {source_tokenizer.vocab_size} source, {target_tokenizer.vocab_size} target")
    valid_data = _validation_data(config, corpora["valid"], tokenizers, log)
    segmenters = training_tokenizers(tokenizers, data)
    if segmenters is not tokenizers:
        alpha = data["subword_sampling_alpha"]
        how = (
            f"BPE-dropout, merges dropped at rate {alpha:g}"
            if data["subword_model"] == "bpe"
            else f"alpha {alpha:g}, n-best {data['subword_sampling_nbest']}"
        )
        log(f"Subword regularisation: training pairs segmented at random ({how})")
    steps_per_pass = estimate_steps_per_pass(  # also refuses data with nothing to train on
        training_corpora, source_sample, target_sample, segmenters, data,
        batching_options(config), replicas,
    )  # fmt: skip
    del source_sample, target_sample

    with strategy.scope():
        vocab_sizes = source_tokenizer.vocab_size, target_tokenizer.vocab_size
        model = build_model(config, *vocab_sizes, precision=train["precision"], for_training=True)
        # What is translated, scored and saved: the plain float32 model that exports will hold.
        float32_model = build_model(config, *vocab_sizes)
        schedule = schedule_from_config(train, learning_rate)
        optimizer = make_optimizer(train, schedule)
        model.compile(optimizer=optimizer, jit_compile=train["jit_compile"])
        optimizer.build(model.trainable_variables)  # now, so that replicas need no sample batch
        completed_epochs = tf.Variable(0, dtype=tf.int64, trainable=False)
        epoch_steps = tf.Variable(0, dtype=tf.int64, trainable=False)  # 0: not begun
        positions = [tf.Variable(0, dtype=tf.int64, trainable=False) for _ in training_corpora]
        latest = tf.train.latest_checkpoint(str(output / CHECKPOINT_DIR))
        kept_length = epoch_steps if latest is None or holds_entry(latest, EPOCH_STEPS) else None
        training_seconds = tf.Variable(0.0, dtype=tf.float64, trainable=False)
        kept_time = None  # a run begun without it counts this command's time only
        if latest is None or holds_entry(latest, TRAINING_TIME):
            kept_time = training_seconds
        budget_state = None
        if train["time_budget_hours"] is not None:
            if latest is not None and not holds_entry(latest, TIME_BUDGET):
                raise UserError(
                    f"{latest}: this run began without train.time_budget_hours, so its "
                    "checkpoints hold no decision on its end; resume it without one, or start "
                    "a new work directory"
                )
            budget_state = {
                "last_epoch": tf.Variable(0, dtype=tf.int64, trainable=False)  # 0: undecided
            }
            if kept_time is None:  # a budgeted run begun before TRAINING_TIME kept it here
                budget_state["seconds"] = training_seconds
        stopping_state = None
        if train["early_stopping_patience"] and valid_data is not None:
            stopping_state = training_callbacks.EarlyStoppingState(model)
        kept_stopping = None
        if latest is None or holds_entry(latest, EARLY_STOPPING):
            kept_stopping = stopping_state  # a run begun without it counts from here
        checkpoint = training_checkpoint(
            model, optimizer, completed_epochs, positions, kept_length, kept_time, budget_state,
            kept_stopping,
        )  # fmt: skip
        manager = tf.train.CheckpointManager(
            checkpoint, str(output / CHECKPOINT_DIR), max_to_keep=train["keep_checkpoints"]
        )
        # Workers other than the chief take the chief's state rather than read their own.
        restored = task.is_chief and _restore(checkpoint, manager)
        if init_from and task.is_chief and not restored:
            _initialise_from(model, init_from, log)
        take_chiefs_state(
            strategy,
            [*model.weights, *optimizer.variables, completed_epochs, epoch_steps,
             training_seconds, *positions,
             *(stopping_state.variables if stopping_state is not None else ())],
            task.is_chief,
        )  # fmt: skip
    # A resumed run keeps the epoch length it began with: the estimate's sample differs when
    # the vocabularies are reused rather than built (131 against 130 steps on Multi30k). Runs
    # whose checkpoints predate it estimate again.
    resumed_epoch_steps = int(epoch_steps.numpy())
    steps_per_epoch = train["steps_per_epoch"] or resumed_epoch_steps or steps_per_pass
    epoch_steps.assign(steps_per_epoch)
    if train["steps_per_epoch"]:
        origin = ""
    elif resumed_epoch_steps:
        origin = " (as the run began)"
    else:
        origin = " (about one pass over the training data)"
    log(f"Epochs of {steps_per_epoch:,} steps{origin}")
    # A time budget may have ended the run sooner than train.epochs, its cool-down with it.
    epochs = int(budget_state["last_epoch"].numpy()) if budget_state else 0
    epochs = epochs or train["epochs"]
    cooldown_epochs = min(train["cooldown_epochs"], train["epochs"])
    if cooldown_epochs:
        steps = schedule.cool_down_epochs(cooldown_epochs, epochs, steps_per_epoch)
        log(
            f"Learning rate cools down linearly to 0 over {steps} (train.cooldown_epochs: "
            f"{cooldown_epochs})"
        )
    clock = training_callbacks.TrainingClock(training_seconds)
    budget = None
    if budget_state:
        budget = training_callbacks.TimeBudget(
            train["time_budget_hours"], clock, budget_state["last_epoch"], train["epochs"],
            cooldown_epochs, steps_per_epoch, schedule, log,
        )  # fmt: skip
        used = float(training_seconds.numpy()) / 3600
        log(
            f"Time budget: {train['time_budget_hours']:g} h of training ({used:.2f} h used)"
            + (
                f"; the run ends after epoch {epochs}"
                if epochs < train["epochs"]
                else "; the run and its cool-down end sooner if the rest would not fit"
            )
        )
    log(f"Model: {model.count_params():,} parameters")
    step = int(optimizer.iterations.numpy())
    if step:
        source = manager.latest_checkpoint if restored else "the chief's checkpoint"
        log(f"Resuming from {source} (step {step}, {int(completed_epochs.numpy())} epochs done)")
    if task.is_chief:  # only now, when nothing has failed, does the configuration change
        save_config(config, workdir / CONFIG_FILE)
    translator = Translator(
        float32_model,
        source_tokenizer,
        target_tokenizer,
        SearchOptions.from_config(config["decode"]),
        config["decode"]["batch_size"],
    )
    stream = TrainingStream(config, training_corpora, segmenters, strategy, positions, log)
    early_stopping = None
    if stopping_state is not None:
        early_stopping = training_callbacks.EarlyStopping(
            train["early_stopping_patience"], stopping_state, log
        )
    callbacks = _callbacks(
        config, workdir, task, manager, completed_epochs, translator, float32_model, corpora,
        valid_data is not None, stream, clock, budget, early_stopping, started, log,
    )  # fmt: skip

    before = float(training_seconds.numpy())
    history = {}
    try:
        for first_epoch, end_epoch, steps in _remaining_work(
            steps_per_epoch, epochs, int(completed_epochs.numpy()),
            int(optimizer.iterations.numpy()), log,
        ):  # fmt: skip
            fitted = model.fit(
                stream.start(int(optimizer.iterations.numpy())),
                epochs=end_epoch,
                initial_epoch=first_epoch,
                steps_per_epoch=steps,
                validation_data=valid_data,
                callbacks=callbacks,
                shuffle=False,  # the dataset shuffles itself, seeded
                verbose=0,  # EpochProgress reports
            ).history
            for key, values in fitted.items():
                history.setdefault(key, []).extend(values)
            if model.stop_training:  # early stopping or the time budget: no further fit
                break
    except (tf.errors.UnavailableError, tf.errors.AbortedError) as error:
        if config["distribute"]["strategy"] != "multi_worker":
            raise
        raise WorkerLost(
            f"another worker stopped ({first_line(error)}); the last checkpoint here is "
            f"{manager.latest_checkpoint}. Restart every worker with the same command to resume"
        ) from None
    finally:
        callbacks[-1].restore_handlers()
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
    elif history and early_stopping:
        best_epoch = early_stopping.restore_best(model)
        if best_epoch and best_epoch < int(completed_epochs.numpy()):
            log(f"Weights: the best epoch's, epoch {best_epoch} (lowest validation loss)")
    # With nothing left to train, the saved model is the run's: its weights may be averaged or
    # early stopping's best, where the last checkpoint's are neither.
    total = float(training_seconds.numpy())
    if history or not (workdir / MODEL_FILE).exists():
        float32_model.set_weights(model.get_weights())
        save_model_atomically(float32_model, workdir / MODEL_FILE)
        resumed = f" ({total - before:.0f} s in this command)" if before else ""
        log(f"Trained for {total:.0f} s{resumed}; model saved to {workdir / MODEL_FILE}")
    else:
        float32_model.load_weights(workdir / MODEL_FILE)
    if corpora["test"]:
        _evaluate_test(translator, corpora["test"], workdir, total, log)
    return history


def weights_fingerprint(model):
    """A short hash of every weight: equal on workers that hold the same model."""
    digest = hashlib.sha256()
    for weight in model.weights:
        digest.update(np.ascontiguousarray(keras.ops.convert_to_numpy(weight)).tobytes())
    return digest.hexdigest()[:16]
