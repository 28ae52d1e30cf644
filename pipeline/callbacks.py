"""Training callbacks: throughput, step checkpoints, safe stops, BLEU on a validation subset."""

import math
import signal
import threading
import time

import keras
import tensorflow as tf

from pipeline.errors import UserError
from pipeline.evaluation import score_translations


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
            self.log(f"\nFirst training step after {time.perf_counter() - self.started:.1f} s")


class ReportAtTrainingEnd(keras.callbacks.Callback):
    """Logs the lines `report()` returns once training ends (once, not at every epoch: each
    such line splits the progress bar's, which Keras then writes again)."""

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
        return self.manager.save(checkpoint_number=step)

    def on_train_batch_end(self, batch, logs=None):
        if batch + 1 == self.params.get("steps"):
            return  # the epoch's end saves this step, with the epoch counted as done
        if int(self.model.optimizer.iterations.numpy()) % self.every_steps == 0:
            self.save()

    def on_epoch_end(self, epoch, logs=None):
        self.completed_epochs.assign(epoch + 1)
        self.save()


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
    A second signal stops at once (the previous checkpoint remains)."""

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
        if threading.current_thread() is threading.main_thread():  # where handlers may go
            self._previous = {s: signal.signal(s, self._handle) for s in self.SIGNALS}

    def on_train_batch_end(self, batch, logs=None):
        self._stop_if_asked()

    def on_epoch_begin(self, epoch, logs=None):
        self._stop_if_asked()  # a signal during validation: the epoch's checkpoint is saved

    def on_train_end(self, logs=None):
        self._stop_if_asked()
        self.restore_handlers()


class ValidationBleu(keras.callbacks.Callback):
    """Every `every_epochs` epochs, translates a validation subset and logs `val_bleu`.

    `translator` decodes with `float32_model`: the trained model itself, or (under mixed
    precision) its float32 twin, which first takes the trained weights.
    """

    def __init__(self, translator, float32_model, sources, references, every_epochs, log=print):
        super().__init__()
        self.translator = translator
        self.float32_model = float32_model
        self.sources = sources
        self.references = references
        self.every_epochs = every_epochs
        self.log = log

    def on_epoch_end(self, epoch, logs=None):
        if (epoch + 1) % self.every_epochs:
            return
        if self.float32_model is not self.model:
            self.float32_model.set_weights(self.model.get_weights())
        hypotheses = self.translator.translate_best(self.sources)
        scores = score_translations(hypotheses, self.references)
        if logs is not None:
            logs["val_bleu"] = scores["bleu"]
        self.log(
            f"epoch {epoch + 1}: BLEU {scores['bleu']} on {len(self.sources)} validation sentences"
        )
