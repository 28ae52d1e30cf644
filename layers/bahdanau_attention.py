"""Bahdanau (additive) attention."""

import math

import keras
from keras import ops

from layers.additive_score import additive_score
from layers.source_attention import SourceAttention


@keras.saving.register_keras_serializable(package="seq2seq")
class BahdanauAttention(SourceAttention):
    """Additive attention: score(q, h) = v^T tanh(W_q q + W_k h) (Bahdanau et al., 2015).

    With `normalize=True` the score is the weight-normalised form
    `(g * v / ||v||)^T tanh(W_q q + W_k h + b)` (Salimans & Kingma, 2016), with a learned
    scalar `g` and bias `b`; it keeps the score's scale independent of `units`.

    Args:
        units: size of the hidden layer of the scoring MLP.
        normalize: use the weight-normalised score.

    Shapes: see `SourceAttention`; `context` has the memory's feature size.
    """

    def __init__(self, units, normalize=False, **kwargs):
        super().__init__(**kwargs)
        self.units = int(units)
        self.normalize = bool(normalize)
        self.query_projection = keras.layers.Dense(self.units, use_bias=False, name="query")
        self.key_projection = keras.layers.Dense(self.units, use_bias=False, name="key")

    def build(self, query_shape, memory_shape, memory_mask_shape=None):
        self.query_projection.build(query_shape)
        self.key_projection.build(memory_shape)
        self.v = self.add_weight(name="v", shape=(self.units,), initializer="glorot_uniform")
        if self.normalize:
            self.g = self.add_weight(
                name="g",
                shape=(),
                initializer=keras.initializers.Constant(math.sqrt(1.0 / self.units)),
            )
            self.b = self.add_weight(name="b", shape=(self.units,), initializer="zeros")

    def precompute(self, memory):
        return (self.key_projection(memory), memory)

    def project_query(self, query):
        return self.query_projection(query)

    def score(self, query, memory_cache):
        keys = memory_cache[0]
        v, bias = self.v, None
        if self.normalize:
            v = self.g * v / ops.sqrt(ops.sum(ops.square(v)))
            bias = self.b
        return additive_score(query, keys, v, bias)
