"""`layers.SixteenBitDropout`: the fraction it drops, its scaling, its gradient, its seeds."""

import re

import keras_hub
import numpy as np
import pytest
import tensorflow as tf

import layers
from layers.sixteen_bit_dropout import dropped_fraction, sixteen_bit_dropout


def test_the_rate_is_rounded_to_a_multiple_of_two_to_the_minus_sixteen():
    assert dropped_fraction(0.3) == 19661 / 65536
    assert dropped_fraction(0.5) == 0.5
    assert dropped_fraction(1e-6) == 0.0
    x = tf.ones([1000])
    assert sixteen_bit_dropout(x, 1e-6, seed=1) is x


@pytest.mark.parametrize("rate", [0.1, 0.3, 0.5])
def test_it_drops_the_rate_and_keeps_the_expectation(rate):
    x = tf.ones([1_000_001])  # an odd size: the last 32-bit draw serves one element
    y = sixteen_bit_dropout(x, rate, seed=34).numpy()
    kept = y != 0
    # 1e6 Bernoulli draws: 5 standard deviations are below 0.0025.
    assert abs(kept.mean() - (1 - rate)) < 0.0025
    np.testing.assert_allclose(y[kept], 1 / (1 - dropped_fraction(rate)), rtol=1e-6)
    assert abs(y.mean() - 1.0) < 0.005


def test_the_gradient_is_the_mask_the_forward_pass_applied():
    x = tf.random.stateless_normal([64, 33], seed=(1, 2))
    upstream = tf.random.stateless_normal([64, 33], seed=(5, 6))
    with tf.GradientTape() as tape:
        tape.watch(x)
        y = sixteen_bit_dropout(x, 0.3, seed=78)
        loss = tf.reduce_sum(y * upstream)
    gradient = tape.gradient(loss, x).numpy()
    mask = (y / x).numpy()
    np.testing.assert_allclose(gradient, upstream.numpy() * mask, rtol=1e-5, atol=1e-6)


def test_a_seed_gives_one_mask_and_another_seed_another():
    x = tf.ones([4096])
    first, again, other = (sixteen_bit_dropout(x, 0.3, seed=seed).numpy() for seed in (12, 12, 13))
    np.testing.assert_array_equal(first, again)
    assert (first != other).mean() > 0.2


def test_a_noise_shape_drops_whole_slices():
    x = tf.ones([8, 5, 16])
    y = sixteen_bit_dropout(x, 0.5, seed=11, noise_shape=(None, 1, 16)).numpy()
    np.testing.assert_array_equal(y, np.broadcast_to(y[:, :1], y.shape))
    assert 0 < (y == 0).mean() < 1


def test_the_layer_drops_in_training_only_and_draws_new_masks_each_call():
    layer = layers.SixteenBitDropout(0.4, seed=9)
    x = np.ones((16, 64), "float32")
    np.testing.assert_array_equal(layer(x), x)
    first, second = (np.asarray(layer(x, training=True)) for _ in range(2))
    assert 0.3 < (first == 0).mean() < 0.5
    assert not np.array_equal(first, second)


def test_bfloat16_inputs_keep_their_dtype():
    x = tf.ones([256, 8], tf.bfloat16)
    y = sixteen_bit_dropout(x, 0.25, seed=22)
    assert y.dtype == tf.bfloat16
    values = tf.cast(y, tf.float32).numpy()
    np.testing.assert_allclose(values[values != 0], 4 / 3, rtol=1e-2)


def test_keras_hub_dropouts_are_adopted_in_place():
    """keras-hub's encoder layer builds Keras dropouts of its own: they become
    `SixteenBitDropout`s without changing the layer's sublayers or variables."""
    ours = layers.TransformerEncoderLayer(16, 2, dropout=0.1)
    theirs = keras_hub.layers.TransformerEncoder(16, 2, dropout=0.1)
    for layer in (ours, theirs):
        layer.build((None, None, 8))
    dropouts = (ours._self_attention_dropout, ours._feedforward_dropout,
                ours._self_attention_layer._dropout_layer)  # fmt: skip
    assert all(type(d) is layers.SixteenBitDropout for d in dropouts)
    assert ours._feedforward_dropout in ours._layers

    def variable_paths(layer):  # below the layer's own name, without unique-name counters
        return [re.sub(r"_\d+", "", v.path.split("/", 1)[1]) for v in layer.variables]

    assert variable_paths(ours) == variable_paths(theirs)
    with pytest.raises(TypeError, match="not a Keras Dropout"):
        layers.SixteenBitDropout.adopt(ours._feedforward_dropout)
