"""Small shared builders for the tests."""

import numpy as np
import tensorflow as tf

PAD, UNK, BOS, EOS = 0, 1, 2, 3


def reversal_data(rng, n, vocab_size=20, max_len=8):
    """Random token sequences and their reversals, in the Seq2Seq input format."""
    source = np.zeros((n, max_len), np.int32)
    target_in = np.zeros((n, max_len + 1), np.int32)
    target_out = np.zeros((n, max_len + 1), np.int32)
    for i in range(n):
        length = rng.integers(1, max_len + 1)
        tokens = rng.integers(4, vocab_size, size=length)
        source[i, :length] = tokens
        target_in[i, 0] = BOS
        target_in[i, 1 : length + 1] = tokens[::-1]
        target_out[i, :length] = tokens[::-1]
        target_out[i, length] = EOS
    return {"source_ids": source, "target_input_ids": target_in}, target_out


def gradients_of(layer_fn, variables):
    """Gradients of a random projection of `layer_fn()` with respect to `variables`."""
    with tf.GradientTape() as tape:
        tape.watch(variables)
        outputs = tf.nest.flatten(layer_fn())
        loss = 0.0
        for i, out in enumerate(outputs):
            if out is None or not out.dtype.is_floating:
                continue
            projection = tf.random.stateless_normal(tf.shape(out), seed=(i, 7))
            loss += tf.reduce_sum(out * projection)
    return tape.gradient(loss, variables)


def assert_gradients_reach(layer_fn, layer):
    variables = [v.value for v in layer.trainable_variables]
    assert variables, f"{layer.name} has no trainable variables"
    grads = gradients_of(layer_fn, variables)
    for variable, grad in zip(layer.trainable_variables, grads):
        assert grad is not None, f"no gradient reaches {variable.path}"
        assert float(tf.reduce_max(tf.abs(grad))) > 0, f"zero gradient at {variable.path}"
