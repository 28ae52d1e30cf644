"""Luong (multiplicative and concat) attention."""

import math

import keras
from keras import ops

from layers.additive_score import additive_score
from layers.source_attention import SourceAttention

SCORES = ("dot", "general", "concat")


@keras.saving.register_keras_serializable(package="seq2seq")
class LuongAttention(SourceAttention):
    """Luong et al. (2015) attention with one of three score functions.

    - `dot`:     score(q, h) = q^T h / sqrt(d) (query and memory must have the same size d)
    - `general`: score(q, h) = q^T W h / sqrt(d) (bilinear, d the query size; W h is computed
      once per source)
    - `concat`:  score(q, h) = v^T tanh(W [q; h]), computed as v^T tanh(W_q q + W_k h)

    The fixed 1/sqrt(d) of the multiplicative scores (as in Vaswani et al.'s scaled dot
    product) keeps them in the range the additive score lives in. Unscaled, an inner product
    over the hundreds of features of a recurrent state starts peaked and grows under Adam,
    whose every step moves each of W's entries by about the learning rate and so a score by
    up to lr * |q|_1 * |h|_1: the weights turn one-hot within the first hundred steps and the
    model trains far worse than with the additive score (the diagnosis is in the docs).
    `depth_scaling=False` gives the paper's unscaled score (and is what models saved before
    the scale existed load with).

    Args:
        score: "dot", "general" or "concat".
        scale: multiply the score by a learned scalar (initialised to 1).
        units: hidden size of the concat score; defaults to the query size.
        depth_scaling: divide the dot and general scores by sqrt(d).

    Shapes: see `SourceAttention`; `context` has the memory's feature size.
    """

    def __init__(self, score="general", scale=False, units=None, depth_scaling=True, **kwargs):
        super().__init__(**kwargs)
        if score not in SCORES:
            raise ValueError(f"LuongAttention score must be one of {SCORES}, got {score!r}")
        self.score_name = score
        self.scale = bool(scale)
        self.units = None if units is None else int(units)
        self.depth_scaling = bool(depth_scaling)

    def build(self, query_shape, memory_shape, memory_mask_shape=None):
        query_dim, memory_dim = query_shape[-1], memory_shape[-1]
        if self.score_name == "dot" and query_dim != memory_dim:
            raise ValueError(
                "LuongAttention(score='dot') needs the query and memory sizes to match, got "
                f"query {query_dim} and memory {memory_dim}; use score='general' instead."
            )
        if self.score_name == "general":
            self.key_projection = keras.layers.Dense(query_dim, use_bias=False, name="key")
            self.key_projection.build(memory_shape)
        elif self.score_name == "concat":
            units = self.units or query_dim
            self.query_projection = keras.layers.Dense(units, use_bias=False, name="query")
            self.key_projection = keras.layers.Dense(units, use_bias=False, name="key")
            self.query_projection.build(query_shape)
            self.key_projection.build(memory_shape)
            self.v = self.add_weight(name="v", shape=(units,), initializer="glorot_uniform")
        if self.scale:
            self.gain = self.add_weight(name="gain", shape=(), initializer="ones")

    def precompute(self, memory):
        if self.score_name == "concat":
            return (self.key_projection(memory), memory)
        keys = memory if self.score_name == "dot" else self.key_projection(memory)
        if self.depth_scaling:  # d is the keys' size; scaled once per source, not per step
            keys = keys / math.sqrt(keys.shape[-1])
        # Stored as [batch, dim, src_len]: each decoding step's scores are then one plain
        # batched matmul, with no transpose of the keys per step (a per-step copy in ONNX).
        return (ops.transpose(keys, (0, 2, 1)), memory)

    def project_query(self, query):
        return self.query_projection(query) if self.score_name == "concat" else query

    def score(self, query, memory_cache):
        keys = memory_cache[0]
        if self.score_name == "concat":
            scores = additive_score(query, keys, self.v)
        else:
            scores = ops.matmul(query, ops.cast(keys, query.dtype))
        if self.scale:
            scores = scores * ops.cast(self.gain, scores.dtype)
        return scores

    @classmethod
    def from_config(cls, config):
        # A configuration saved before `depth_scaling` existed describes an unscaled score.
        return cls(**{"depth_scaling": False, **config})
