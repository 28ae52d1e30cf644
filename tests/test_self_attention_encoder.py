"""SelfAttentionEncoder: its output norm, refused arguments. Shapes, the state the bridge reads
and dropout: test_positional_encoders; masking, serialisation and gradients:
test_layer_harness."""

import numpy as np
import pytest

import layers

SOURCE = np.array([[5, 6, 7, 0, 0], [4, 5, 6, 7, 8], [9, 0, 0, 0, 0]], np.int32)


def test_pre_norm_outputs_are_normalised_and_post_norm_has_no_final_norm():
    pre_norm = layers.SelfAttentionEncoder(20, 8, num_heads=2, ffn_dim=16)
    outputs = np.asarray(pre_norm(SOURCE)[0])[SOURCE != 0]
    np.testing.assert_allclose(outputs.mean(-1), 0.0, atol=1e-5)
    np.testing.assert_allclose(outputs.std(-1), 1.0, atol=1e-2)
    post_norm = layers.SelfAttentionEncoder(20, 8, num_heads=2, normalize_first=False)
    assert post_norm.output_norm is None


def test_bad_arguments_are_refused():
    with pytest.raises(ValueError, match="num_layers"):
        layers.SelfAttentionEncoder(20, 8, num_layers=0)
    with pytest.raises(ValueError, match="model_dim \\(8\\) must divide by num_heads \\(3\\)"):
        layers.SelfAttentionEncoder(20, 8, num_heads=3)
