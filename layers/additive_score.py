"""The additive (MLP) score shared by Bahdanau attention and Luong's concat score."""

from keras import ops


def additive_score(projected_query, keys, v, bias=None):
    """score[b, t, s] = v . tanh(projected_query[b, t] + keys[b, s] (+ bias)).

    Args:
        projected_query: `[batch, tgt_len, units]`, W_q q.
        keys: `[batch, src_len, units]`, W_k h (computed once per source).
        v: `[units]`.
        bias: optional `[units]` added inside the tanh (the weight-normalised form).
    """
    hidden = ops.expand_dims(projected_query, 2) + ops.expand_dims(keys, 1)
    if bias is not None:
        hidden = hidden + bias
    # v as a one-column matrix: tf2onnx writes this as one MatMul, while it decomposes the
    # einsum with a vector into reshapes and shape arithmetic at every decoding step.
    return ops.squeeze(ops.einsum("btsu,uo->btso", ops.tanh(hidden), v[:, None]), -1)
