"""Length-sorted batching, shared by every translator and scorer (no TensorFlow here: the ONNX
runtime uses it too)."""

import numpy as np


def length_sorted_batches(lengths, batch_size):
    """Index arrays of batches of at most `batch_size` items, shortest first, so that little
    work goes to padding."""
    order = np.argsort(lengths, kind="stable")
    for start in range(0, len(order), batch_size):
        yield order[start : start + batch_size]
