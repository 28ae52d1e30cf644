"""One Transformer encoder layer whose attention weights have a dropout rate of their own."""

import keras
import keras_hub

from layers.keras_internals import (
    attention_weights_dropout,
    encoder_sublayers,
    set_attention_weights_dropout,
)
from layers.recorded_arguments import RecordsArguments
from layers.sixteen_bit_dropout import SixteenBitDropout


@keras.saving.register_keras_serializable(package="seq2seq")
class TransformerEncoderLayer(RecordsArguments, keras_hub.layers.TransformerEncoder):
    """keras-hub's `TransformerEncoder` (self-attention and a position-wise feed-forward
    network, each in a residual connection with layer normalisation), with the dropout on
    the attention weights set apart from the dropout after each sublayer, as fairseq's
    `attention_dropout` and OpenNMT-tf's are. keras-hub gives both one rate.

    `[batch, src_len, dim]` -> `[batch, src_len, dim]`; `padding_mask` `[batch, src_len]`.

    Args:
        intermediate_dim, num_heads, dropout, normalize_first, ...: see keras-hub's
            `TransformerEncoder`; `dropout` applies after each sublayer.
        attention_dropout: dropout rate on the attention weights (None: `dropout`).
    """

    def __init__(self, intermediate_dim, num_heads, attention_dropout=None, **kwargs):
        super().__init__(intermediate_dim, num_heads, **kwargs)
        self.attention_dropout = float(
            self.dropout if attention_dropout is None else attention_dropout
        )

    def build(self, inputs_shape):
        # keras-hub builds each dropout at its one rate, and a Keras dropout built at 0 has no
        # random state: build them at the higher rate, then give each its own.
        sublayer_dropout = self.dropout
        self.dropout = max(sublayer_dropout, self.attention_dropout)
        super().build(inputs_shape)
        self.dropout = sublayer_dropout
        parts = encoder_sublayers(self)
        parts.self_attention_dropout.rate = parts.feedforward_dropout.rate = sublayer_dropout
        set_attention_weights_dropout(parts.self_attention, self.attention_dropout)
        for dropout in (parts.self_attention_dropout, parts.feedforward_dropout,
                        attention_weights_dropout(parts.self_attention)):  # fmt: skip
            SixteenBitDropout.adopt(dropout)
