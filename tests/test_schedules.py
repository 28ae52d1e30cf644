"""The learning-rate schedules: warm-up, decay and the cool-down that ends a run."""

import numpy as np
import pytest
import tensorflow as tf

from pipeline.training.schedules import LearningRateSchedule


def rates(schedule, steps):
    """The learning rate of each optimizer iteration in `steps` (0 is the first update)."""
    return np.array([float(schedule(step)) for step in steps])


def test_inverse_sqrt_rises_linearly_then_falls_as_the_inverse_square_root():
    schedule = LearningRateSchedule("inverse_sqrt", 0.005, warmup_steps=100)
    np.testing.assert_allclose(rates(schedule, [0, 49, 99]), [0.005 / 100, 0.0025, 0.005])
    np.testing.assert_allclose(rates(schedule, [399, 9999]), [0.0025, 0.0005], rtol=1e-6)


def test_the_cooldown_falls_linearly_to_zero_at_the_runs_last_step():
    plain = LearningRateSchedule("inverse_sqrt", 0.005, warmup_steps=100)
    cooled = LearningRateSchedule("inverse_sqrt", 0.005, warmup_steps=100)
    cooled.set_cooldown(cooldown_steps=200, end_step=1000)
    before = range(0, 801, 50)  # up to iteration 800, the cool-down's first update
    np.testing.assert_allclose(rates(cooled, before), rates(plain, before), rtol=1e-6)
    during = np.arange(800, 1000)
    factor = rates(cooled, during) / rates(plain, during)
    np.testing.assert_allclose(factor, (1000 - during) / 200, rtol=1e-5)
    assert factor[-1] == pytest.approx(1 / 200)  # the last update still moves the weights
    assert float(cooled(1000)) == 0.0 and float(cooled(5000)) == 0.0


def test_a_constant_rate_with_a_cooldown_is_warmup_stable_decay():
    schedule = LearningRateSchedule("constant", 0.001, warmup_steps=10)
    schedule.set_cooldown(cooldown_steps=50, end_step=100)
    np.testing.assert_allclose(rates(schedule, [9, 30, 50, 75, 99]), [1e-3, 1e-3, 1e-3, 5e-4, 2e-5])


def test_a_cooldown_without_the_runs_length_is_refused():
    with pytest.raises(ValueError, match="end_step"):
        LearningRateSchedule("constant", 0.001, cooldown_steps=10)(0)


def test_the_schedule_serialises_with_its_cooldown():
    schedule = LearningRateSchedule("exponential", 0.01, 5, decay_steps=20, decay_rate=0.5)
    schedule.set_cooldown(30, 90)
    copy = LearningRateSchedule.from_config(schedule.get_config())
    steps = [0, 4, 30, 60, 75, 89]
    np.testing.assert_allclose(rates(copy, steps), rates(schedule, steps))


def test_a_traced_step_sees_a_cooldown_set_after_tracing():
    """A time budget decides the cool-down mid-run, after the training step was traced."""
    schedule = LearningRateSchedule("constant", 0.001)
    rate = tf.function(schedule.__call__)
    assert float(rate(tf.constant(80))) == pytest.approx(1e-3)
    schedule.set_cooldown(cooldown_steps=50, end_step=100)
    assert float(rate(tf.constant(80))) == pytest.approx(1e-3 * 20 / 50)
