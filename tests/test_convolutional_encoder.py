"""ConvolutionalEncoder: zeros at padding, how far a token sees, a source alone against padded
in a batch, refused arguments. Shapes, the state the bridge reads and dropout:
test_positional_encoders; masking, serialisation and gradients: test_layer_harness."""

import numpy as np
import pytest

import layers

SOURCE = np.array([[5, 6, 7, 0, 0], [4, 5, 6, 7, 8], [9, 0, 0, 0, 0]], np.int32)


def test_outputs_are_zero_at_padding():
    outputs = np.asarray(layers.ConvolutionalEncoder(20, 8, num_layers=2)(SOURCE)[0])
    np.testing.assert_array_equal(outputs[SOURCE == 0], 0.0)


@pytest.mark.parametrize("num_layers, kernel_size", [(1, 3), (2, 3), (1, 5), (3, 1)])
def test_a_token_sees_layers_times_half_the_window_on_each_side(num_layers, kernel_size):
    """Changing token j changes output i exactly where |i - j| <= num_layers * (k // 2)."""
    encoder = layers.ConvolutionalEncoder(50, 8, num_layers=num_layers, kernel_size=kernel_size)
    source = np.arange(1, 12, dtype=np.int32)[None]
    changed = source.copy()
    changed[0, 5] = 40
    moved = np.abs(np.asarray(encoder(changed)[0] - encoder(source)[0])).max(-1)[0]
    reach = num_layers * (kernel_size // 2)
    seen = np.abs(np.arange(11) - 5) <= reach
    assert (moved[seen] > 1e-6).all() and (moved[~seen] == 0).all()


def test_a_source_alone_gives_what_it_gives_padded_in_a_batch():
    encoder = layers.ConvolutionalEncoder(20, 8, num_layers=3, kernel_size=5)
    batched = np.asarray(encoder(SOURCE)[0])
    for row, ids in enumerate(SOURCE):
        alone = np.asarray(encoder(ids[ids != 0][None])[0])[0]
        np.testing.assert_allclose(batched[row][: len(alone)], alone, atol=1e-6)


def test_bad_arguments_are_refused():
    with pytest.raises(ValueError, match="num_layers"):
        layers.ConvolutionalEncoder(20, 8, num_layers=0)
    with pytest.raises(ValueError, match="kernel_size must be odd and positive, got 4"):
        layers.ConvolutionalEncoder(20, 8, kernel_size=4)
