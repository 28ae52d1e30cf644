"""Decoding search over the model's step function, as graph-friendly TensorFlow loops.

Search depends only on the `Seq2Seq` decoding contract (`encode`, `initial_decoder_state`,
`decode_step`), never on a model's internals. Loops run over fixed-shape buffers
(`[batch, max_length]`) with an early exit once every hypothesis has finished, and avoid
TensorArrays and integer one-hot ops so that the same code converts to ONNX.
"""

import tensorflow as tf


def max_decode_length(source_lengths, ratio, offset, cap):
    """Longest output allowed for a batch: ratio * longest source + offset, at most `cap`."""
    longest = tf.cast(tf.reduce_max(source_lengths), tf.float32)
    limit = tf.cast(tf.math.ceil(ratio * longest), tf.int32) + offset
    return tf.minimum(limit, cap)


def _write_column(buffer, t, values):
    """`buffer[:, t] = values` for a `[batch, length, ...]` buffer, as a select."""
    at_t = tf.equal(tf.range(tf.shape(buffer)[1]), t)
    at_t = tf.reshape(at_t, [1, -1] + [1] * (len(buffer.shape) - 2))
    return tf.where(at_t, tf.expand_dims(values, 1), buffer)


def greedy_search(model, source_ids, max_length):
    """The most probable token at each step, until </s> or `max_length` tokens.

    Args:
        model: a model honouring the decoding contract (see `layers.Seq2Seq`).
        source_ids: int32 `[batch, src_len]`, right-padded.
        max_length: scalar int, the most tokens to produce (</s> included).

    Returns:
        ids: int32 `[batch, max_length]`, each row ending with </s> then padding (or cut at
            `max_length`); lengths: int32 `[batch]`, tokens up to and including </s>;
        scores: float32 `[batch]`, the sum of the chosen tokens' log-probabilities;
        attention: float32 `[batch, max_length, src_len]` (zeros for a model without it).
    """
    batch = tf.shape(source_ids)[0]
    encoded = model.encode(source_ids)
    state = model.initial_decoder_state(encoded)
    ids = tf.fill([batch, max_length], tf.constant(model.pad_id, tf.int32))
    attention = tf.zeros([batch, max_length, tf.shape(source_ids)[1]], tf.float32)
    finished = tf.zeros([batch], tf.bool)
    scores = tf.zeros([batch], tf.float32)
    tokens = tf.fill([batch], tf.constant(model.bos_id, tf.int32))

    def not_done(t, tokens, state, ids, attention, finished, scores):
        return tf.logical_and(t < max_length, tf.logical_not(tf.reduce_all(finished)))

    def step(t, tokens, state, ids, attention, finished, scores):
        logits, state, weights = model.decode_step(tokens, state, encoded)
        log_probs = tf.nn.log_softmax(tf.cast(logits, tf.float32))
        best = tf.argmax(log_probs, axis=-1, output_type=tf.int32)
        best_score = tf.reduce_max(log_probs, axis=-1)
        tokens = tf.where(finished, model.pad_id, best)
        scores += tf.where(finished, 0.0, best_score)
        ids = _write_column(ids, t, tokens)
        if weights is not None:
            weights = tf.where(finished[:, None], 0.0, tf.cast(weights, tf.float32))
            attention = _write_column(attention, t, weights)
        finished = tf.logical_or(finished, tf.equal(tokens, model.eos_id))
        return t + 1, tokens, state, ids, attention, finished, scores

    _, _, _, ids, attention, _, scores = tf.while_loop(
        not_done, step, (tf.constant(0), tokens, state, ids, attention, finished, scores)
    )
    lengths = tf.reduce_sum(tf.cast(tf.not_equal(ids, model.pad_id), tf.int32), axis=1)
    return ids, lengths, scores, attention
