"""The common contract of every attention layer over an encoded source."""

import keras
from keras import ops

from layers.masking import boolean_mask, masked_softmax
from layers.recorded_arguments import RecordsArguments


def group_step_queries(query, memory_cache, feature_shape=None):
    """One step's queries `[batch * k, dim]` as `[batch, k, dim]` (or `[batch, k,
    *feature_shape]`, splitting `dim` in the same reshape).

    In beam search each source has k hypotheses, in consecutive rows (rows i*k ... i*k+k-1
    belong to source i); grouped so, they attend over their source's memory as k query
    positions, and the memory is never copied k times. Greedy search and sampling have k = 1.
    """
    # The target shape depends on the memory alone, so that an exported loop computes it
    # once, outside (each node of a loop runs at every step).
    batch = ops.shape(memory_cache[0])[0]
    feature_shape = tuple(feature_shape or (query.shape[-1],))
    return ops.reshape(query, (batch, -1, *feature_shape))


def ungroup_step_outputs(x, tail=None):
    """`[batch, k, *tail]` back to the step's `[batch * k, *tail]`. `tail`: the trailing
    sizes, by default the static ones of `x` (pass sizes read from the memory for the others:
    a shape computed from `x` costs nodes at every step of an exported loop)."""
    tail = x.shape[2:] if tail is None else tail
    return ops.reshape(x, (-1, *tail))


class SourceAttention(RecordsArguments, keras.layers.Layer):
    """Base class: a decoder query attends over the encoder's memory.

    Call as `context, weights = attention(query, memory, memory_mask=None)`.

    Subclasses define:
    - `precompute(memory)`: everything that depends on the memory alone (the key projection,
      the value projection), returned as a tuple of `[batch, src_len, ...]` tensors. The decoder
      computes it once per source and reuses it at every step; search reorders it by beam.
    - `project_query(query)` (optional): what depends on the query alone (its projection),
      for a rank-2 or rank-3 query; the identity by default.
    - `score(query, memory_cache)`: scores `[batch, tgt_len, src_len]` for a rank-3 query
      that `project_query` has made.
    Layers whose weights are not one softmax over scores (several heads) override `attend`.

    Args (of `call`):
        query: `[batch, query_dim]` (one decoder step) or `[batch, tgt_len, query_dim]`. At a
            step, the query may hold k rows per source (see `group_step_queries`).
        memory: `[batch, src_len, memory_dim]` encoder outputs.
        memory_mask: boolean `[batch, src_len]`, True at real source tokens. Defaults to the
            Keras mask carried by `memory`, if any.

    Returns:
        context: `[batch, value_dim]` or `[batch, tgt_len, value_dim]`; `value_dim` is
            `memory_dim` unless the layer projects values to another size.
        weights: `[batch, src_len]` or `[batch, tgt_len, src_len]`; a distribution over the
            unmasked source positions, exactly 0 at padding.
    """

    def call(self, query, memory, memory_mask=None):
        memory_mask = boolean_mask(memory_mask)
        return self.attend(query, self.precompute(memory), memory_mask)

    def precompute(self, memory):
        """The tensors that depend only on the memory: `(keys, values)` by default."""
        return (memory, memory)

    def project_query(self, query):
        return query

    def score(self, query, memory_cache):
        raise NotImplementedError

    def attend(self, query, memory_cache, memory_mask=None):
        """Attention from `query` (rank 2 or 3) using a cache returned by `precompute`."""
        single_step = len(query.shape) == 2
        # Projected before a step's queries are grouped: a rank-2 product is one plain matrix
        # product where a rank-3 one is a reshape around it (nodes at every step in ONNX).
        query = self.project_query(query)
        if single_step:
            query = group_step_queries(query, memory_cache)
        scores = self.score(query, memory_cache)
        weights = masked_softmax(scores, memory_mask)
        values = memory_cache[-1]
        context = ops.matmul(weights, ops.cast(values, weights.dtype))
        if single_step:
            source_length = ops.shape(values)[1]
            return ungroup_step_outputs(context), ungroup_step_outputs(weights, (source_length,))
        return context, weights

    def value_dim(self, memory_dim):
        """Size of the context vector for a memory of `memory_dim` features."""
        return memory_dim

    def compute_output_shape(self, query_shape, memory_shape, memory_mask_shape=None):
        context_shape = tuple(query_shape[:-1]) + (self.value_dim(memory_shape[-1]),)
        weights_shape = tuple(query_shape[:-1]) + (memory_shape[1],)
        return context_shape, weights_shape
