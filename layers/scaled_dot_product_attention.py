"""Scaled dot-product attention (Vaswani et al., 2017), one head."""

import math

import keras
from keras import ops

from layers.source_attention import SourceAttention


@keras.saving.register_keras_serializable(package="seq2seq")
class ScaledDotProductAttention(SourceAttention):
    """score(q, k) = (W_q q) . (W_k k) / sqrt(d), or with `qk_norm`
    score(q, k) = LN_q(W_q q) . LN_k(W_k k) / sqrt(d).

    Args:
        projection_dim: if set, queries and keys are projected to this size by learned
            matrices and d = projection_dim; if None, the raw query and memory are compared
            (they must have the same size) and d is that size.
        project_values: project the memory with a learned matrix (to the memory's own size)
            before the weighted sum.
        qk_norm: layer-normalise the projected queries and keys (each with a learned gain
            per feature, initialised to 1, no offset) before the product: the scores start
            at a standard deviation of about 1 and grow only as fast as the gains, where
            unnormalised projections let the scores grow at every step (attention-logit
            growth; Dehghani et al., 2023, "Scaling Vision Transformers to 22 Billion
            Parameters", and Henry et al., 2020, "Query-Key Normalization for Transformers").
            Needs `projection_dim`.

    Shapes: see `SourceAttention`; `context` has the memory's feature size.
    """

    def __init__(self, projection_dim=None, project_values=False, qk_norm=False, **kwargs):
        super().__init__(**kwargs)
        if qk_norm and projection_dim is None:
            raise ValueError("ScaledDotProductAttention(qk_norm=True) needs projection_dim.")
        self.projection_dim = None if projection_dim is None else int(projection_dim)
        self.project_values = bool(project_values)
        self.qk_norm = bool(qk_norm)

    def build(self, query_shape, memory_shape, memory_mask_shape=None):
        query_dim, memory_dim = query_shape[-1], memory_shape[-1]
        if self.projection_dim is None:
            if query_dim != memory_dim:
                raise ValueError(
                    "ScaledDotProductAttention without projection_dim needs the query and "
                    f"memory sizes to match, got query {query_dim} and memory {memory_dim}."
                )
            self.depth = query_dim
        else:
            self.depth = self.projection_dim
            self.query_projection = keras.layers.Dense(self.depth, use_bias=False, name="query")
            self.key_projection = keras.layers.Dense(self.depth, use_bias=False, name="key")
            self.query_projection.build(query_shape)
            self.key_projection.build(memory_shape)
        if self.qk_norm:
            self.query_norm = keras.layers.LayerNormalization(center=False, name="query_norm")
            self.key_norm = keras.layers.LayerNormalization(center=False, name="key_norm")
            self.query_norm.build(tuple(query_shape[:-1]) + (self.depth,))
            self.key_norm.build(tuple(memory_shape[:-1]) + (self.depth,))
        if self.project_values:
            self.value_projection = keras.layers.Dense(memory_dim, use_bias=False, name="value")
            self.value_projection.build(memory_shape)

    def precompute(self, memory):
        keys = memory if self.projection_dim is None else self.key_projection(memory)
        if self.qk_norm:
            keys = self.key_norm(keys)
        values = self.value_projection(memory) if self.project_values else memory
        # Keys as [batch, depth, src_len]: no transpose at each decoding step.
        return (ops.transpose(keys, (0, 2, 1)), values)

    def project_query(self, query):
        if self.projection_dim is not None:
            query = self.query_projection(query)
        return self.query_norm(query) if self.qk_norm else query

    def score(self, query, memory_cache):
        keys = ops.cast(memory_cache[0], query.dtype)
        return ops.matmul(query, keys) / math.sqrt(self.depth)
