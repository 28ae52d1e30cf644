"""`layers.SplitSinePositions`: Marian's layout is keras-hub's sinusoids with the features
permuted; fairseq's is the table M2M100 and NLLB compute (other frequencies, positions from
2), in float32 as they compute it. Masking, serialisation and steps: test_layer_harness."""

import math

import keras_hub
import numpy as np
import pytest

import layers

DIM = 16
LENGTH = 7


def encodings(layout, length=LENGTH, start_index=0):
    layer = layers.SplitSinePositions(max_positions=32, layout=layout)
    return np.asarray(layer(np.zeros((1, length, DIM), np.float32), start_index=start_index)[0])


def test_marians_layout_is_keras_hubs_sinusoids_with_the_sines_first():
    interleaved = np.asarray(
        keras_hub.layers.SinePositionEncoding()(np.zeros((1, LENGTH, DIM), np.float32))[0]
    )
    sines_first = np.concatenate([interleaved[:, 0::2], interleaved[:, 1::2]], axis=1)
    np.testing.assert_allclose(encodings("marian"), sines_first, atol=1e-6)


def test_fairseqs_layout_is_m2m100s_table_from_position_2():
    # fairseq's SinusoidalPositionalEmbedding.get_embedding, in float32 as it computes it;
    # a sequence's positions count from padding_idx + 1 = 2.
    half = DIM // 2
    rate = np.float32(math.log(10000) / (half - 1))
    frequencies = np.exp(np.arange(half, dtype=np.float32) * -rate)
    angles = np.arange(2, 2 + LENGTH, dtype=np.float32)[:, None] * frequencies[None, :]
    table = np.concatenate([np.sin(angles), np.cos(angles)], axis=1)
    np.testing.assert_array_equal(encodings("fairseq"), table)


@pytest.mark.parametrize("layout", ["marian", "fairseq"])
def test_a_step_reads_the_row_of_its_position(layout):
    whole = encodings(layout)
    np.testing.assert_array_equal(encodings(layout, length=1, start_index=3)[0], whole[3])


def test_an_unknown_layout_is_refused():
    with pytest.raises(ValueError, match="layout must be one of"):
        layers.SplitSinePositions(max_positions=8, layout="bert")
