"""A Transformer encoder for the recurrent attentional decoder: the source read without a loop
over time, as the fast students of Kim et al. (2019, "From Research to Production and Back:
Ludicrously Fast Neural Machine Translation") pair a Transformer encoder with a light
recurrent decoder."""

import keras

from layers.positional_encoder import PositionalEncoder
from layers.special_tokens import PAD_ID
from layers.transformer_encoder_layer import TransformerEncoderLayer


@keras.saving.register_keras_serializable(package="seq2seq")
class SelfAttentionEncoder(PositionalEncoder):
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

    Call and returns: as `PositionalEncoder`'s.
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
        super().__init__(vocab_size, model_dim, dropout, pad_id, **kwargs)
        if int(num_layers) < 1:
            raise ValueError(f"num_layers must be at least 1, got {num_layers}")
        if int(model_dim) % int(num_heads):
            raise ValueError(f"model_dim ({model_dim}) must divide by num_heads ({num_heads})")
        self.num_layers = int(num_layers)
        self.num_heads = int(num_heads)
        self.ffn_dim = int(ffn_dim)
        self.attention_dropout_rate = float(
            dropout if attention_dropout is None else attention_dropout
        )
        self.normalize_first = bool(normalize_first)
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

    def build(self, source_ids_shape):
        super().build(source_ids_shape)
        sequence = (source_ids_shape[0], source_ids_shape[1], self.model_dim)
        for layer in self.encoder_layers:
            layer.build(sequence)
        if self.output_norm is not None:
            self.output_norm.build(sequence)

    def call(self, source_ids, training=None):
        x, mask = self.embed(source_ids)
        x = self.dropout(x, training=training)
        for layer in self.encoder_layers:
            x = layer(x, padding_mask=mask, training=training)
        if self.output_norm is not None:
            x = self.output_norm(x)
        return self.outputs(x, mask)
