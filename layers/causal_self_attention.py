"""Multi-head self-attention over the positions so far: a Transformer decoder's first sublayer."""

import math

import keras
from keras import ops

from layers.masking import masked_softmax
from layers.recorded_arguments import RecordsArguments
from layers.sixteen_bit_dropout import SixteenBitDropout


@keras.saving.register_keras_serializable(package="seq2seq")
class CausalSelfAttention(RecordsArguments, keras.layers.Layer):
    """Position t attends to positions 0..t, with `num_heads` scaled dot-product heads.

    `call(x)` attends over a whole sequence at once (teacher forcing): `[batch, time, dim]` ->
    `[batch, time, dim]`. Padding needs no mask: targets are right-padded, so a real position
    never sees one, and padded positions' outputs are not scored.

    `step(x, cache)` decodes one position incrementally: `x` `[batch, dim]` is the next
    position, and `cache` (from `initial_cache`) holds the keys and values of the positions
    before it: keys `[batch, heads, key_dim, t]` and values `[batch, heads, t, key_dim]`, laid
    out for plain batched matmuls. The step appends its own key and value and attends over
    the t + 1 positions, so the prefix is never recomputed. The cache grows by one position a
    step rather than filling a buffer of the longest length: each step then copies (when
    search reorders beams) and attends over the positions so far only, and writes no
    scatter, which ONNX Runtime would run as a copy of the whole buffer.

    Args:
        num_heads: number of heads.
        key_dim: size of each head's queries, keys and values.
        dropout: dropout rate on the attention weights (training only).
    """

    def __init__(self, num_heads, key_dim, dropout=0.0, **kwargs):
        super().__init__(**kwargs)
        self.num_heads = int(num_heads)
        self.key_dim = int(key_dim)
        self.dropout_rate = float(dropout)
        self.attention_dropout = SixteenBitDropout(self.dropout_rate)

    def build(self, input_shape):
        width = self.num_heads * self.key_dim
        self.query_projection = keras.layers.Dense(width, name="query")
        self.key_projection = keras.layers.Dense(width, name="key")
        self.value_projection = keras.layers.Dense(width, name="value")
        self.output_projection = keras.layers.Dense(input_shape[-1], name="output")
        for projection in (self.query_projection, self.key_projection, self.value_projection):
            projection.build(input_shape)
        self.output_projection.build(tuple(input_shape[:-1]) + (width,))

    def _heads(self, x):
        # [batch, time, heads * key_dim] -> [batch, heads, time, key_dim]
        batch, time = ops.shape(x)[0], ops.shape(x)[1]
        x = ops.reshape(x, (batch, time, self.num_heads, self.key_dim))
        return ops.transpose(x, (0, 2, 1, 3))

    def _merge(self, heads):
        # [batch, heads, time, key_dim] -> [batch, time, dim]
        batch, time = ops.shape(heads)[0], ops.shape(heads)[2]
        heads = ops.transpose(heads, (0, 2, 1, 3))
        heads = ops.reshape(heads, (batch, time, self.num_heads * self.key_dim))
        return self.output_projection(heads)

    def _attend(self, queries, keys, values, mask, training):
        scores = ops.matmul(queries, keys) / math.sqrt(self.key_dim)
        weights = self.attention_dropout(masked_softmax(scores, mask), training=training)
        return ops.matmul(weights, values)

    def call(self, x, training=None):
        queries = self._heads(self.query_projection(x))
        keys = ops.transpose(self._heads(self.key_projection(x)), (0, 1, 3, 2))
        values = self._heads(self.value_projection(x))
        time = ops.shape(x)[1]
        positions = ops.arange(time)
        causal = ops.expand_dims(positions, 0) <= ops.expand_dims(positions, 1)  # [query, key]
        heads = self._attend(queries, keys, values, causal[None, None], training)
        return self._merge(heads)

    def initial_cache(self, batch_size, dtype="float32"):
        """Key and value caches of no positions."""
        keys = ops.zeros((batch_size, self.num_heads, self.key_dim, 0), dtype=dtype)
        values = ops.zeros((batch_size, self.num_heads, 0, self.key_dim), dtype=dtype)
        return (keys, values)

    def step(self, x, cache):
        """The next position: `x` `[batch, dim]` -> output `[batch, dim]` and the cache with
        its key and value appended."""
        # Projections of the rank-2 step input: plain matmuls (a rank-3 Dense is a tensordot,
        # a dozen shape ops at every step of the search loop).
        split = (-1, self.num_heads, self.key_dim)
        queries = ops.reshape(self.query_projection(x), split)[:, :, None]  # [b, heads, 1, d]
        new_key = ops.reshape(self.key_projection(x), split)[..., None]  # [b, heads, d, 1]
        new_value = ops.reshape(self.value_projection(x), split)[:, :, None]  # [b, heads, 1, d]
        keys = ops.concatenate([cache[0], ops.cast(new_key, cache[0].dtype)], axis=3)
        values = ops.concatenate([cache[1], ops.cast(new_value, cache[1].dtype)], axis=2)
        heads = self._attend(
            queries, ops.cast(keys, x.dtype), ops.cast(values, x.dtype), None, training=False
        )
        heads = ops.reshape(heads, (-1, self.num_heads * self.key_dim))
        return self.output_projection(heads), (keys, values)
