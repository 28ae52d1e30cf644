"""Learning-rate schedules with an optional linear warm-up and linear cool-down."""

import keras
import tensorflow as tf
from keras import ops

from pipeline.config import SCHEDULE_KINDS as KINDS


@keras.saving.register_keras_serializable(package="seq2seq")
class LearningRateSchedule(keras.optimizers.schedules.LearningRateSchedule):
    """lr(step) = learning_rate * warmup(step) * decay(step) * cooldown(step).

    warmup rises linearly to 1 over `warmup_steps` (none if 0). decay is
    - "constant":     1
    - "inverse_sqrt": sqrt(warmup_steps / step) after the warm-up (Vaswani et al., 2017)
    - "exponential":  decay_rate ** (step / decay_steps)
    cooldown falls linearly from 1 to 0 over the last `cooldown_steps` before `end_step`, the
    run's last step (none if 0): the annealing that a run of fixed length ends with
    (Hägele et al., 2024, "warmup-stable-decay"). Both are counted in steps, which the trainer
    knows only once it knows the run's epoch length, or, under a time budget, once the run
    has measured its epochs: `set_cooldown` sets them after construction, in variables that a
    traced training step reads, so that it may also change them between steps.
    """

    def __init__(
        self, kind, learning_rate, warmup_steps=0, decay_steps=1000, decay_rate=0.5,
        cooldown_steps=0, end_step=None,
    ):  # fmt: skip
        if kind not in KINDS:
            raise ValueError(f"learning-rate schedule must be one of {KINDS}, got {kind!r}")
        if cooldown_steps and end_step is None:
            raise ValueError("a cool-down needs the run's last step: give end_step")
        self.kind = kind
        self.learning_rate = float(learning_rate)
        self.warmup_steps = int(warmup_steps)
        self.decay_steps = int(decay_steps)
        self.decay_rate = float(decay_rate)
        self._cooldown_steps = tf.Variable(float(cooldown_steps), trainable=False)
        self._end_step = tf.Variable(float(end_step or 0), trainable=False)

    @property
    def cooldown_steps(self):
        return int(self._cooldown_steps.numpy())

    @property
    def end_step(self):
        return int(self._end_step.numpy()) if self.cooldown_steps else None

    def __call__(self, step):
        step = ops.cast(step, "float32") + 1.0
        warmup = float(max(self.warmup_steps, 1))
        factor = ops.minimum(1.0, step / warmup)
        if self.kind == "inverse_sqrt":
            factor = factor * ops.sqrt(warmup / ops.maximum(step, warmup))
        elif self.kind == "exponential":
            factor = factor * ops.power(self.decay_rate, (step - 1.0) / self.decay_steps)
        cooldown = ops.convert_to_tensor(self._cooldown_steps)
        left = (ops.convert_to_tensor(self._end_step) - step + 1.0) / ops.maximum(cooldown, 1.0)
        factor = factor * ops.where(cooldown > 0.0, ops.clip(left, 0.0, 1.0), 1.0)
        return self.learning_rate * factor

    def set_cooldown(self, cooldown_steps, end_step):
        self._cooldown_steps.assign(float(cooldown_steps))
        self._end_step.assign(float(end_step))

    def cool_down_epochs(self, cooldown_epochs, last_epoch, steps_per_epoch):
        """`set_cooldown` over the last `cooldown_epochs` epochs up to the end of `last_epoch`;
        returns those steps, for the log ("steps 7,861-10,480")."""
        end_step = last_epoch * steps_per_epoch
        cooldown_steps = cooldown_epochs * steps_per_epoch
        self.set_cooldown(cooldown_steps, end_step)
        return f"steps {end_step - cooldown_steps + 1:,}-{end_step:,}"

    def get_config(self):
        return {
            "kind": self.kind,
            "learning_rate": self.learning_rate,
            "warmup_steps": self.warmup_steps,
            "decay_steps": self.decay_steps,
            "decay_rate": self.decay_rate,
            "cooldown_steps": self.cooldown_steps,
            "end_step": self.end_step,
        }


def schedule_from_config(train, learning_rate):
    """The schedule of a `train` configuration section peaking at `learning_rate` (the
    configured one, scaled for the replicas where asked), without its cool-down, which
    `set_cooldown` adds once the run's length in steps is known."""
    return LearningRateSchedule(
        train["lr_schedule"],
        learning_rate,
        train["warmup_steps"],
        train["decay_steps"],
        train["decay_rate"],
    )
