"""Multi-head attention from decoder queries to the encoder memory."""

import math

import keras
from keras import ops

from layers.masking import masked_softmax
from layers.source_attention import (
    SourceAttention,
    group_step_queries,
    ungroup_step_outputs,
)


@keras.saving.register_keras_serializable(package="seq2seq")
class MultiHeadCrossAttention(SourceAttention):
    """`num_heads` scaled dot-product attentions over learned projections, concatenated and
    projected back (Vaswani et al., 2017).

    Args:
        num_heads: number of heads.
        key_dim: size of each head's query and key projections.
        value_dim: size of each head's value projection; defaults to `key_dim`.
            Not used without `project_values`.
        output_dim: size of the context vector; defaults to the memory's size.
        use_bias: biases in the projections.
        qk_norm: layer-normalise each head's projected queries and keys before the product
            (see `ScaledDotProductAttention`; one gain per feature of a head, shared by the
            heads).
        project_values: mix learned projections of the memory (Vaswani et al.). Without it,
            head h mixes the h-th of `num_heads` equal slices of the memory's own features,
            so the context is a weighted sum of encoder states as in Luong's and Bahdanau's
            attention (the memory's size must divide by `num_heads`).

    Shapes: see `SourceAttention`. `weights` are averaged over the heads, so they remain a
    distribution over the unmasked source positions (each head's weights are one).
    """

    def __init__(
        self,
        num_heads,
        key_dim,
        value_dim=None,
        output_dim=None,
        use_bias=True,
        qk_norm=False,
        project_values=True,
        **kwargs,
    ):
        super().__init__(**kwargs)
        self.num_heads = int(num_heads)
        self.key_dim = int(key_dim)
        self.value_dim_per_head = int(value_dim or key_dim)
        self.output_dim = None if output_dim is None else int(output_dim)
        self.use_bias = bool(use_bias)
        self.qk_norm = bool(qk_norm)
        self.project_values = bool(project_values)

    def build(self, query_shape, memory_shape, memory_mask_shape=None):
        heads_keys = self.num_heads * self.key_dim
        if not self.project_values:
            if memory_shape[-1] % self.num_heads:
                raise ValueError(
                    f"MultiHeadCrossAttention(project_values=False) needs the memory's size "
                    f"({memory_shape[-1]}) to divide by num_heads ({self.num_heads})."
                )
            self.value_dim_per_head = memory_shape[-1] // self.num_heads
        heads_values = self.num_heads * self.value_dim_per_head
        self.query_projection = keras.layers.Dense(heads_keys, use_bias=self.use_bias, name="query")
        self.key_projection = keras.layers.Dense(heads_keys, use_bias=self.use_bias, name="key")
        if self.project_values:
            self.value_projection = keras.layers.Dense(
                heads_values, use_bias=self.use_bias, name="value"
            )
            self.value_projection.build(memory_shape)
        self.output_projection = keras.layers.Dense(
            self.value_dim(memory_shape[-1]), use_bias=self.use_bias, name="output"
        )
        self.query_projection.build(query_shape)
        self.key_projection.build(memory_shape)
        self.output_projection.build(tuple(query_shape[:-1]) + (heads_values,))
        if self.qk_norm:
            self.query_norm = keras.layers.LayerNormalization(center=False, name="query_norm")
            self.key_norm = keras.layers.LayerNormalization(center=False, name="key_norm")
            self.query_norm.build((None, self.key_dim))
            self.key_norm.build((None, self.key_dim))

    def value_dim(self, memory_dim):
        return self.output_dim or memory_dim

    def _split_heads(self, x, depth):
        # [batch, time, heads * depth] -> [batch, time, heads, depth]
        batch, time = ops.shape(x)[0], ops.shape(x)[1]
        return ops.reshape(x, (batch, time, self.num_heads, depth))

    def precompute(self, memory):
        # Keys as [batch, heads, depth, src_len] and values as [batch, heads, src_len, depth]:
        # each decoding step then needs plain batched matmuls, with no transpose of the cache.
        keys = self._split_heads(self.key_projection(memory), self.key_dim)
        if self.qk_norm:
            keys = self.key_norm(keys)
        projected_values = self.value_projection(memory) if self.project_values else memory
        values = self._split_heads(projected_values, self.value_dim_per_head)
        return (ops.transpose(keys, (0, 2, 3, 1)), ops.transpose(values, (0, 2, 1, 3)))

    def attend(self, query, memory_cache, memory_mask=None):
        single_step = len(query.shape) == 2
        # Project the query as it comes (a step's rank-2 query is a plain matmul, where a
        # rank-3 Dense is a tensordot of many shape ops), then split it into heads in one
        # reshape: one that also groups a step's hypotheses by source.
        projected = self.query_projection(query)
        keys, values = memory_cache
        if single_step and self.num_heads == 1:
            # Straight to [batch, 1, k, depth]. Through the transpose below, tf2onnx folds the
            # unit axis' move into the reshape with the query's batch * k rows as the batch.
            q = ops.reshape(projected, (ops.shape(keys)[0], 1, -1, self.key_dim))
        else:
            if single_step:
                q = group_step_queries(projected, memory_cache, (self.num_heads, self.key_dim))
            else:
                q = self._split_heads(projected, self.key_dim)
            q = ops.transpose(q, (0, 2, 1, 3))  # [batch, heads, tgt_len, depth]
        if self.qk_norm:
            q = self.query_norm(q)
        scores = ops.matmul(q, ops.cast(keys, q.dtype)) / math.sqrt(self.key_dim)
        head_weights = masked_softmax(scores, memory_mask)
        heads = ops.matmul(head_weights, ops.cast(values, q.dtype))
        heads = ops.transpose(heads, (0, 2, 1, 3))  # [batch, tgt_len, heads, depth]
        weights = ops.mean(head_weights, axis=1)
        width = self.num_heads * self.value_dim_per_head
        if single_step:
            source_length = ops.shape(values)[2]
            heads = ops.reshape(heads, (-1, width))
            weights = ungroup_step_outputs(weights, (source_length,))
        else:
            heads = ops.reshape(heads, (ops.shape(query)[0], ops.shape(query)[1], width))
        return self.output_projection(heads), weights
