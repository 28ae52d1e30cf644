"""Masking helpers shared by the attention layers, the encoder and the decoder.

These are functions, not layers: each attention layer applies the same masked softmax,
and the encoder and decoder derive masks from padded token ids the same way.
"""

import tensorflow as tf
from keras import ops

from layers.special_tokens import PAD_ID


def sequence_mask(token_ids, pad_id=PAD_ID):
    """Boolean mask `[batch, length]`: True at real tokens, False at padding."""
    return ops.not_equal(token_ids, pad_id)


def boolean_mask(mask):
    """`mask` as booleans, or None.

    A layer whose `call` takes `memory` and `memory_mask` needs no more: when `memory` carries
    a Keras mask and no `memory_mask` is given, Keras passes that mask as `memory_mask` (its
    `<argument>_mask` convention for layers with several tensor arguments)."""
    return None if mask is None else ops.cast(mask, "bool")


def _large_negative(dtype):
    # exp(-1e9) and exp(-3e4) both underflow to exactly 0 in their dtypes; -1e9 overflows float16.
    return -3.0e4 if dtype in ("float16", "bfloat16") else -1.0e9


def masked_softmax(scores, mask=None):
    """Softmax over the last axis that gives exactly 0 where `mask` is False.

    Args:
        scores: `[..., src_len]` attention scores.
        mask: boolean `[batch, src_len]` (broadcast over the middle axes of `scores`), or None.

    Returns:
        Weights with the shape of `scores`. Each row sums to 1 over its unmasked positions;
        a row with no unmasked position is all zeros, so it contributes an all-zero context.
    """
    if mask is None:
        return _softmax(scores)
    # Broadcast [batch, src_len] to [batch, 1, ..., 1, src_len].
    while len(mask.shape) < len(scores.shape):
        mask = ops.expand_dims(mask, axis=1)
    dtype = scores.dtype
    weights = _softmax(ops.where(mask, scores, ops.cast(_large_negative(dtype), dtype)))
    return ops.where(mask, weights, ops.cast(0, dtype))


def _softmax(scores):
    # TensorFlow's, not keras.ops.softmax (which warns on a source of one token, a legitimate
    # input) nor written out: one node in an exported decoding step instead of five.
    return tf.nn.softmax(scores, axis=-1)


def reverse_padded(sequences, lengths):
    """Reverse each sequence within its own length, leaving right padding in place.

    `sequences` is `[batch, time, ...]`, `lengths` `[batch]`. The operation is its own inverse,
    which is how the encoder maps outputs of a reversed source back to source order.
    """
    time = ops.shape(sequences)[1]
    positions = ops.expand_dims(ops.arange(time, dtype="int32"), 0)
    lengths = ops.expand_dims(ops.cast(lengths, "int32"), 1)
    indices = ops.where(positions < lengths, lengths - 1 - positions, positions)
    while len(indices.shape) < len(sequences.shape):
        indices = ops.expand_dims(indices, -1)
    return ops.take_along_axis(sequences, indices, axis=1)
