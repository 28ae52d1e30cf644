"""What the encoders without a loop over time share: token embeddings with sinusoidal positions
in, and the recurrent encoder's three outputs out."""

import keras
import keras_hub
from keras import ops

from layers.masking import sequence_mask
from layers.recorded_arguments import RecordsArguments
from layers.recurrent_layers import token_embedding
from layers.sixteen_bit_dropout import SixteenBitDropout
from layers.special_tokens import PAD_ID


class PositionalEncoder(RecordsArguments, keras.layers.Layer):
    """Base of `SelfAttentionEncoder` and `ConvolutionalEncoder`: embeds source tokens, adds
    sinusoidal positions (Vaswani et al., 2017), and returns what `RecurrentEncoder` returns.
    A subclass builds its own layers in `build` (after `super().build`) and reads the source in
    `call`, between `embed` and `outputs`.

    Args:
        vocab_size: source vocabulary size.
        model_dim: size of the embeddings and of the outputs.
        dropout: the subclass' dropout rate (`self.dropout`).
        pad_id: id of the padding token; padded positions are masked.

    Call:
        source_ids: int `[batch, src_len]`, right-padded with `pad_id`.

    Returns:
        outputs: `[batch, src_len, model_dim]`.
        final_states: one layer of one state, `((mean,),)`: the mean of the outputs over the
            real tokens, `[batch, model_dim]`, for the bridge to the decoder's initial state.
        mask: boolean `[batch, src_len]`, True at real tokens.

    `embed(source_ids, position_scale=None)`: `[batch, src_len, model_dim]` embeddings plus
    positions (times `position_scale`), and the boolean mask `[batch, src_len]`.
    `outputs(x, mask)`: the three outputs, for `x` and `mask`.
    """

    def __init__(self, vocab_size, model_dim, dropout=0.0, pad_id=PAD_ID, **kwargs):
        super().__init__(**kwargs)
        self.vocab_size = int(vocab_size)
        self.model_dim = int(model_dim)
        self.dropout_rate = float(dropout)
        self.pad_id = int(pad_id)
        # N(0, 1) like the recurrent encoder's: a decoder may share it, and unit-variance
        # inputs are what a Transformer's scaled N(0, 1/d) embedding gives too.
        self.embedding = token_embedding(vocab_size, model_dim)
        self.positions = keras_hub.layers.SinePositionEncoding(name="positions")
        self.dropout = SixteenBitDropout(self.dropout_rate)

    @property
    def output_dim(self):
        return self.model_dim

    @property
    def state_sizes(self):
        """Sizes of `final_states`: one layer of one state."""
        return ((self.model_dim,),)

    def build(self, source_ids_shape):
        if not self.embedding.built:  # a shared embedding is built once
            self.embedding.build(source_ids_shape)
        self.positions.build((source_ids_shape[0], source_ids_shape[1], self.model_dim))

    def embed(self, source_ids, position_scale=None):
        mask = sequence_mask(source_ids, self.pad_id)
        x = self.embedding(source_ids)
        positions = self.positions(x)
        if position_scale is not None:
            positions = positions * position_scale
        return x + ops.cast(positions, x.dtype), mask

    def outputs(self, x, mask):
        real = ops.cast(mask, x.dtype)[:, :, None]
        count = ops.maximum(ops.sum(real, axis=1), ops.cast(1, x.dtype))
        mean = ops.sum(x * real, axis=1) / count
        return x, ((mean,),), mask

    def compute_mask(self, source_ids, mask=None):
        return None

    def compute_output_shape(self, source_ids_shape):
        batch, length = source_ids_shape[0], source_ids_shape[1]
        return (batch, length, self.model_dim), (((batch, self.model_dim),),), (batch, length)
