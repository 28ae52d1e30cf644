"""Schedules for the probability of feeding the model its own prediction (Bengio et al., 2015)."""

import keras
from keras import ops

SCHEDULES = ("constant", "linear", "inverse_sigmoid")


@keras.saving.register_keras_serializable(package="seq2seq")
class SamplingSchedule:
    """Probability, at a training step, of replacing a ground-truth input token by a sample.

    Bengio et al. decay the teacher-forcing probability eps_i; the sampling probability is
    `probability * (1 - eps_i)`, where `probability` caps it:
    - "constant":        eps_i = 0, so the sampling probability is `probability` throughout.
    - "linear":          eps_i = max(0, 1 - i / decay_steps).
    - "inverse_sigmoid": eps_i = k / (k + exp(i / k)), with k = `decay_steps` (k >= 1).

    Args:
        schedule: "constant", "linear" or "inverse_sigmoid".
        probability: the largest sampling probability, in [0, 1].
        decay_steps: steps over which teacher forcing decays (linear), or k (inverse sigmoid).
    """

    def __init__(self, schedule="inverse_sigmoid", probability=0.25, decay_steps=1000):
        if schedule not in SCHEDULES:
            raise ValueError(f"schedule must be one of {SCHEDULES}, got {schedule!r}")
        if not 0.0 <= float(probability) <= 1.0:
            raise ValueError(f"sampling probability must be in [0, 1], got {probability}")
        if schedule == "linear" and float(decay_steps) <= 0:
            raise ValueError(f"decay_steps must be positive, got {decay_steps}")
        if schedule == "inverse_sigmoid" and float(decay_steps) < 1:
            raise ValueError(f"decay_steps (k) must be at least 1, got {decay_steps}")
        self.schedule = schedule
        self.probability = float(probability)
        self.decay_steps = float(decay_steps)

    def __call__(self, step):
        step = ops.cast(step, "float32")
        if self.schedule == "constant":
            teacher_forcing = ops.zeros_like(step)
        elif self.schedule == "linear":
            teacher_forcing = ops.maximum(0.0, 1.0 - step / self.decay_steps)
        else:
            k = self.decay_steps
            # k / (k + exp(i/k)) written as a sigmoid so that exp never overflows.
            teacher_forcing = ops.sigmoid(ops.log(k) - step / k)
        return self.probability * (1.0 - teacher_forcing)

    def get_config(self):
        return {
            "schedule": self.schedule,
            "probability": self.probability,
            "decay_steps": self.decay_steps,
        }

    @classmethod
    def from_config(cls, config):
        return cls(**config)
