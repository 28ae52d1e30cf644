"""RecurrentEncoder: shapes, source reversal, forget-gate bias. Masking, serialisation and
gradients: test_layer_harness."""

import numpy as np
import pytest

import layers

SOURCE = np.array([[5, 6, 7, 0, 0], [4, 5, 6, 7, 8], [9, 0, 0, 0, 0]], np.int32)


@pytest.mark.parametrize("cell_type", ["lstm", "gru", "simple_rnn"])
@pytest.mark.parametrize(
    "bidirectional,merge_mode,out_dim",
    [(False, "concat", 6), (True, "concat", 12), (True, "sum", 6)],
)
def test_shapes_and_states(cell_type, bidirectional, merge_mode, out_dim):
    encoder = layers.RecurrentEncoder(
        20,
        4,
        6,
        num_layers=2,
        cell_type=cell_type,
        bidirectional=bidirectional,
        merge_mode=merge_mode,
    )
    outputs, states, mask = encoder(SOURCE)
    assert outputs.shape == (3, 5, out_dim)
    assert encoder.output_dim == out_dim
    per_layer = 2 if cell_type == "lstm" else 1
    assert [[tuple(s.shape) for s in layer] for layer in states] == [[(3, out_dim)] * per_layer] * 2
    assert encoder.state_sizes == ((out_dim,) * per_layer,) * 2
    np.testing.assert_array_equal(mask, SOURCE != 0)
    out_shape, state_shapes, mask_shape = encoder.compute_output_shape((3, 5))
    assert out_shape == (3, 5, out_dim) and mask_shape == (3, 5)


def test_reverse_source_runs_the_recurrence_backwards_and_keeps_source_order():
    reversed_encoder = layers.RecurrentEncoder(20, 4, 6, reverse_source=True)
    outputs, states, _ = reversed_encoder(SOURCE)
    plain = layers.RecurrentEncoder(20, 4, 6)
    plain(SOURCE)
    plain.set_weights(reversed_encoder.get_weights())
    lengths = (SOURCE != 0).sum(1)
    manually_reversed = np.zeros_like(SOURCE)
    for i, n in enumerate(lengths):
        manually_reversed[i, :n] = SOURCE[i, :n][::-1]
    plain_outputs, plain_states, _ = plain(manually_reversed)
    for i, n in enumerate(lengths):
        np.testing.assert_allclose(
            np.asarray(outputs)[i, :n], np.asarray(plain_outputs)[i, :n][::-1], atol=1e-6
        )
    np.testing.assert_allclose(states[0][0], plain_states[0][0], atol=1e-6)


def test_lstm_forget_gate_bias_starts_at_one():
    encoder = layers.RecurrentEncoder(20, 4, 6, bidirectional=True)
    encoder(SOURCE)
    biases = [v.numpy() for v in encoder.weights if v.path.endswith("bias")]
    assert len(biases) == 2
    for bias in biases:  # Keras orders the LSTM gates i, f, c, o
        np.testing.assert_array_equal(bias[6:12], 1.0)
        np.testing.assert_array_equal(np.concatenate([bias[:6], bias[12:]]), 0.0)


def test_residual_and_dropout():
    encoder = layers.RecurrentEncoder(20, 4, 6, num_layers=3, residual=True, dropout=0.5)
    inference, _, _ = encoder(SOURCE, training=False)
    np.testing.assert_allclose(encoder(SOURCE, training=False)[0], inference)
    assert not np.allclose(encoder(SOURCE, training=True)[0], inference)


def test_output_dropout_drops_the_outputs_at_its_own_rate_and_nothing_else():
    encoder = layers.RecurrentEncoder(20, 4, 64, bidirectional=True, output_dropout=0.5)
    inference, inference_states, mask = encoder(SOURCE, training=False)
    training, training_states, _ = encoder(SOURCE, training=True)
    kept = np.asarray(training) != 0
    assert 0.4 < kept[np.asarray(mask)].mean() < 0.6
    np.testing.assert_allclose(np.asarray(training)[kept], 2 * np.asarray(inference)[kept], 1e-5)
    for inference_state, training_state in zip(inference_states[0], training_states[0]):
        np.testing.assert_allclose(training_state, inference_state, atol=1e-6)  # inputs kept
    assert layers.RecurrentEncoder.from_config(encoder.get_config()).output_dropout_rate == 0.5
    assert layers.RecurrentEncoder(20, 4, 6, dropout=0.3).output_dropout_rate == 0.3


def test_bad_arguments_are_refused():
    with pytest.raises(ValueError, match="cell_type"):
        layers.RecurrentEncoder(20, 4, 6, cell_type="transformer")
    with pytest.raises(ValueError, match="merge_mode"):
        layers.RecurrentEncoder(20, 4, 6, bidirectional=True, merge_mode="mul")
    with pytest.raises(ValueError, match="num_layers"):
        layers.RecurrentEncoder(20, 4, 6, num_layers=0)


def test_embeddings_start_at_unit_scale():
    encoder = layers.RecurrentEncoder(2000, 64, 6)
    decoder = layers.AttentionDecoder(2000, 64, 6, attention=None, input_feeding=False)
    encoder(SOURCE)
    decoder(SOURCE, np.zeros((3, 5, 6), "float32"))
    for layer in (encoder, decoder):
        assert 0.95 < float(np.std(layer.embedding.embeddings.numpy())) < 1.05
