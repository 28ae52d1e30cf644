"""What the encoders without a loop over time share (`PositionalEncoder`): shapes, the state
the bridge reads, dropout in training only. Masking, serialisation and gradients:
test_layer_harness; each encoder's own properties: its test module."""

import numpy as np
import pytest

import layers

SOURCE = np.array([[5, 6, 7, 0, 0], [4, 5, 6, 7, 8], [9, 0, 0, 0, 0]], np.int32)
ENCODERS = {
    "self_attention": lambda **options: layers.SelfAttentionEncoder(
        20, 8, num_layers=2, num_heads=2, ffn_dim=16, **options
    ),
    "convolutional": lambda **options: layers.ConvolutionalEncoder(
        20, 8, num_layers=2, kernel_size=3, **options
    ),
}


@pytest.fixture(params=sorted(ENCODERS))
def make_encoder(request):
    return ENCODERS[request.param]


def test_shapes_and_the_mean_over_real_tokens(make_encoder):
    encoder = make_encoder()
    outputs, states, mask = encoder(SOURCE)
    assert outputs.shape == (3, 5, 8) and encoder.output_dim == 8
    assert encoder.state_sizes == ((8,),)
    assert [[tuple(s.shape) for s in layer] for layer in states] == [[(3, 8)]]
    np.testing.assert_array_equal(mask, SOURCE != 0)
    outputs = np.asarray(outputs)
    for i, row in enumerate(SOURCE != 0):
        np.testing.assert_allclose(states[0][0][i], outputs[i][row].mean(0), atol=1e-6)
    assert encoder.compute_output_shape((3, 5)) == ((3, 5, 8), (((3, 8),),), (3, 5))


def test_dropout_applies_in_training_only(make_encoder):
    encoder = make_encoder(dropout=0.5)
    inference = encoder(SOURCE, training=False)[0]
    np.testing.assert_allclose(encoder(SOURCE, training=False)[0], inference)
    assert not np.allclose(encoder(SOURCE, training=True)[0], inference)
