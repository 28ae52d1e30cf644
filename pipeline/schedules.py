"""Learning-rate schedules with an optional linear warm-up."""

import keras
from keras import ops

KINDS = ("constant", "inverse_sqrt", "exponential")


@keras.saving.register_keras_serializable(package="seq2seq")
class LearningRateSchedule(keras.optimizers.schedules.LearningRateSchedule):
    """lr(step) = learning_rate * warmup(step) * decay(step).

    warmup rises linearly to 1 over `warmup_steps` (none if 0). decay is
    - "constant":     1
    - "inverse_sqrt": sqrt(warmup_steps / step) after the warm-up (Vaswani et al., 2017)
    - "exponential":  decay_rate ** (step / decay_steps)
    """

    def __init__(self, kind, learning_rate, warmup_steps=0, decay_steps=1000, decay_rate=0.5):
        if kind not in KINDS:
            raise ValueError(f"learning-rate schedule must be one of {KINDS}, got {kind!r}")
        self.kind = kind
        self.learning_rate = float(learning_rate)
        self.warmup_steps = int(warmup_steps)
        self.decay_steps = int(decay_steps)
        self.decay_rate = float(decay_rate)

    def __call__(self, step):
        step = ops.cast(step, "float32") + 1.0
        warmup = float(max(self.warmup_steps, 1))
        factor = ops.minimum(1.0, step / warmup)
        if self.kind == "inverse_sqrt":
            factor = factor * ops.sqrt(warmup / ops.maximum(step, warmup))
        elif self.kind == "exponential":
            factor = factor * ops.power(self.decay_rate, (step - 1.0) / self.decay_steps)
        return self.learning_rate * factor

    def get_config(self):
        return {
            "kind": self.kind,
            "learning_rate": self.learning_rate,
            "warmup_steps": self.warmup_steps,
            "decay_steps": self.decay_steps,
            "decay_rate": self.decay_rate,
        }
