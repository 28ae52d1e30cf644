"""One Transformer decoder layer, for teacher forcing and for incremental decoding."""

import keras

from layers.causal_self_attention import CausalSelfAttention
from layers.multi_head_cross_attention import MultiHeadCrossAttention
from layers.recorded_arguments import RecordsArguments
from layers.sixteen_bit_dropout import SixteenBitDropout


@keras.saving.register_keras_serializable(package="seq2seq")
class TransformerDecoderLayer(RecordsArguments, keras.layers.Layer):
    """Causal self-attention, cross-attention to the encoder memory and a position-wise
    feed-forward network, each wrapped in a residual connection and layer normalisation
    (Vaswani et al., 2017). With `normalize_first` the normalisation comes before each
    sublayer (pre-norm, which trains stably without a long warm-up); otherwise after the
    residual sum, as in the original paper.

    keras-hub's `TransformerDecoder` returns no cross-attention weights and keeps its caches
    per hypothesis; this layer returns the weights (averaged over heads, for alignments and
    unknown-word replacement) and shares the encoder's cross-attention keys and values among
    a source's beams (see `MultiHeadCrossAttention`).

    Teacher forcing: `call(x, memory_cache, memory_mask)` with `x` `[batch, tgt_len, dim]` ->
    (`[batch, tgt_len, dim]`, weights `[batch, tgt_len, src_len]`).
    Decoding: `step(x, cache, memory_cache, memory_mask)` with `x` `[batch * k, dim]` ->
    (`[batch * k, dim]`, cache, weights `[batch * k, src_len]`), where `cache` comes from
    `initial_cache` and `memory_cache` from `precompute(memory)`.

    Args (the first two in the order of keras-hub's layers and `TransformerEncoderLayer`):
        intermediate_dim: hidden size of the feed-forward network.
        num_heads: attention heads (the model size must be divisible by it).
        dropout: dropout rate after each sublayer.
        attention_dropout: rate on the self-attention weights (None: `dropout`).
        ffn_dropout: rate on the FFN's hidden activations (None: `dropout`).
        activation: the feed-forward network's activation.
        normalize_first: pre-norm (True) or post-norm (False).
        layer_norm_epsilon: epsilon of the layer normalisations.
    """

    def __init__(
        self,
        intermediate_dim,
        num_heads,
        dropout=0.1,
        attention_dropout=None,
        ffn_dropout=None,
        activation="relu",
        normalize_first=True,
        layer_norm_epsilon=1e-5,
        **kwargs,
    ):
        super().__init__(**kwargs)
        self.num_heads = int(num_heads)
        self.intermediate_dim = int(intermediate_dim)
        self.dropout_rate = float(dropout)
        self.attention_dropout_rate = float(
            dropout if attention_dropout is None else attention_dropout
        )
        self.ffn_dropout_rate = float(dropout if ffn_dropout is None else ffn_dropout)
        self.activation = activation
        self.normalize_first = bool(normalize_first)
        self.layer_norm_epsilon = float(layer_norm_epsilon)
        self.dropout = SixteenBitDropout(self.dropout_rate)
        self.ffn_dropout = SixteenBitDropout(self.ffn_dropout_rate)

    def build(self, input_shape, memory_shape):
        dim = input_shape[-1]
        if dim % self.num_heads:
            raise ValueError(f"model size {dim} is not divisible by num_heads {self.num_heads}")
        key_dim = dim // self.num_heads
        self.self_attention = CausalSelfAttention(
            self.num_heads, key_dim, self.attention_dropout_rate, name="self_attention"
        )
        self.cross_attention = MultiHeadCrossAttention(
            self.num_heads, key_dim, output_dim=dim, name="cross_attention"
        )
        self.intermediate = keras.layers.Dense(
            self.intermediate_dim, activation=self.activation, name="intermediate"
        )
        self.feedforward_output = keras.layers.Dense(dim, name="feedforward_output")
        self.norms = [
            keras.layers.LayerNormalization(epsilon=self.layer_norm_epsilon, name=f"norm_{i}")
            for i in range(3)
        ]
        self.self_attention.build(input_shape)
        self.cross_attention.build(input_shape, memory_shape)
        self.intermediate.build(input_shape)
        self.feedforward_output.build(tuple(input_shape[:-1]) + (self.intermediate_dim,))
        for norm in self.norms:
            norm.build(input_shape)

    def precompute(self, memory):
        """The cross-attention keys and values, once per source."""
        return self.cross_attention.precompute(memory)

    def initial_cache(self, batch_size, dtype="float32"):
        return self.self_attention.initial_cache(batch_size, dtype)

    def _residual(self, x, norm, sublayer, training):
        """`x` plus the sublayer's output, normalised before or after; and its extra output."""
        output, extra = sublayer(norm(x) if self.normalize_first else x)
        x = x + self.dropout(output, training=training)
        return (x if self.normalize_first else norm(x)), extra

    def _feedforward(self, x, training):
        hidden = self.ffn_dropout(self.intermediate(x), training=training)
        return self.feedforward_output(hidden), None

    def call(self, x, memory_cache, memory_mask=None, training=None):
        x, _ = self._residual(
            x, self.norms[0], lambda h: (self.self_attention(h, training=training), None), training
        )
        x, weights = self._residual(
            x,
            self.norms[1],
            lambda h: self.cross_attention.attend(h, memory_cache, memory_mask),
            training,
        )
        x, _ = self._residual(x, self.norms[2], lambda h: self._feedforward(h, training), training)
        return x, weights

    def step(self, x, cache, memory_cache, memory_mask):
        x, cache = self._residual(
            x, self.norms[0], lambda h: self.self_attention.step(h, cache), False
        )
        x, weights = self._residual(
            x,
            self.norms[1],
            lambda h: self.cross_attention.attend(h, memory_cache, memory_mask),
            False,
        )
        x, _ = self._residual(x, self.norms[2], lambda h: self._feedforward(h, False), False)
        return x, cache, weights
