"""One training run in a work directory, in phases: data, model, restore, fit, finish."""

import contextlib
import hashlib
import json
import os
import shutil
import time

import keras
import numpy as np
import tensorflow as tf

from pipeline.config import save_config
from pipeline.core import multilingual
from pipeline.core.atomic_files import write_text_atomically
from pipeline.core.errors import UserError, first_line
from pipeline.data.corpus import (
    read_split,
    scan_multiway,
    scan_training_corpora,
    with_pair_tokens,
)
from pipeline.data.dataset import (
    ESTIMATE_SAMPLE,
    StreamCounters,
    batching_options,
    encode_corpus,
    estimate_steps_per_pass,
    make_dataset,
    make_training_stream,
    with_known_length,
)
from pipeline.data.tokenizer import prepare_tokenizers, training_tokenizers, vocabularies_to_build
from pipeline.decoding.evaluation import direction_table, score_directions, score_translations
from pipeline.decoding.translation import SearchOptions, Translator
from pipeline.model_types import MODEL_TYPES
from pipeline.model_types.builder import build_model
from pipeline.training import callbacks as training_callbacks
from pipeline.training.accumulation import accumulation_configured, micro_batches_per_update
from pipeline.training.accumulation import describe as describe_accumulation
from pipeline.training.checkpoints import WATCHED_METRICS, BestCheckpoints, average_checkpoints
from pipeline.training.distribution import (
    WorkerLost,
    current_task,
    make_strategy,
    take_chiefs_state,
)
from pipeline.training.optimizers import make_optimizer
from pipeline.training.precision import resolve as resolve_precision
from pipeline.training.run_state import TRAINING_TIME, RunState, restore_run, training_checkpoint
from pipeline.training.schedules import schedule_from_config
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

    def __init__(self, config, corpora, tokenizers, strategy, positions, log, micro_batches=1):
        self.config, self.corpora, self.tokenizers = config, corpora, tokenizers
        self.strategy, self.positions, self.log = strategy, positions, log
        self.micro_batches = micro_batches  # of an update, grouped into one element
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
                train["shuffle_buffer"], seed, context, self.micro_batches,
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


def _bleu_subset(valid, size):
    """(sources, references, directions) that validation BLEU translates: the first `size`
    pairs, or of a multilingual split, the first `size` of each direction (`(name, start,
    end)` each)."""
    if not valid.directions:
        return valid.sources[:size], valid.targets[:size], ()
    sources, references, directions = [], [], []
    for direction, start, end in valid.directions:
        first = len(sources)
        sources += valid.sources[start : min(end, start + size)]
        references += valid.targets[start : min(end, start + size)]
        directions.append((str(direction), first, len(sources)))
    return sources, references, directions


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


def _initialise_uniformly(model, limit, seed):
    """Every trainable weight of `model` drawn from U(-limit, limit), seeded."""
    seeds = keras.random.SeedGenerator(seed)
    for weight in model.trainable_weights:
        weight.assign(keras.random.uniform(weight.shape, -limit, limit, weight.dtype, seeds))


def run(config, workdir, log=print, init_from=None):
    """Trains (or resumes) the model of `config` in `workdir`; returns the Keras history.
    With `init_from` (a trained work directory), a run that has no checkpoint yet starts
    from that directory's weights.

    Under a multi-worker strategy every worker calls this; only the chief writes to
    `workdir`, the others to their scratch folders (see `pipeline.training.distribution`).
    """
    return TrainingRun(config, workdir, log, init_from).run()


class TrainingRun:
    """One `run`, its phases in the order they run; each phase sets what the next ones use."""

    def __init__(self, config, workdir, log, init_from):
        self.started = time.perf_counter()
        self.config, self.train, self.workdir = config, config["train"], workdir
        self.log, self.init_from = log, init_from
        self.strategy = make_strategy(config["distribute"])  # before any TensorFlow op
        self.task = current_task(config["distribute"])
        self.output = self.task.output_dir(workdir)
        self.output.mkdir(parents=True, exist_ok=True)
        self.train["precision"], line = resolve_precision(
            self.train["precision"], workdir / CONFIG_FILE,
            model_type=MODEL_TYPES[config["model"]["type"]],
        )  # fmt: skip
        log(line)
        replicas = self.strategy.num_replicas_in_sync
        self.micro_batches = micro_batches_per_update(self.train, replicas)  # of one update

    def run(self):
        self.prepare_data()
        with self.strategy.scope():
            self.build_model()
            self.restore()
        self.plan_epochs()
        history = self.fit()
        if self.task.is_chief:  # the chief holds the results
            self.finish(history)
        else:
            self.leave_scratch()
        return history

    def prepare_data(self):
        """The corpora, the vocabularies (built on a first run) and the batches' estimate."""
        data, train = self.config["data"], self.train
        keras.utils.set_random_seed(train["seed"])
        building = vocabularies_to_build(self.output, data)
        sample_size = data["vocab_sample_size"] if building else ESTIMATE_SAMPLE
        language_sample = []  # a multilingual vocabulary's: every language in equal number
        if multilingual.is_multilingual(data):
            self.training_corpora, source_sample, target_sample, language_sample = scan_multiway(
                data, sample_size, train["seed"], self.log
            )
        else:
            self.training_corpora, source_sample, target_sample = scan_training_corpora(
                data, sample_size, train["seed"], self.log
            )
        self.corpora = {split: read_split(data, split) for split in ("valid", "test")}
        self.pair_tokens = multilingual.pair_tokens(data)  # an imported model's, fine-tuned
        samples = {"source": source_sample, "target": target_sample, "languages": language_sample}
        self.tokenizers = prepare_tokenizers(self.output, data, samples, self.log)
        source, target = self.tokenizers
        self.log(f"Vocabularies: {source.vocab_size} source, {target.vocab_size} target")
        valid = self.corpora["valid"]
        self.valid_data = _validation_data(
            self.config, valid and with_pair_tokens(valid, *self.pair_tokens), self.tokenizers,
            self.log,
        )  # fmt: skip
        self.segmenters = training_tokenizers(self.tokenizers, data)
        if self.segmenters is not self.tokenizers:
            alpha = data["subword_sampling_alpha"]
            how = (
                f"BPE-dropout, merges dropped at rate {alpha:g}"
                if data["subword_model"] == "bpe"
                else f"alpha {alpha:g}, n-best {data['subword_sampling_nbest']}"
            )
            self.log(f"Subword regularisation: training pairs segmented at random ({how})")
        self.steps_per_pass = estimate_steps_per_pass(  # refuses data with nothing to train on
            self.training_corpora, source_sample, target_sample, self.segmenters, data,
            batching_options(self.config), self.strategy.num_replicas_in_sync * self.micro_batches,
        )  # fmt: skip

    def build_model(self):
        """The model to train, its float32 twin (what is translated, scored, saved and
        exported), the optimizer, the run's state and the checkpoints that keep them."""
        train, distribute = self.train, self.config["distribute"]
        replicas = self.strategy.num_replicas_in_sync
        learning_rate = train["learning_rate"] * (
            replicas if distribute["scale_learning_rate"] else 1
        )
        self.log(
            f"Strategy: {distribute['strategy']}, {replicas} replica(s), this process "
            f"{self.task}{' (chief)' if self.task.is_chief else ''}; batch "
            f"{train['batch_size']} per replica, {train['batch_size'] * replicas} global; "
            f"learning rate {learning_rate:g}"
        )
        vocab_sizes = [tokenizer.vocab_size for tokenizer in self.tokenizers]
        self.model = build_model(self.config, *vocab_sizes, precision=train["precision"],
                                 for_training=True)  # fmt: skip
        self.model.loss_normalization = train["loss_normalization"]
        self.model.accumulate_steps = self.micro_batches
        if accumulation_configured(train):
            self.log(describe_accumulation(train, replicas, self.micro_batches))
        self.float32_model = build_model(self.config, *vocab_sizes)
        self.schedule = schedule_from_config(train, learning_rate)
        self.optimizer = make_optimizer(train, self.schedule)
        self.model.compile(optimizer=self.optimizer, jit_compile=train["jit_compile"])
        self.optimizer.build(self.model.trainable_variables)  # now: replicas need no batch
        stops_early = train["early_stopping_patience"] and self.valid_data is not None
        self.state = RunState(len(self.training_corpora), self.model if stops_early else None)
        self.checkpoint = training_checkpoint(self.model, self.optimizer, self.state)
        self.manager = tf.train.CheckpointManager(
            self.checkpoint, str(self.output / CHECKPOINT_DIR),
            max_to_keep=train["keep_checkpoints"],
        )  # fmt: skip
        self.metric = WATCHED_METRICS[train["early_stopping_metric"]]

    def restore(self):
        """The chief resumes from its latest checkpoint, or starts from `init_from`'s
        weights; the other workers take the chief's state rather than read their own."""
        self.restored = None
        if self.task.is_chief and self.manager.latest_checkpoint:
            self.restored = self.manager.latest_checkpoint
            lacked = restore_run(self.restored, self.model, self.optimizer, self.state)
            if TRAINING_TIME in lacked and self.train["time_budget_hours"] is not None:
                raise UserError(
                    f"{self.restored}: its checkpoints do not hold the run's training time "
                    "(written by an earlier release), so train.time_budget_hours cannot count "
                    "it; resume without one, or start a new work directory"
                )
            if TRAINING_TIME in lacked:
                self.log(f"{self.restored}: holds no training time; counted from this command")
        if self.init_from and self.task.is_chief and not self.restored:
            _initialise_from(self.model, self.init_from, self.log)
        elif self.train["init_uniform"] is not None and not self.restored:
            _initialise_uniformly(self.model, self.train["init_uniform"], self.train["seed"])
            self.log(f"Weights drawn uniformly from ±{self.train['init_uniform']:g}")
        take_chiefs_state(
            self.strategy, [*self.model.weights, *self.optimizer.variables, *self.state.variables],
            self.task.is_chief,
        )  # fmt: skip
        self.log(f"Model: {self.model.count_params():,} parameters")
        step = int(self.optimizer.iterations.numpy())
        if step:
            source = self.restored or "the chief's checkpoint"
            done = int(self.state.completed_epochs.numpy())
            self.log(f"Resuming from {source} (step {step}, {done} epochs done)")

    def plan_epochs(self):
        """The epoch length (kept from the run's start), the last epoch (a time budget's
        decision, if made) and the cool-down."""
        train, state = self.train, self.state
        # A resumed run keeps the epoch length it began with: the estimate's sample differs
        # when the vocabularies are reused rather than built. Runs whose checkpoints predate
        # it estimate again.
        resumed_epoch_steps = int(state.epoch_steps.numpy())
        self.steps_per_epoch = (
            train["steps_per_epoch"] or resumed_epoch_steps or self.steps_per_pass
        )
        state.epoch_steps.assign(self.steps_per_epoch)
        if train["steps_per_epoch"]:
            origin = ""
        elif resumed_epoch_steps:
            origin = " (as the run began)"
        else:
            origin = " (about one pass over the training data)"
        self.log(f"Epochs of {self.steps_per_epoch:,} steps{origin}")
        budgeted = train["time_budget_hours"] is not None
        # A time budget may have ended the run sooner than train.epochs, its cool-down with it.
        self.epochs = (budgeted and int(state.last_epoch.numpy())) or train["epochs"]
        cooldown_epochs = min(train["cooldown_epochs"], train["epochs"])
        if cooldown_epochs:
            steps = self.schedule.cool_down_epochs(cooldown_epochs, self.epochs,
                                                   self.steps_per_epoch)  # fmt: skip
            self.log(
                f"Learning rate cools down linearly to 0 over {steps} (train.cooldown_epochs: "
                f"{cooldown_epochs})"
            )
        if budgeted:
            used = float(state.training_seconds.numpy()) / 3600
            self.log(
                f"Time budget: {train['time_budget_hours']:g} h of training ({used:.2f} h used)"
                + (
                    f"; the run ends after epoch {self.epochs}"
                    if self.epochs < train["epochs"]
                    else "; the run and its cool-down end sooner if the rest would not fit"
                )
            )

    def fit(self):
        """Keras' `fit` for each part of the remaining work; returns the history."""
        if self.task.is_chief:  # only now, when nothing has failed, does the configuration change
            save_config(self.config, self.workdir / CONFIG_FILE)
        decode = self.config["decode"]
        self.translator = Translator(
            self.float32_model, *self.tokenizers, SearchOptions.from_config(decode),
            decode["batch_size"],
            strip_translation_spaces=self.config["data"]["strip_translation_spaces"],
        )  # fmt: skip
        self.stream = TrainingStream(self.config, self.training_corpora, self.segmenters,
                                     self.strategy, self.state.positions, self.log,
                                     self.micro_batches)  # fmt: skip
        self.seconds_before = float(self.state.training_seconds.numpy())
        callbacks = self.callbacks()
        history = {}
        try:
            for first_epoch, end_epoch, steps in _remaining_work(
                self.steps_per_epoch, self.epochs, int(self.state.completed_epochs.numpy()),
                int(self.optimizer.iterations.numpy()), self.log,
            ):  # fmt: skip
                fitted = self.model.fit(
                    self.stream.start(int(self.optimizer.iterations.numpy())),
                    epochs=end_epoch,
                    initial_epoch=first_epoch,
                    steps_per_epoch=steps,
                    validation_data=self.valid_data,
                    callbacks=callbacks,
                    shuffle=False,  # the dataset shuffles itself, seeded
                    verbose=0,  # EpochProgress reports
                ).history
                for key, values in fitted.items():
                    history.setdefault(key, []).extend(values)
                if self.model.stop_training:  # a stopping rule ended the run: no further fit
                    break
        except (tf.errors.UnavailableError, tf.errors.AbortedError) as error:
            if self.config["distribute"]["strategy"] != "multi_worker":
                raise
            raise WorkerLost(
                f"another worker stopped ({first_line(error)}); the last checkpoint here is "
                f"{self.manager.latest_checkpoint}. Restart every worker with the same command "
                "to resume"
            ) from None
        finally:
            callbacks[-1].restore_handlers()
        self.log(f"Weights fingerprint: {weights_fingerprint(self.model)}")
        return history

    def callbacks(self):
        """This run's callbacks, in `callbacks.ORDER`."""
        train, state, log = self.train, self.state, self.log
        clock = training_callbacks.TrainingClock(state)

        def before_save():
            self.stream.record()
            clock.record()

        checkpointer = training_callbacks.CheckpointEveryNSteps(
            self.manager, state.completed_epochs, train["checkpoint_every_steps"], before_save
        )
        callbacks = [
            training_callbacks.FirstStepTime(self.started, log),
            training_callbacks.StopOnNonFiniteLoss(self.manager),
            training_callbacks.TargetTokensPerSecond(),
            clock,
            checkpointer,
            training_callbacks.ReportAtTrainingEnd(lambda: self.stream.counters.summary(), log),
            training_callbacks.EpochProgress(train["epochs"], log),
            training_callbacks.StopOnSignal(checkpointer, log),
        ]
        if train["time_budget_hours"] is not None:
            callbacks.append(training_callbacks.TimeBudget(
                train, state, self.steps_per_epoch, self.schedule, log))  # fmt: skip
        if state.early_stopping is not None:
            patience = train["early_stopping_patience"]
            callbacks.append(training_callbacks.EarlyStopping(
                patience, state.early_stopping, self.metric, log))  # fmt: skip
        if train["keep_best"]:
            best = BestCheckpoints(self.output / CHECKPOINT_DIR, train["keep_best"], self.metric)
            callbacks.append(training_callbacks.KeepBest(best, self.checkpoint, before_save, log))
        callbacks.extend(self.chiefs_callbacks() if self.task.is_chief else ())
        return training_callbacks.in_order(callbacks)

    def chiefs_callbacks(self):
        """Validation BLEU, attention images and TensorBoard logs, written by the chief."""
        train, valid = self.train, self.corpora["valid"]
        callbacks = []
        if self.metric.name != "loss" or train["bleu_every_epochs"]:
            sources, references, directions = _bleu_subset(valid, train["bleu_subset"])
            subset = (self.translator, self.float32_model, *self.requests(sources), references)
            callbacks.append(
                training_callbacks.StoppingScores(*subset, directions)  # every epoch, first
                if self.metric.name != "loss"
                else training_callbacks.ValidationBleu(
                    *subset, train["bleu_every_epochs"], directions
                )  # fmt: skip
            )
        attends = MODEL_TYPES[self.config["model"]["type"]].attends(self.config["model"])
        if train["attention_images"] and self.valid_data is not None and attends:
            callbacks.append(training_callbacks.AttentionImages(
                self.translator, self.float32_model,
                *self.requests(valid.sources[: train["attention_images"]]),
                self.workdir / LOG_DIR / "validation"))  # fmt: skip
        profiled = train["profile_steps"]
        steps = (PROFILE_AFTER + 1, PROFILE_AFTER + profiled) if profiled else 0
        callbacks.append(keras.callbacks.TensorBoard(str(self.workdir / LOG_DIR),
                                                     profile_batch=steps))  # fmt: skip
        return callbacks

    def finish(self, history):
        """The saved model (the mean of the last checkpoints, early stopping's best epoch or
        the last weights) and its test scores."""
        train, model, log = self.train, self.model, self.log
        step = int(self.optimizer.iterations.numpy())
        weights = f"the last weights (step {step})" if history else None
        if history and train["average_checkpoints"] > 1:
            paths = self.manager.checkpoints[-train["average_checkpoints"] :]
            average_checkpoints(model, train, paths)
            names = ", ".join(os.path.basename(path) for path in paths)
            weights = f"the mean of the last {len(paths)} checkpoints ({names})"
            log(f"Weights: {weights}")
        elif history and self.state.early_stopping is not None:
            best_epoch = self.state.early_stopping.restore_best(model)
            if best_epoch and best_epoch < int(self.state.completed_epochs.numpy()):
                best = abs(float(self.state.early_stopping.best.numpy()))
                weights = (f"the best epoch's, epoch {best_epoch} (best "
                           f"{self.metric.description}, {best:.3f})")  # fmt: skip
                log(f"Weights: {weights}")
        # With nothing left to train, the saved model is the run's: its weights may be averaged
        # or early stopping's best, where the last checkpoint's are neither.
        total = float(self.state.training_seconds.numpy())
        if history or not (self.workdir / MODEL_FILE).exists():
            self.float32_model.set_weights(model.get_weights())
            save_model_atomically(self.float32_model, self.workdir / MODEL_FILE)
            before = self.seconds_before
            resumed = f" ({total - before:.0f} s in this command)" if before else ""
            log(f"Trained for {total:.0f} s{resumed}; model saved to {self.workdir / MODEL_FILE}")
        else:
            self.float32_model.load_weights(self.workdir / MODEL_FILE)
        if self.corpora["test"]:
            self.evaluate_test(total, weights)

    def evaluate_test(self, training_seconds, weights=None):
        """Scores the saved model on the test split; the report says which `weights` it holds
        (None: as saved by an earlier command)."""
        corpus = self.corpora["test"]
        self.log(f"Translating the test split ({len(corpus)} sentences)...")
        hypotheses = self.translator.translate(*self.requests(corpus.sources))
        report = score_translations(hypotheses, corpus.targets)
        if corpus.directions:  # a multilingual model: each direction on its own too
            report["directions"] = score_directions(hypotheses, corpus)
            self.log(direction_table(report["directions"]))
        report["training_seconds"] = round(training_seconds, 1)
        earlier = self.workdir / TEST_REPORT  # the saved model's, when this command trained none
        if weights is None and earlier.exists():
            with contextlib.suppress(ValueError):  # a damaged report is replaced
                weights = json.loads(earlier.read_text(encoding="utf-8")).get("weights")
        if weights:
            report["weights"] = weights
        write_text_atomically(self.workdir / TEST_TRANSLATIONS,
                              "".join(h + "\n" for h in hypotheses))  # fmt: skip
        write_text_atomically(self.workdir / TEST_REPORT, json.dumps(report, indent=2) + "\n")
        pooled = ", every direction pooled" if corpus.directions else ""
        self.log(
            f"Test{pooled}: BLEU {report['bleu']} (lowercased {report['bleu_lowercase']}), "
            f"chrF {report['chrf']}, TER {report['ter']}  [{report['bleu_signature']}]"
        )

    def requests(self, sources):
        """(`sources` as the model takes them, their target prefixes or None): an imported
        model's after their token, each target prefix a many-to-many import's target
        language token (`multilingual.pair_tokens`); the others' as they are."""
        source_token, target_token = self.pair_tokens
        if source_token:
            sources = multilingual.tagged(sources, source_token)
        return sources, [target_token] * len(sources) if target_token else None

    def leave_scratch(self):
        """A worker other than the chief removes its scratch folder (and the scratch root,
        once no worker uses it)."""
        shutil.rmtree(self.output, ignore_errors=True)
        with contextlib.suppress(OSError):
            self.output.parent.rmdir()


def weights_fingerprint(model):
    """A short hash of every weight: equal on workers that hold the same model."""
    digest = hashlib.sha256()
    for weight in model.weights:
        digest.update(np.ascontiguousarray(keras.ops.convert_to_numpy(weight)).tobytes())
    return digest.hexdigest()[:16]
