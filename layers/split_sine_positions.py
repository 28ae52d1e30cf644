"""Sinusoidal positions with the sines in the first half of the features and the cosines in
the second, as Marian (Junczys-Dowmunt et al., 2018) lays them out."""

import keras
import numpy as np
from keras import ops


def split_sine_table(max_positions, dim, max_wavelength=10000.0):
    """float32 `[max_positions, dim]`: row p holds sin(p * w_j) for every frequency w_j, then
    cos(p * w_j), where w_j = max_wavelength ** (-2j / dim): the frequencies of Vaswani et al.
    (2017), computed in float64 and rounded once, as Marian's checkpoints' tables are."""
    positions = np.arange(max_positions, dtype=np.float64)[:, None]
    frequencies = max_wavelength ** (-2.0 * np.arange((dim + 1) // 2, dtype=np.float64) / dim)
    angles = positions * frequencies[None, :]
    return np.concatenate([np.sin(angles), np.cos(angles)], axis=1)[:, :dim].astype(np.float32)


@keras.saving.register_keras_serializable(package="seq2seq")
class SplitSinePositions(keras.layers.Layer):
    """A fixed (untrained) table of sinusoidal position encodings in Marian's layout: the same
    values as keras-hub's `SinePositionEncoding`, whose sines and cosines interleave, with the
    features permuted. Positions count from `start_index` (0 for a whole sequence, the step
    for incremental decoding).

    `[batch, length, dim]` -> the encodings of positions start_index ... start_index + length
    - 1, broadcast to `[batch, length, dim]`. The inputs give only the shape.

    Args:
        max_positions: the longest sequence covered; a position beyond it is an error of the
            caller (the configuration checks the length limits against it).
    """

    def __init__(self, max_positions, **kwargs):
        super().__init__(**kwargs)
        self.max_positions = int(max_positions)
        self.table = None

    def build(self, inputs_shape):
        self.table = split_sine_table(self.max_positions, inputs_shape[-1])

    def call(self, inputs, start_index=0):
        shape = ops.shape(inputs)
        positions = ops.arange(shape[-2]) + ops.cast(start_index, "int32")
        table = ops.convert_to_tensor(self.table, dtype=self.compute_dtype)
        return ops.broadcast_to(ops.take(table, positions, axis=0), shape)

    def compute_output_shape(self, inputs_shape):
        return inputs_shape

    def get_config(self):
        config = super().get_config()
        config.update(max_positions=self.max_positions)
        return config
