"""A Transformer encoder for the recurrent attentional decoder: the source read without a loop
over time, as the fast students of Kim et al. (2019, "From Research to Production and Back:
Ludicrously Fast Neural Machine Translation") pair a Transformer encoder with a light
recurrent decoder."""

import keras
import keras_hub
from keras import ops

from layers.masking import sequence_mask
from layers.recurrent_layers import token_embedding
from layers.sixteen_bit_dropout import SixteenBitDropout
from layers.special_tokens import PAD_ID
from layers.transformer_encoder_layer import TransformerEncoderLayer


@keras.saving.register_keras_serializable(package="seq2seq")
class SelfAttentionEncoder(keras.layers.Layer):
    """Embeds source tokens, adds sinusoidal positions (Vaswani et al., 2017) and runs a stack
    of Transformer encoder layers over them; in `RecurrentEncoder`'s place, with its outputs.

    Args:
        vocab_size: source vocabulary size.
        model_dim: size of the embeddings and of every layer's output.
        num_layers: number of stacked layers.
        num_heads: self-attention heads (`model_dim` must divide by it).
        ffn_dim: hidden size of the position-wise feed-forward networks.
        dropout: dropout rate on the embeddings and after each sublayer.
        attention_dropout: dropout rate on the attention weights (None: `dropout`).
        normalize_first: pre-norm layers, and the stack's output normalised once; False:
            post-norm.
        pad_id: id of the padding token; padded positions are masked.

    Call:
        source_ids: int `[batch, src_len]`, right-padded with `pad_id`.

    Returns:
        outputs: `[batch, src_len, model_dim]`.
        final_states: one layer of one state, `((mean,),)`: the mean of the outputs over the
            real tokens, `[batch, model_dim]`, for the bridge to the decoder's initial state.
        mask: boolean `[batch, src_len]`, True at real tokens.
    """

    def __init__(
        self,
        vocab_size,
        model_dim,
        num_layers=1,
        num_heads=4,
        ffn_dim=1024,
        dropout=0.0,
        attention_dropout=None,
        normalize_first=True,
        pad_id=PAD_ID,
        **kwargs,
    ):
        super().__init__(**kwargs)
        if int(num_layers) < 1:
            raise ValueError(f"num_layers must be at least 1, got {num_layers}")
        if int(model_dim) % int(num_heads):
            raise ValueError(f"model_dim ({model_dim}) must divide by num_heads ({num_heads})")
        self.vocab_size = int(vocab_size)
        self.model_dim = int(model_dim)
        self.num_layers = int(num_layers)
        self.num_heads = int(num_heads)
        self.ffn_dim = int(ffn_dim)
        self.dropout_rate = float(dropout)
        self.attention_dropout_rate = float(
            dropout if attention_dropout is None else attention_dropout
        )
        self.normalize_first = bool(normalize_first)
        self.pad_id = int(pad_id)

        # N(0, 1) like the recurrent encoder's: a decoder may share it, and unit-variance
        # inputs are what a Transformer's scaled N(0, 1/d) embedding gives too.
        self.embedding = token_embedding(vocab_size, model_dim)
        self.positions = keras_hub.layers.SinePositionEncoding(name="positions")
        self.dropout = SixteenBitDropout(self.dropout_rate)
        self.encoder_layers = [
            TransformerEncoderLayer(
                self.ffn_dim,
                self.num_heads,
                attention_dropout=self.attention_dropout_rate,
                dropout=self.dropout_rate,
                normalize_first=self.normalize_first,
                name=f"layer_{i}",
            )
            for i in range(self.num_layers)
        ]
        # A pre-norm stack ends unnormalised.
        self.output_norm = (
            keras.layers.LayerNormalization(epsilon=1e-5, name="output_norm")
            if self.normalize_first
            else None
        )

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
        sequence = (source_ids_shape[0], source_ids_shape[1], self.model_dim)
        self.positions.build(sequence)
        for layer in self.encoder_layers:
            layer.build(sequence)
        if self.output_norm is not None:
            self.output_norm.build(sequence)

    def call(self, source_ids, training=None):
        mask = sequence_mask(source_ids, self.pad_id)
        x = self.embedding(source_ids)
        x = self.dropout(x + ops.cast(self.positions(x), x.dtype), training=training)
        for layer in self.encoder_layers:
            x = layer(x, padding_mask=mask, training=training)
        if self.output_norm is not None:
            x = self.output_norm(x)
        real = ops.cast(mask, x.dtype)[:, :, None]
        count = ops.maximum(ops.sum(real, axis=1), ops.cast(1, x.dtype))
        mean = ops.sum(x * real, axis=1) / count
        return x, ((mean,),), mask

    def compute_mask(self, source_ids, mask=None):
        return None

    def compute_output_shape(self, source_ids_shape):
        batch, length = source_ids_shape[0], source_ids_shape[1]
        return (batch, length, self.model_dim), (((batch, self.model_dim),),), (batch, length)

    def get_config(self):
        config = super().get_config()
        config.update(
            vocab_size=self.vocab_size,
            model_dim=self.model_dim,
            num_layers=self.num_layers,
            num_heads=self.num_heads,
            ffn_dim=self.ffn_dim,
            dropout=self.dropout_rate,
            attention_dropout=self.attention_dropout_rate,
            normalize_first=self.normalize_first,
            pad_id=self.pad_id,
        )
        return config
