"""A convolutional encoder for the recurrent attentional decoder: Gehring et al. (2017, "A
Convolutional Encoder Model for Neural Machine Translation") replace the bidirectional LSTM
with a stack of convolutions, which reads the source without a loop over time and so decodes
faster on a CPU. Each layer is a gated linear unit over a window of tokens (Dauphin et al.,
2017) with a residual connection scaled by sqrt(1/2), as in ConvS2S (Gehring et al., 2017b).
"""

import math

import keras
from keras import ops

from layers.positional_encoder import PositionalEncoder
from layers.special_tokens import PAD_ID


@keras.saving.register_keras_serializable(package="seq2seq")
class ConvolutionalEncoder(PositionalEncoder):
    """Embeds source tokens, adds sinusoidal positions and runs a stack of gated convolutions
    over them; in `RecurrentEncoder`'s place, with its outputs.

    The sinusoidal positions are scaled by a learned scalar (Li et al., 2019, "Neural Speech
    Synthesis with Transformer Network"), so that they learn their share of the input: small
    embeddings (U(-0.1, 0.1), as the recurrent recipes draw every weight) are not drowned.

    A convolution is one matrix product over each token's window (the token and its
    `kernel_size // 2` neighbours on each side, concatenated): exported models then quantise
    it as every other product. Padded positions are zeroed before each layer, so a source
    reads the same zeros past its end whether it is padded in a batch or alone.

    Args:
        vocab_size: source vocabulary size.
        model_dim: size of the embeddings and of every layer's output.
        num_layers: number of stacked convolutions; each widens what a token sees by
            `kernel_size - 1` tokens.
        kernel_size: tokens in a convolution's window (odd: centred on its token).
        dropout: dropout rate on the embeddings and on each convolution's input.
        pad_id: id of the padding token; padded positions are masked.

    Call and returns: as `PositionalEncoder`'s; the outputs are zero at padded positions.
    """

    def __init__(
        self,
        vocab_size,
        model_dim,
        num_layers=4,
        kernel_size=3,
        dropout=0.0,
        pad_id=PAD_ID,
        **kwargs,
    ):
        super().__init__(vocab_size, model_dim, dropout, pad_id, **kwargs)
        if int(num_layers) < 1:
            raise ValueError(f"num_layers must be at least 1, got {num_layers}")
        if int(kernel_size) < 1 or int(kernel_size) % 2 == 0:
            raise ValueError(f"kernel_size must be odd and positive, got {kernel_size}")
        self.num_layers = int(num_layers)
        self.kernel_size = int(kernel_size)
        # Each layer's two halves: the values and the gates of the gated linear unit.
        self.convolutions = [
            keras.layers.Dense(2 * self.model_dim, name=f"convolution_{i}")
            for i in range(self.num_layers)
        ]

    def build(self, source_ids_shape):
        super().build(source_ids_shape)
        self.position_scale = self.add_weight(shape=(), initializer="ones", name="position_scale")
        windows = (source_ids_shape[0], source_ids_shape[1], self.kernel_size * self.model_dim)
        for convolution in self.convolutions:
            convolution.build(windows)

    def _windows(self, x):
        """`[batch, src_len, kernel_size * model_dim]`: each token's window, zeros past the
        ends. Slices of constant bounds, so that an exported graph needs no shape arithmetic."""
        half = self.kernel_size // 2
        if not half:
            return x
        padded = ops.pad(x, ((0, 0), (half, half), (0, 0)))
        last = self.kernel_size - 1
        shifted = [padded[:, i : (i - last) or None] for i in range(self.kernel_size)]
        return ops.concatenate(shifted, axis=-1)

    def call(self, source_ids, training=None):
        x, mask = self.embed(source_ids, self.position_scale)
        real = ops.cast(mask, x.dtype)[:, :, None]
        x = x * real
        residual_scale = ops.cast(math.sqrt(0.5), x.dtype)
        for convolution in self.convolutions:
            values, gates = ops.split(
                convolution(self._windows(self.dropout(x, training=training))), 2, axis=-1
            )
            x = (x + values * ops.sigmoid(gates)) * residual_scale * real
        return self.outputs(x, mask)
