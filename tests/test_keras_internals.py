"""Each use of Keras' and keras-hub's private code (`layers/keras_internals.py`) still does
what the toolkit relies on: a test per use, so that an upgrade names what it broke."""

import types

import keras
import keras_hub
import numpy as np
import tensorflow as tf

from layers import keras_internals


def test_weights_are_saved_through_disk_in_the_block_and_memory_is_judged_after(
    tmp_path, monkeypatch
):
    """In the block, each weight reaches HDF5 as a view of its variable's buffer (no copy),
    and the file holds the same values; Keras' own judge and conversion are back after."""
    import h5py
    from keras.src.saving import saving_lib

    model = keras.Sequential([keras.Input((3,), dtype="int32"), keras.layers.Embedding(50, 4),
                              keras.layers.Dense(2)])  # fmt: skip
    buffers = [keras_internals.buffer_view(variable) for variable in model.weights]
    assert not any(buffer.flags.owndata for buffer in buffers)  # views, not copies
    assert all(np.shares_memory(keras_internals.buffer_view(v), b)
               for v, b in zip(model.weights, buffers))  # fmt: skip
    handed = []
    write = h5py.Group.__setitem__

    def recorded(group, name, value):
        handed.append(value)
        write(group, name, value)

    monkeypatch.setattr(h5py.Group, "__setitem__", recorded)
    judge, convert = saving_lib.is_memory_sufficient, saving_lib.backend.convert_to_numpy
    with keras_internals.weights_saved_through_disk():
        assert saving_lib.is_memory_sufficient(model) is False
        model.save(tmp_path / "model.keras")
    assert saving_lib.is_memory_sufficient is judge
    assert saving_lib.backend.convert_to_numpy is convert
    assert len(handed) == len(buffers)
    for value, buffer in zip(handed, buffers):
        assert np.shares_memory(value, buffer)
    reloaded = keras.models.load_model(tmp_path / "model.keras")
    for ours, theirs in zip(model.get_weights(), reloaded.get_weights()):
        np.testing.assert_array_equal(ours, theirs)


def test_a_replicas_loss_is_unscaled_by_the_number_of_replicas(monkeypatch):
    loss = tf.constant(1.5)
    assert float(keras_internals.unscale_loss_for_distribution(loss)) == 1.5
    monkeypatch.setattr(
        tf.distribute, "get_strategy", lambda: types.SimpleNamespace(num_replicas_in_sync=4)
    )
    assert float(keras_internals.unscale_loss_for_distribution(loss)) == 6.0


def test_the_loss_tracker_is_the_models_loss_metric():
    model = keras.Sequential([keras.Input((3,)), keras.layers.Dense(1)])
    model.compile(optimizer="sgd", loss="mse")
    tracker = keras_internals.loss_tracker(model)
    tracker.update_state(3.0, sample_weight=2.0)
    tracker.update_state(6.0, sample_weight=1.0)
    assert float(model.get_metrics_result()["loss"]) == 4.0


def test_variables_take_the_given_values_in_the_block_and_their_draws_elsewhere():
    def kernels_as_zeros(variable):
        return (lambda: tf.zeros(variable.shape)) if "kernel" in variable.path else None

    with keras_internals.variables_initialised_by(kernels_as_zeros):
        inside = keras.layers.Dense(3, kernel_initializer="ones", bias_initializer="ones")
        inside.build((None, 2))
    after = keras.layers.Dense(3, kernel_initializer="ones")
    after.build((None, 2))
    np.testing.assert_array_equal(inside.kernel.numpy(), np.zeros((2, 3)))
    np.testing.assert_array_equal(inside.bias.numpy(), np.ones(3))
    np.testing.assert_array_equal(after.kernel.numpy(), np.ones((2, 3)))


def test_an_encoders_sublayers_hold_all_its_weights():
    encoder = keras_hub.layers.TransformerEncoder(intermediate_dim=16, num_heads=2)
    encoder.build((None, None, 8))
    parts = keras_internals.encoder_sublayers(encoder)
    assert isinstance(parts.self_attention, keras.layers.MultiHeadAttention)
    assert parts.feedforward_intermediate.units == 16 and parts.feedforward_output.units == 8
    for norm in (parts.self_attention_norm, parts.feedforward_norm):
        assert isinstance(norm, keras.layers.LayerNormalization)
    for dropout in (parts.self_attention_dropout, parts.feedforward_dropout):
        assert isinstance(dropout, keras.layers.Dropout)
    held = {id(w) for part in parts for w in part.weights}
    assert held == {id(w) for w in encoder.weights}


def test_the_attention_weights_dropout_is_set_and_applies():
    attention = keras.layers.MultiHeadAttention(num_heads=2, key_dim=4, dropout=0.5, seed=1)
    x = tf.random.stateless_normal((2, 5, 8), seed=(1, 2))
    attention(x, x)
    keras_internals.set_attention_weights_dropout(attention, 0.0)
    assert keras_internals.attention_weights_dropout(attention).rate == 0.0
    np.testing.assert_allclose(attention(x, x, training=True), attention(x, x), atol=1e-6)
    keras_internals.set_attention_weights_dropout(attention, 0.5)
    assert not np.allclose(attention(x, x, training=True), attention(x, x), atol=1e-3)
