"""Training callbacks: throughput, step checkpoints, the best checkpoints, safe stops, early
stopping, BLEU and chrF on a validation subset."""

import math
import shutil
import signal
import sys
import threading
import time
from pathlib import Path

import keras
import tensorflow as tf

from pipeline.core.atomic_files import writing
from pipeline.core.errors import UserError, WriteFailed
from pipeline.decoding.attention_plot import attention_png
from pipeline.decoding.evaluation import score_translations


class TrainingDiverged(UserError):
    """The loss or the weights stopped being finite numbers."""

    def __init__(self, what, step, manager):
        kept = manager.latest_checkpoint
        super().__init__(
            f"training diverged: {what} at step {step}; "
            + (f"the last good checkpoint, {kept}, is kept" if kept else "no checkpoint yet")
            + ". Lower train.learning_rate or set train.clip_norm"
        )


class TrainingInterrupted(Exception):
    """SIGINT or SIGTERM stopped training after a checkpoint was saved."""

    def __init__(self, signum, checkpoint):
        super().__init__(f"interrupted by {signal.Signals(signum).name}")
        self.signum = signum
        self.checkpoint = checkpoint


class TargetTokensPerSecond(keras.callbacks.Callback):
    """Adds `tgt_tok/s` (non-padding target tokens per second of training this epoch) to the
    logs. It reads the token count the model's perplexity metric already keeps, so nothing is
    added to the training step."""

    def on_epoch_begin(self, epoch, logs=None):
        self._start = time.perf_counter()
        self._rate = 0.0

    def on_train_batch_end(self, batch, logs=None):
        elapsed = max(time.perf_counter() - self._start, 1e-9)
        self._rate = float(self.model.perplexity.count.numpy()) / elapsed
        if logs is not None:
            logs["tgt_tok/s"] = self._rate

    def on_epoch_end(self, epoch, logs=None):
        # Validation has run and reset the metrics by now: report the training rate.
        if logs is not None:
            logs["tgt_tok/s"] = self._rate


class FirstStepTime(keras.callbacks.Callback):
    """Logs how long after the run started its first training step ended: the wait a user
    has before training (corpus scan, vocabularies, model, first batches)."""

    def __init__(self, started, log=print):
        super().__init__()
        self.started = started
        self.log = log
        self._done = False

    def on_train_batch_end(self, batch, logs=None):
        if not self._done:
            self._done = True
            self.log(f"First training step after {time.perf_counter() - self.started:.1f} s")


class EpochProgress(keras.callbacks.Callback):
    """Training's progress for the user, in place of Keras' progress bar (whose redraws and
    per-epoch headers took five lines an epoch when written to a file): on a terminal, one
    line redrawn as the steps go; then one line an epoch with its figures, among them the
    mean time of a step after the epoch's first (which may trace) and before its end work
    (validation, checkpoints). Put it after the callbacks that add to the logs (BLEU)."""

    FIGURES = (
        ("loss", "loss {:.3f}"),
        ("perplexity", "perplexity {:.2f}"),
        ("val_loss", "validation loss {:.3f}"),
        ("val_perplexity", "validation perplexity {:.2f}"),
        ("val_bleu", "validation BLEU {:.2f}"),
        ("tgt_tok/s", "{:,.0f} target tokens/s"),
    )
    REDRAW_SECONDS = 0.5

    def __init__(self, epochs, log=print, stream=None):
        super().__init__()
        self.epochs = epochs
        self.log = log
        self.stream = stream or sys.stdout
        self.interactive = self.stream.isatty()

    def on_epoch_begin(self, epoch, logs=None):
        self._epoch = epoch + 1
        self._start = self._drawn = time.perf_counter()
        self._steps = 0

    def _figures(self, logs):
        return ", ".join(text.format(logs[key]) for key, text in self.FIGURES if key in logs)

    def on_train_batch_end(self, batch, logs=None):
        now = time.perf_counter()
        if batch == 0:
            self._first_step_end = now
        self._last_step_end, self._steps = now, batch + 1
        if not self.interactive or now - self._drawn < self.REDRAW_SECONDS:
            return
        self._drawn = now
        line = (f"epoch {self._epoch}/{self.epochs}: step {batch + 1:,}/{self.params['steps']:,}, "
                f"{self._figures(logs or {})}")  # fmt: skip
        self.stream.write(f"\r{line}\x1b[K")  # the rest of the previous line erased
        self.stream.flush()

    def on_epoch_end(self, epoch, logs=None):
        if self.interactive:
            self.stream.write("\r\x1b[K")
        figures = self._figures(logs or {})
        if self._steps > 1:
            step = (self._last_step_end - self._first_step_end) / (self._steps - 1)
            figures += f", {step * 1000:.0f} ms a step"
        seconds = time.perf_counter() - self._start
        self.log(f"epoch {self._epoch}/{self.epochs}: {figures}, {seconds:.0f} s")


class ReportAtTrainingEnd(keras.callbacks.Callback):
    """Logs the lines `report()` returns once, when training ends (the report stays one
    line an epoch)."""

    def __init__(self, report, log=print):
        super().__init__()
        self.report = report
        self.log = log

    def on_train_end(self, logs=None):
        self.log("\n".join(self.report()))


class CheckpointEveryNSteps(keras.callbacks.Callback):
    """Saves a `tf.train.CheckpointManager` checkpoint every N steps and at each epoch end.

    `completed_epochs` (a variable in the checkpoint) records how many epochs had finished,
    so that a resumed run starts at the right epoch with the step count continuing.
    """

    def __init__(self, manager, completed_epochs, every_steps, before_save=lambda: None):
        super().__init__()
        self.manager = manager
        self.completed_epochs = completed_epochs
        self.every_steps = every_steps
        self.before_save = before_save  # records state kept beside the weights
        self._saved_step = None

    def save(self):
        """Saves the current step (once), refusing weights that are not finite."""
        step = int(self.model.optimizer.iterations.numpy())
        if step == self._saved_step:
            return self.manager.latest_checkpoint
        finite = all(bool(tf.reduce_all(tf.math.is_finite(v))) for v in self.model.weights)
        if not finite:
            raise TrainingDiverged("the weights are not finite", step, self.manager)
        self._saved_step = step
        self.before_save()
        directory = Path(self.manager.directory)
        try:
            with writing(directory / f"ckpt-{step}"):
                return self.manager.save(checkpoint_number=step)
        except WriteFailed:
            # TensorFlow leaves its shards behind (ckpt-N_temp/); the last complete
            # checkpoint stays the latest, for the same command to resume from.
            for partial in directory.glob(f"*-{step}[._]*"):
                if partial.is_dir():
                    shutil.rmtree(partial, ignore_errors=True)
                else:
                    partial.unlink(missing_ok=True)
            raise

    def on_train_batch_end(self, batch, logs=None):
        if batch + 1 == self.params.get("steps"):
            return  # the epoch's end saves this step, with the epoch counted as done
        if int(self.model.optimizer.iterations.numpy()) % self.every_steps == 0:
            self.save()

    def on_epoch_end(self, epoch, logs=None):
        self.completed_epochs.assign(epoch + 1)
        self.save()


class TrainingClock(keras.callbacks.Callback):
    """Counts the run's training time across resumes in `state.training_seconds`; `record`
    brings it up to date (at each epoch end and before each save, so that the last checkpoint
    holds the time that the run reports)."""

    def __init__(self, state):
        super().__init__()
        self.seconds = state.training_seconds
        self._recorded = None

    def record(self):
        """Adds the time since the last call (or the fit's start) to the training time."""
        now = time.perf_counter()
        self.seconds.assign_add(now - self._recorded)
        self._recorded = now

    def on_train_begin(self, logs=None):
        self._recorded = time.perf_counter()

    def on_epoch_end(self, epoch, logs=None):
        self.record()


class TimeBudget(keras.callbacks.Callback):
    """Ends training within `train.time_budget_hours` of training time, which a
    `TrainingClock` (before this callback in `ORDER`) counts across resumes in `state`.

    At each epoch end, when one more epoch and then the cool-down (`train.cooldown_epochs`),
    at the mean epoch time measured so far, would not fit what is left, the cool-down begins at
    once and training stops at its end; without a cool-down, training stops there.
    `state.last_epoch` is the last epoch once decided (0 before): a resumed run keeps it.
    """

    def __init__(self, train, state, steps_per_epoch, schedule, log=print):
        super().__init__()
        self.budget = train["time_budget_hours"] * 3600.0
        self.epochs = train["epochs"]  # the most, and where the configured cool-down ends
        self.cooldown_epochs = min(train["cooldown_epochs"], train["epochs"])
        self.steps_per_epoch = steps_per_epoch
        self.schedule = schedule
        self.log = log
        self.seconds, self.last_epoch = state.training_seconds, state.last_epoch
        self._epoch_seconds = []

    def on_train_begin(self, logs=None):
        self._epoch_began = time.perf_counter()

    def on_epoch_end(self, epoch, logs=None):
        now = time.perf_counter()
        if self.params.get("steps") == self.steps_per_epoch:  # not the rest of a resumed one
            self._epoch_seconds.append(now - self._epoch_began)
        self._epoch_began = now
        last = int(self.last_epoch.numpy())
        if not last:
            last = self._decide(epoch + 1)
        if last and epoch + 1 >= last:
            self.model.stop_training = True

    def _decide(self, done):
        """The last epoch, if what is left of the budget calls for ending now (else 0)."""
        if not self._epoch_seconds or done + self.cooldown_epochs >= self.epochs:
            return 0  # nothing measured yet, or the configured cool-down is (about to be) under way
        per_epoch = sum(self._epoch_seconds) / len(self._epoch_seconds)
        left = self.budget - float(self.seconds.numpy())
        if left >= (self.cooldown_epochs + 1) * per_epoch:
            return 0
        last = done + self.cooldown_epochs
        self.last_epoch.assign(last)
        used = f"{float(self.seconds.numpy()) / 3600:.2f} of {self.budget / 3600:g} h used"
        if not self.cooldown_epochs:
            self.log(f"Time budget: {used}, {per_epoch:.0f} s an epoch: training stops here")
            return last
        steps = self.schedule.cool_down_epochs(self.cooldown_epochs, last, self.steps_per_epoch)
        self.log(
            f"Time budget: {used}, {per_epoch:.0f} s an epoch: the learning rate cools down to 0 "
            f"over {steps} ({f'epochs {done + 1}-{last}' if last > done + 1 else f'epoch {last}'}"
            "), then training stops"
        )
        return last


class EarlyStopping(keras.callbacks.Callback):
    """Stops training once `metric` (a `checkpoints.StoppingMetric`: the validation loss, BLEU
    or chrF) has not improved for `patience` epochs; its `state` is a
    `run_state.EarlyStoppingState`, whose `best` holds the value as "lower is better" (BLEU
    and chrF negated)."""

    def __init__(self, patience, state, metric, log=print):
        super().__init__()
        self.patience, self.state, self.metric, self.log = patience, state, metric, log

    def on_epoch_end(self, epoch, logs=None):
        value = self.metric.value(logs)
        if value is None:
            return
        state = self.state
        lower_is_better = -value if self.metric.higher_is_better else value
        if lower_is_better < float(state.best.numpy()):
            state.best.assign(lower_is_better)
            state.best_epoch.assign(epoch + 1)
            state.wait.assign(0)
            for copy, weight in zip(state.copies, self.model.weights, strict=True):
                copy.assign(weight)
            return
        state.wait.assign_add(1)
        if int(state.wait.numpy()) >= self.patience:
            self.model.stop_training = True
            best = abs(float(state.best.numpy()))
            how = "risen" if self.metric.higher_is_better else "fallen"
            self.log(
                f"Early stopping: the {self.metric.description} has not {how} for "
                f"{self.patience} epochs (best {best:.3f}, after epoch "
                f"{int(state.best_epoch.numpy())})"
            )


class KeepBest(keras.callbacks.Callback):
    """At each epoch end, keeps the run's checkpoint when the epoch's `metric` ranks among
    `best`'s (a `checkpoints.BestCheckpoints`); `before_save` brings the checkpointed state
    up to date first, as for every checkpoint."""

    def __init__(self, best, checkpoint, before_save, log=print):
        super().__init__()
        self.best, self.checkpoint, self.before_save, self.log = best, checkpoint, before_save, log

    def on_epoch_end(self, epoch, logs=None):
        value = self.best.metric.value(logs)
        if value is None:
            return
        self.before_save()
        step = int(self.model.optimizer.iterations.numpy())
        if self.best.offer(self.checkpoint, step, epoch + 1, value):
            self.log(f"Kept among the {self.best.count} best: ckpt-{step} "
                     f"({self.best.metric.description} {value:.3f})")  # fmt: skip


class StopOnNonFiniteLoss(keras.callbacks.Callback):
    """Stops training with `TrainingDiverged` as soon as the loss is NaN or infinite.

    It must come before the checkpoint callback, so that no checkpoint follows the bad step.
    """

    def __init__(self, manager):
        super().__init__()
        self.manager = manager

    def on_train_batch_end(self, batch, logs=None):
        loss = (logs or {}).get("loss")
        if loss is not None and not math.isfinite(float(loss)):
            step = int(self.model.optimizer.iterations.numpy())
            raise TrainingDiverged(f"the loss is {float(loss)}", step, self.manager)


class StopOnSignal(keras.callbacks.Callback):
    """On SIGINT or SIGTERM, saves a checkpoint after the current step and stops training
    by raising `TrainingInterrupted`; the same command then resumes from that checkpoint.
    A second signal stops at once (the previous checkpoint remains).

    The handlers go in at the first `fit` and stay until the owner calls `restore_handlers`:
    a resumed run fits the rest of an epoch and then the other epochs, and a signal between
    the two fits must find them too (it killed the process there)."""

    SIGNALS = (signal.SIGINT, signal.SIGTERM)

    def __init__(self, checkpointer, log=print):
        super().__init__()
        self.checkpointer = checkpointer
        self.log = log
        self.received = None
        self._previous = {}

    def _handle(self, signum, frame):
        if self.received is not None:  # the second one: give up waiting
            self.restore_handlers()
            signal.raise_signal(signum)
            return
        self.received = signum
        self.log(
            f"\n{signal.Signals(signum).name}: saving a checkpoint after this step, then "
            "stopping (send it again to stop at once)"
        )

    def restore_handlers(self):
        for signum, handler in self._previous.items():
            signal.signal(signum, handler)
        self._previous = {}

    def _stop_if_asked(self):
        if self.received is not None:
            self.restore_handlers()
            raise TrainingInterrupted(self.received, self.checkpointer.save())

    def on_train_begin(self, logs=None):
        # Only the main thread may set handlers.
        if not self._previous and threading.current_thread() is threading.main_thread():
            self._previous = {s: signal.signal(s, self._handle) for s in self.SIGNALS}

    def on_train_batch_end(self, batch, logs=None):
        # After an epoch's last step, the epoch ends first: its checkpoint counts it as done,
        # where one saved here would have the resumed run repeat the whole epoch.
        if batch + 1 != self.params.get("steps"):
            self._stop_if_asked()

    def on_epoch_begin(self, epoch, logs=None):
        self._stop_if_asked()  # a signal during validation: the epoch's checkpoint is saved

    def on_train_end(self, logs=None):
        self._stop_if_asked()


class ValidationBleu(keras.callbacks.Callback):
    """Every `every_epochs` epochs, translates a validation subset (`sources`, with their
    `target_prefix`es or None) and logs `val_bleu` and `val_chrf`, and for a multilingual
    model `val_bleu_<direction>` for each of its `directions` (`(name, start, end)` lines of
    the subset).

    `translator` decodes with `float32_model`, the plain float32 model that is saved and
    exported, which first takes the trained weights.
    """

    def __init__(self, translator, float32_model, sources, target_prefix, references,
                 every_epochs, directions=()):  # fmt: skip
        super().__init__()
        self.translator = translator
        self.float32_model = float32_model
        self.sources, self.target_prefix = sources, target_prefix
        self.references = references
        self.every_epochs = every_epochs
        self.directions = directions

    def on_epoch_end(self, epoch, logs=None):
        if (epoch + 1) % self.every_epochs:
            return
        self.float32_model.set_weights(self.model.get_weights())
        hypotheses = self.translator.translate(self.sources, self.target_prefix)
        if logs is None:
            return
        scores = score_translations(hypotheses, self.references)
        logs["val_bleu"], logs["val_chrf"] = scores["bleu"], scores["chrf"]
        for name, start, end in self.directions:
            scores = score_translations(hypotheses[start:end], self.references[start:end])
            logs[f"val_bleu_{name}"] = scores["bleu"]


class StoppingScores(ValidationBleu):
    """`ValidationBleu` every epoch, before early stopping and `KeepBest` read it: for a run
    that stops or keeps checkpoints by BLEU or chrF."""

    def __init__(self, translator, float32_model, sources, target_prefix, references,
                 directions=()):  # fmt: skip
        super().__init__(translator, float32_model, sources, target_prefix, references, 1,
                         directions)  # fmt: skip


class AttentionImages(keras.callbacks.Callback):
    """Each epoch, the attention matrices of a few fixed validation sentences as TensorBoard
    images (`attention/1`, ...) in `log_dir`, beside the loss and BLEU curves.

    `translator` decodes with `float32_model`, as in `ValidationBleu`.
    """

    def __init__(self, translator, float32_model, sources, target_prefix, log_dir):
        super().__init__()
        self.translator = translator
        self.float32_model = float32_model
        self.sources, self.target_prefix = sources, target_prefix  # as `ValidationBleu`'s
        self.log_dir = str(log_dir)
        self._writer = None

    def on_epoch_end(self, epoch, logs=None):
        self.float32_model.set_weights(self.model.get_weights())
        if self._writer is None:
            self._writer = tf.summary.create_file_writer(self.log_dir)
        hypotheses = [n_best[0] for n_best in
                      self.translator.hypotheses(self.sources, self.target_prefix)]  # fmt: skip
        with self._writer.as_default(step=epoch + 1):
            for number, hypothesis in enumerate(hypotheses, start=1):
                if not hypothesis.target_tokens or not hypothesis.source_tokens:
                    continue
                image = tf.image.decode_png(attention_png(hypothesis), channels=3)
                tf.summary.image(f"attention/{number}", image[tf.newaxis], description=(
                    f"{self.sources[number - 1]} -> {hypothesis.text}"))  # fmt: skip
        self._writer.flush()

    def on_train_end(self, logs=None):
        if self._writer is not None:
            self._writer.close()
            self._writer = None


# The order the callbacks run in, at each step's and each epoch's end: each may rely on the
# work of those before it.
ORDER = (
    FirstStepTime,
    StopOnNonFiniteLoss,  # before any checkpoint of the step
    TargetTokensPerSecond,
    TrainingClock,  # the time, before the budget reads it and a checkpoint keeps it
    TimeBudget,  # the stopping rules, before the checkpoint that keeps their decisions
    StoppingScores,  # what early stopping reads, when it watches BLEU or chrF
    EarlyStopping,
    CheckpointEveryNSteps,
    KeepBest,
    ReportAtTrainingEnd,
    ValidationBleu,  # these two translate, which takes long: after the checkpoint
    AttentionImages,
    EpochProgress,  # after the callbacks that add to the logs
    keras.callbacks.TensorBoard,
    StopOnSignal,  # last: on a signal, the others' train-end work happens first
)


def in_order(callbacks):
    """`callbacks` sorted as `ORDER` says; a callback of a class not in it is a TypeError."""

    def place(callback):
        for index, kind in enumerate(ORDER):
            if isinstance(callback, kind):
                return index
        raise TypeError(f"{type(callback).__name__} has no place in callbacks.ORDER")

    return sorted(callbacks, key=place)
