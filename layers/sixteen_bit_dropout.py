"""Dropout that draws 16 random bits an element instead of a float32 uniform."""

import keras
import tensorflow as tf

DRAW_LEVELS = 1 << 16  # the values one element's random draw takes


def dropped_fraction(rate):
    """The fraction a `rate` drops: a multiple of 2^-16, the nearest to `rate`."""
    return round(rate * DRAW_LEVELS) / DRAW_LEVELS


@tf.custom_gradient
def _scaled_by_mask(x, mask):
    """`x * mask`; the gradient reuses the mask (Keras' dropout selects twice)."""
    return x * mask, lambda upstream: (upstream * mask, None)


def sixteen_bit_dropout(inputs, rate, seed, noise_shape=None):
    """`inputs` with each element (or each `noise_shape` slice) zeroed with probability
    `dropped_fraction(rate)` and the others scaled by the inverse of the kept fraction, so
    the expectation is unchanged (Srivastava et al., 2014).

    Philox gives 32 random bits a draw, which Keras' dropout spends on one float32 uniform
    an element; here each draw serves two elements, as signed 16-bit halves compared with a
    threshold, and the backward pass multiplies by the saved mask rather than selecting. On
    a CPU the random numbers are a large share of a Transformer's training step.

    Args:
        inputs: a float tensor, any shape.
        rate: the dropout rate in [0, 1).
        seed: a Keras `SeedGenerator` (each call advances it) or an int.
        noise_shape: the mask's shape, broadcast over `inputs` (None: the inputs' shape).
    """
    dropped = dropped_fraction(rate)
    if dropped == 0.0:
        return inputs
    shape = tf.shape(inputs)
    if noise_shape is not None:  # None entries take the inputs' sizes
        shape = tf.stack([shape[i] if n is None else n for i, n in enumerate(noise_shape)])
    size = tf.reduce_prod(shape)
    if isinstance(seed, keras.random.SeedGenerator):
        seed = seed.next()
    seed = tf.cast(seed if tf.is_tensor(seed) else [seed, 0], tf.int64)
    words = tf.random.stateless_uniform(
        [(size + 1) // 2], seed, minval=None, maxval=None, dtype=tf.int32
    )
    halves = tf.reshape(tf.bitcast(words, tf.int16), [-1])[:size]
    # A signed half is uniform over [-2^15, 2^15): the lowest `dropped` share is dropped.
    keep = tf.reshape(halves >= round(dropped * DRAW_LEVELS) - DRAW_LEVELS // 2, shape)
    mask = tf.cast(keep, inputs.dtype) * tf.cast(1.0 / (1.0 - dropped), inputs.dtype)
    return _scaled_by_mask(inputs, mask)


@keras.saving.register_keras_serializable(package="seq2seq")
class SixteenBitDropout(keras.layers.Dropout):
    """Keras' `Dropout` (same arguments, same random state, so a model saved with one loads
    with the other) computed by `sixteen_bit_dropout`: the rate is rounded to a multiple of
    2^-16, the masks differ from Keras' for the same seed.

    `[...]` -> `[...]`; identity outside training.
    """

    def call(self, inputs, training=False):
        if not training or self.rate == 0:
            return inputs
        return sixteen_bit_dropout(
            inputs, self.rate, self.seed_generator, noise_shape=self.noise_shape
        )

    @classmethod
    def adopt(cls, dropout):
        """Makes Keras' `Dropout` layer `dropout` one of these in place: the same object, with
        its random state and its place among its parent's layers, so a model whose layers build
        Keras dropouts of their own (keras-hub's) saves and loads as before."""
        if type(dropout) is not keras.layers.Dropout:
            raise TypeError(f"not a Keras Dropout: {type(dropout).__name__}")
        dropout.__class__ = cls
        return dropout
