"""SelfAttentionEncoder: shapes, the state the bridge reads, refused arguments. Masking,
serialisation and gradients: test_layer_harness."""

import numpy as np
import pytest

import layers

SOURCE = np.array([[5, 6, 7, 0, 0], [4, 5, 6, 7, 8], [9, 0, 0, 0, 0]], np.int32)


def test_shapes_and_the_mean_over_real_tokens():
    encoder = layers.SelfAttentionEncoder(20, 8, num_layers=2, num_heads=2, ffn_dim=16)
    outputs, states, mask = encoder(SOURCE)
    assert outputs.shape == (3, 5, 8) and encoder.output_dim == 8
    assert encoder.state_sizes == ((8,),)
    assert [[tuple(s.shape) for s in layer] for layer in states] == [[(3, 8)]]
    np.testing.assert_array_equal(mask, SOURCE != 0)
    outputs = np.asarray(outputs)
    for i, row in enumerate(SOURCE != 0):
        np.testing.assert_allclose(states[0][0][i], outputs[i][row].mean(0), atol=1e-6)
    assert encoder.compute_output_shape((3, 5)) == ((3, 5, 8), (((3, 8),),), (3, 5))


def test_pre_norm_outputs_are_normalised_and_post_norm_has_no_final_norm():
    pre_norm = layers.SelfAttentionEncoder(20, 8, num_heads=2, ffn_dim=16)
    outputs = np.asarray(pre_norm(SOURCE)[0])[SOURCE != 0]
    np.testing.assert_allclose(outputs.mean(-1), 0.0, atol=1e-5)
    np.testing.assert_allclose(outputs.std(-1), 1.0, atol=1e-2)
    post_norm = layers.SelfAttentionEncoder(20, 8, num_heads=2, normalize_first=False)
    assert post_norm.output_norm is None


def test_dropout_applies_in_training_only():
    encoder = layers.SelfAttentionEncoder(20, 8, num_heads=2, dropout=0.5)
    inference = encoder(SOURCE, training=False)[0]
    np.testing.assert_allclose(encoder(SOURCE, training=False)[0], inference)
    assert not np.allclose(encoder(SOURCE, training=True)[0], inference)


def test_bad_arguments_are_refused():
    with pytest.raises(ValueError, match="num_layers"):
        layers.SelfAttentionEncoder(20, 8, num_layers=0)
    with pytest.raises(ValueError, match="model_dim \\(8\\) must divide by num_heads \\(3\\)"):
        layers.SelfAttentionEncoder(20, 8, num_heads=3)
