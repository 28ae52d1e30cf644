"""Scheduled-sampling schedules, masked losses and metrics, the optimizer."""

import math

import keras
import numpy as np
import pytest
import tensorflow as tf

from layers.scheduled_sampling import SamplingSchedule
from layers.token_losses import (
    PROJECTION_CHUNK,
    Perplexity,
    TokenAccuracy,
    projected_token_cross_entropy,
    token_cross_entropy,
)
from pipeline.config import PROJECT_ROOT, load_config
from pipeline.training.optimizers import FusedAdam, make_optimizer


def test_constant_schedule():
    schedule = SamplingSchedule("constant", probability=0.3)
    assert float(schedule(0)) == pytest.approx(0.3)
    assert float(schedule(10_000)) == pytest.approx(0.3)


def test_linear_schedule_rises_to_its_cap():
    schedule = SamplingSchedule("linear", probability=0.5, decay_steps=100)
    assert float(schedule(0)) == pytest.approx(0.0)
    assert float(schedule(50)) == pytest.approx(0.25)
    assert float(schedule(100)) == pytest.approx(0.5)
    assert float(schedule(1_000)) == pytest.approx(0.5)


def test_inverse_sigmoid_schedule_follows_bengio():
    k = 50.0
    schedule = SamplingSchedule("inverse_sigmoid", probability=1.0, decay_steps=k)
    for step in (0, 100, 200, 500, 5_000):
        teacher_forcing = k / (k + math.exp(step / k)) if step / k < 700 else 0.0
        assert float(schedule(step)) == pytest.approx(1.0 - teacher_forcing, abs=1e-6)
    assert float(schedule(10**9)) == pytest.approx(1.0)


def test_schedule_config_round_trip_and_errors():
    schedule = SamplingSchedule("linear", probability=0.2, decay_steps=10)
    assert SamplingSchedule.from_config(schedule.get_config()).get_config() == schedule.get_config()
    with pytest.raises(ValueError, match="schedule"):
        SamplingSchedule("exponential")
    with pytest.raises(ValueError, match="probability"):
        SamplingSchedule("constant", probability=1.5)


def test_cross_entropy_ignores_padding_and_smooths():
    rng = np.random.default_rng(0)
    logits = rng.normal(size=(2, 3, 5)).astype("float32")
    labels = np.array([[1, 2, 0], [4, 0, 0]])
    mask = labels != 0
    loss, nll = token_cross_entropy(labels, logits, mask, label_smoothing=0.1)
    log_probs = logits - np.log(np.exp(logits).sum(-1, keepdims=True))
    expected_nll = -np.take_along_axis(log_probs, labels[..., None], -1)[..., 0] * mask
    np.testing.assert_allclose(nll, expected_nll, atol=1e-5)
    expected_loss = (0.9 * expected_nll - 0.1 * log_probs.mean(-1)) * mask
    np.testing.assert_allclose(loss, expected_loss, atol=1e-5)
    assert np.all(np.asarray(loss)[~mask] == 0)


def test_token_accuracy_and_perplexity_count_real_tokens_only():
    logits = np.zeros((1, 4, 5), "float32")
    logits[0, 0, 1] = logits[0, 1, 3] = logits[0, 2, 2] = 5.0
    labels = np.array([[1, 2, 2, 0]])
    mask = labels != 0
    accuracy = TokenAccuracy()
    accuracy.update_state(labels, logits, mask)
    assert float(accuracy.result()) == pytest.approx(2 / 3)
    perplexity = Perplexity()
    _, nll = token_cross_entropy(labels, logits, mask)
    perplexity.update_state(nll, mask)
    perplexity.update_state(nll, mask)
    assert float(perplexity.result()) == pytest.approx(math.exp(float(np.sum(nll)) / 3), rel=1e-5)


def test_smoothed_cross_entropy_gradient_is_softmax_minus_smoothed_target():
    rng = np.random.default_rng(1)
    logits = tf.constant(rng.normal(size=(2, 3, 7)).astype("float32"))
    labels = np.array([[1, 6, 0], [4, 2, 0]])
    mask = labels != 0
    with tf.GradientTape() as tape:
        tape.watch(logits)
        loss = tf.reduce_sum(token_cross_entropy(labels, logits, mask, label_smoothing=0.2)[0])
    gradient = tape.gradient(loss, logits)
    target = 0.8 * np.eye(7)[labels] + 0.2 / 7
    expected = (tf.nn.softmax(logits).numpy() - target) * mask[..., None]
    np.testing.assert_allclose(gradient.numpy(), expected, atol=1e-6)


def test_token_accuracy_is_the_argmax_hit_rate():
    rng = np.random.default_rng(2)
    logits = rng.normal(size=(4, 6, 9)).astype("float32")
    labels = rng.integers(1, 9, size=(4, 6))
    labels[:, :2] = logits[:, :2].argmax(-1)  # some hits for certain
    mask = rng.random((4, 6)) < 0.7
    accuracy = TokenAccuracy()
    accuracy.update_state(labels, logits, mask)
    expected = (logits.argmax(-1) == labels)[mask].mean()
    assert float(accuracy.result()) == pytest.approx(expected)


@pytest.mark.parametrize(
    "positions, label_smoothing",
    [(0, 0.1), (5, 0.0), (PROJECTION_CHUNK, 0.1), (PROJECTION_CHUNK * 2 + 37, 0.2)],
)
def test_projected_cross_entropy_is_the_plain_one_of_the_projected_logits(
    positions, label_smoothing
):
    """Chunked (none, one partial, one whole, several with a partial last): the same sums,
    hits and gradients as the plain loss on the whole logits matrix."""
    rng = np.random.default_rng(positions)
    features = tf.constant(rng.normal(size=(positions, 16)), tf.float32)
    kernel = tf.constant(rng.normal(size=(16, 50)), tf.float32)
    labels = rng.integers(0, 50, positions)
    labels[:3] = (features.numpy() @ kernel.numpy())[:3].argmax(-1)  # some hits for certain
    with tf.GradientTape(persistent=True) as tape:
        tape.watch([features, kernel])
        loss_sum, nll_sum, hits = projected_token_cross_entropy(
            features, labels, kernel, label_smoothing
        )
        logits = (features @ kernel)[None]
        losses, nll = token_cross_entropy(
            labels[None], logits, np.ones((1, positions), bool), label_smoothing
        )
        expected_loss = tf.reduce_sum(losses)
    np.testing.assert_allclose(loss_sum, expected_loss, rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(nll_sum, np.sum(nll), rtol=1e-5, atol=1e-5)
    assert float(hits) == np.sum(logits.numpy()[0].argmax(-1) == labels)
    for ours, plain in zip(
        tape.gradient(loss_sum, [features, kernel]),
        tape.gradient(expected_loss, [features, kernel]),
    ):
        np.testing.assert_allclose(ours, plain, atol=1e-5)


def _adam_steps(optimizer, weights, batches):
    """`weights` after one step of `optimizer` per batch of ids (gathered rows @ a matrix)."""
    embedding, dense = (keras.Variable(w) for w in weights)

    @tf.function
    def step(ids):
        with tf.GradientTape() as tape:
            loss = tf.reduce_sum(tf.square(tf.gather(embedding, ids) @ dense - 1.0))
        gradients = tape.gradient(loss, [embedding, dense])
        optimizer.apply_gradients(zip(gradients, [embedding, dense], strict=True))

    for ids in batches:
        step(tf.constant(ids))
    return [embedding.numpy(), dense.numpy()]


@pytest.mark.parametrize("beta_2", [0.999, 0.98])
def test_fused_adam_updates_as_keras_adam(beta_2):
    """Sparse (embedding) and dense gradients, clipped, over 20 steps: the same weights."""
    init = np.random.default_rng(0).normal(size=(50, 8)).astype("float32")
    weights = [init, init[:8]]
    batches = [np.random.default_rng(i).integers(0, 50, 16) for i in range(20)]
    options = dict(beta_2=beta_2, global_clipnorm=1.0)
    expected = _adam_steps(keras.optimizers.Adam(1e-2, **options), weights, batches)
    fused = _adam_steps(FusedAdam(1e-2, **options), weights, batches)
    assert not np.allclose(expected[0], init, atol=0.05)  # the steps moved the weights
    for expected_weights, fused_weights in zip(expected, fused, strict=True):
        np.testing.assert_allclose(fused_weights, expected_weights, atol=1e-5)


def test_the_optimizer_takes_the_configured_beta_2():
    train = load_config(PROJECT_ROOT / "configs" / "smoke.yaml")["train"]
    assert make_optimizer(train).beta_2 == 0.999  # Keras' default, unless configured
    assert make_optimizer({**train, "adam_beta2": 0.98}).beta_2 == 0.98


@pytest.mark.parametrize("normalization,count", [("tokens", 9), ("sentences", 3)])
def test_the_training_loss_is_the_loss_sum_over_the_batch_tokens_or_sentences(normalization, count):
    from pipeline.model_types.builder import build_model

    config = load_config(PROJECT_ROOT / "configs" / "smoke.yaml")
    model = build_model(config, 50, 50, for_training=True)
    model.loss_normalization = normalization
    targets = np.array([[5, 6, 2, 0], [7, 2, 0, 0], [8, 9, 10, 2]])  # 9 tokens, 3 sentences
    logits = tf.random.stateless_normal([3, 4, 50], seed=(1, 2))
    loss_sum, tokens = model.token_loss(targets, logits)
    assert float(tokens) == 9
    loss = model.compute_loss(y=targets, y_pred=logits)
    np.testing.assert_allclose(float(loss), float(loss_sum) / count, rtol=1e-6)
