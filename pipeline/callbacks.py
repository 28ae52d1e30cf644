"""Training callbacks: throughput, step checkpoints, BLEU on a validation subset."""

import time

import keras

from pipeline.evaluation import score_translations


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


class CheckpointEveryNSteps(keras.callbacks.Callback):
    """Saves a `tf.train.CheckpointManager` checkpoint every N steps and at each epoch end.

    `completed_epochs` (a variable in the checkpoint) records how many epochs had finished,
    so that a resumed run starts at the right epoch with the step count continuing.
    """

    def __init__(self, manager, completed_epochs, every_steps):
        super().__init__()
        self.manager = manager
        self.completed_epochs = completed_epochs
        self.every_steps = every_steps
        self._saved_step = None

    def _save(self):
        step = int(self.model.optimizer.iterations.numpy())
        if step != self._saved_step:
            self.manager.save(checkpoint_number=step)
            self._saved_step = step

    def on_train_batch_end(self, batch, logs=None):
        if int(self.model.optimizer.iterations.numpy()) % self.every_steps == 0:
            self._save()

    def on_epoch_end(self, epoch, logs=None):
        self.completed_epochs.assign(epoch + 1)
        self._save()


class ValidationBleu(keras.callbacks.Callback):
    """Every `every_epochs` epochs, translates a validation subset and logs `val_bleu`."""

    def __init__(self, translator, sources, references, every_epochs, log=print):
        super().__init__()
        self.translator = translator
        self.sources = sources
        self.references = references
        self.every_epochs = every_epochs
        self.log = log

    def on_epoch_end(self, epoch, logs=None):
        if (epoch + 1) % self.every_epochs:
            return
        hypotheses = self.translator.translate_best(self.sources)
        scores = score_translations(hypotheses, self.references)
        if logs is not None:
            logs["val_bleu"] = scores["bleu"]
        self.log(
            f"epoch {epoch + 1}: BLEU {scores['bleu']} on {len(self.sources)} validation sentences"
        )
