"""Fixed-shape buffers written one decoding step at a time (search outputs, attention caches).

Shapes stay fixed across the steps of a loop, so the loop converts to an ONNX `Loop` with no
TensorArray; a write is a scatter of one column, never a pass over the whole buffer.
"""

from keras import ops


def write_column(buffer, index, values, axis):
    """`buffer` with position `index` of its `axis` set to `values`.

    Args (`axis` >= 1: the leading axes give each written slice its row):
        buffer: `[d_0, ..., d_axis, ..., d_n]`.
        index: scalar int, the position along `axis`.
        values: the buffer's shape without `axis`: `[d_0, ..., d_n]` minus `d_axis`.
    """
    index = ops.cast(index, "int32")
    # One index tuple (row..., index) per leading position; each writes a trailing slice.
    leading = ops.shape(values)[:axis]
    rows = ops.meshgrid(*[ops.arange(size, dtype="int32") for size in leading], indexing="ij")
    position = ops.full(leading, index, dtype="int32")
    indices = ops.stack([*rows, position], axis=-1)
    return ops.scatter_update(buffer, indices, values)
