"""Sinusoidal positions with the sines in the first half of the features and the cosines in
the second, as Marian (Junczys-Dowmunt et al., 2018) and fairseq (Ott et al., 2019; the
M2M100 and NLLB models) lay them out."""

import keras
import numpy as np
from keras import ops

from layers.recorded_arguments import RecordsArguments

# layout: (the divisor d of the frequencies w_j = max_wavelength ** (-j / d) over the dim / 2
# sines, as a function of dim; the position of a sequence's first token; the precision the
# table is computed in, as the checkpoints' own code computes it).
LAYOUTS = {
    "marian": (lambda dim: dim / 2, 0, np.float64),
    # fairseq's SinusoidalPositionalEmbedding: positions count from padding_idx + 1 = 2.
    "fairseq": (lambda dim: dim / 2 - 1, 2, np.float32),
}


def split_sine_table(positions, dim, layout="marian", max_wavelength=10000.0):
    """float32 `[positions, dim]`: row p holds sin(p * w_j) for every frequency w_j, then
    cos(p * w_j) (an odd dim's last feature: 0), with the frequencies and precision of
    `layout`."""
    divisor, _, dtype = LAYOUTS[layout]
    rate = dtype(np.log(max_wavelength) / divisor(dim))
    frequencies = np.exp(np.arange(dim // 2).astype(dtype) * -rate)
    angles = np.arange(positions).astype(dtype)[:, None] * frequencies[None, :]
    table = np.zeros((positions, dim), dtype)
    table[:, : dim // 2] = np.sin(angles)
    table[:, dim // 2 : 2 * (dim // 2)] = np.cos(angles)
    return table.astype(np.float32)


@keras.saving.register_keras_serializable(package="seq2seq")
class SplitSinePositions(RecordsArguments, keras.layers.Layer):
    """A fixed (untrained) table of sinusoidal position encodings, sines first. "marian": the
    values of keras-hub's `SinePositionEncoding`, whose sines and cosines interleave, with the
    features permuted, positions from 0; "fairseq": other frequencies, positions from 2.
    Positions count on from `start_index` (0 for a whole sequence, the step for incremental
    decoding).

    `[batch, length, dim]` -> the encodings of the sequence's positions start_index ...
    start_index + length - 1, broadcast to `[batch, length, dim]`. The inputs give only the
    shape.

    Args:
        max_positions: the longest sequence covered; a position beyond it is an error of the
            caller (the configuration checks the length limits against it).
        layout: "marian" or "fairseq" (`LAYOUTS`).
    """

    def __init__(self, max_positions, layout="marian", **kwargs):
        super().__init__(**kwargs)
        if layout not in LAYOUTS:
            raise ValueError(f"layout must be one of {tuple(LAYOUTS)}, got {layout!r}")
        self.max_positions = int(max_positions)
        self.layout = layout
        self.table = None

    def build(self, inputs_shape):
        first = LAYOUTS[self.layout][1]
        self.table = split_sine_table(first + self.max_positions, inputs_shape[-1],
                                      self.layout)[first:]  # fmt: skip

    def call(self, inputs, start_index=0):
        shape = ops.shape(inputs)
        positions = ops.arange(shape[-2]) + ops.cast(start_index, "int32")
        table = ops.convert_to_tensor(self.table, dtype=self.compute_dtype)
        return ops.broadcast_to(ops.take(table, positions, axis=0), shape)

    def compute_output_shape(self, inputs_shape):
        return inputs_shape
