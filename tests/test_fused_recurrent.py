"""FusedGRU and FusedLSTM: the same outputs, states and gradients as Keras' GRU and LSTM, in
training and inference (in a loop of fewer operations)."""

import keras
import numpy as np
import pytest
import tensorflow as tf

from layers import FusedGRU, FusedLSTM

BATCH, LENGTH, FEATURES, UNITS = 5, 7, 6, 4
LENGTHS = np.array([7, 3, 1, 5, 6])
KINDS = {"gru": (keras.layers.GRU, FusedGRU, 1), "lstm": (keras.layers.LSTM, FusedLSTM, 2)}


@pytest.fixture(params=sorted(KINDS))
def kind(request):
    """Keras' layer, ours, and the number of state tensors."""
    return KINDS[request.param]


def twin_layers(rng, kind, **options):
    """A Keras layer and its fused twin of the same options and weights."""
    keras_class, fused_class, _ = kind
    keras_layer = keras_class(UNITS, return_sequences=True, return_state=True, **options)
    fused = fused_class(UNITS, return_sequences=True, return_state=True, **options)
    for layer in (keras_layer, fused):
        layer.build((BATCH, LENGTH, FEATURES))
    for a, b in zip(keras_layer.weights, fused.weights, strict=True):
        value = (0.5 * rng.normal(size=a.shape)).astype("float32")
        a.assign(value)
        b.assign(value)
    return keras_layer, fused


def initial_states(rng, kind):
    return [tf.constant(rng.normal(size=(BATCH, UNITS)).astype("float32")) for _ in range(kind[2])]


def outputs_and_gradients(layer, x, initial_state, mask, training):
    with tf.GradientTape() as tape:
        tape.watch([x, initial_state])
        outputs, *states = layer(x, initial_state=initial_state, mask=mask, training=training)
        # Weights that differ by position, unit and state, so that no error cancels out.
        loss = tf.reduce_sum(outputs * np.arange(1, UNITS + 1)) + sum(
            (n + 1) * tf.reduce_sum(state**2) for n, state in enumerate(states)
        )
    gradients = tape.gradient(loss, [x, initial_state, *layer.trainable_weights])
    return [outputs, *states, *tf.nest.flatten(gradients)]


@pytest.mark.parametrize("go_backwards", [False, True])
@pytest.mark.parametrize("zero_output_for_mask", [False, True])
@pytest.mark.parametrize("masked", [False, True])
def test_training_pass_equals_keras(rng, kind, go_backwards, zero_output_for_mask, masked):
    keras_layer, fused = twin_layers(rng, kind, go_backwards=go_backwards)
    for layer in (keras_layer, fused):
        layer.zero_output_for_mask = zero_output_for_mask
    assert fused._fused_applies()
    x = tf.constant(rng.normal(size=(BATCH, LENGTH, FEATURES)).astype("float32"))
    initial_state = initial_states(rng, kind)
    mask = np.arange(LENGTH)[None] < LENGTHS[:, None] if masked else None
    expected = outputs_and_gradients(keras_layer, x, initial_state, mask, training=True)
    actual = outputs_and_gradients(fused, x, initial_state, mask, training=True)
    for a, e in zip(actual, expected, strict=True):
        np.testing.assert_allclose(a, e, atol=2e-5)


def test_training_pass_in_a_compiled_function_equals_keras(rng, kind):
    keras_layer, fused = twin_layers(rng, kind)
    x = tf.constant(rng.normal(size=(BATCH, LENGTH, FEATURES)).astype("float32"))
    initial_state = initial_states(rng, kind)
    mask = tf.constant(np.arange(LENGTH)[None] < LENGTHS[:, None])

    def compiled(layer):
        return tf.function(lambda x: outputs_and_gradients(layer, x, initial_state, mask, True))

    for a, e in zip(compiled(fused)(x), compiled(keras_layer)(x), strict=True):
        np.testing.assert_allclose(a, e, atol=2e-5)


@pytest.mark.parametrize("go_backwards", [False, True])
@pytest.mark.parametrize("masked", [False, True])
def test_inference_equals_keras_in_a_loop_of_fewer_operations(rng, kind, go_backwards, masked):
    """Outside training the loop is `states_over_time`: Keras' outputs and states, with the
    input projection before the loop and no custom gradient."""
    keras_layer, fused = twin_layers(rng, kind, go_backwards=go_backwards)
    x = rng.normal(size=(BATCH, LENGTH, FEATURES)).astype("float32")
    mask = np.arange(LENGTH)[None] < LENGTHS[:, None] if masked else None
    for a, e in zip(fused(x, mask=mask), keras_layer(x, mask=mask), strict=True):
        np.testing.assert_allclose(a, e, atol=1e-5)

    def loop_operations(layer):
        graph = (
            tf.function(lambda x: layer(x, mask=mask))
            .get_concrete_function(tf.TensorSpec((None, None, FEATURES)))
            .graph
        )
        assert not any(op.type == "IdentityN" for op in graph.get_operations())
        (loop,) = [op for op in graph.get_operations() if op.type in ("While", "StatelessWhile")]
        body = graph._functions[loop.get_attr("body").name].graph
        return [op.type for op in body.get_operations()]

    fused_loop, keras_loop = loop_operations(fused), loop_operations(keras_layer)
    # One matrix product a step (the recurrent one) where Keras' loop has two.
    assert (fused_loop.count("MatMul"), keras_loop.count("MatMul")) == (1, 2)
    assert len(fused_loop) < len(keras_loop)


def test_mixed_precision_training_pass_is_close_to_float32(rng, kind):
    _, fused = twin_layers(rng, kind)
    half = kind[1](UNITS, return_sequences=True, return_state=True, dtype="mixed_bfloat16")
    half.build((BATCH, LENGTH, FEATURES))
    half.set_weights(fused.get_weights())
    x = rng.normal(size=(BATCH, LENGTH, FEATURES)).astype("float32")
    outputs, *_ = fused(x, training=True)
    half_outputs, *_ = half(x, training=True)
    assert half_outputs.dtype == tf.bfloat16
    np.testing.assert_allclose(tf.cast(half_outputs, "float32"), outputs, atol=0.05)


def test_other_forms_fall_back_to_keras(kind):
    fused_class = kind[1]
    assert not FusedGRU(UNITS, reset_after=False)._fused_applies()
    assert not fused_class(UNITS, recurrent_dropout=0.1)._fused_applies()
    assert not fused_class(UNITS, activation="relu")._fused_applies()
    assert not fused_class(UNITS, use_bias=False)._fused_applies()
    assert fused_class(UNITS)._fused_applies()
