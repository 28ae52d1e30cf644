"""Masked token-level cross-entropy, accuracy and perplexity for padded target sequences."""

import keras
import tensorflow as tf
from keras import ops


def token_cross_entropy(labels, logits, mask, label_smoothing=0.0, spread=None):
    """Per-token losses over padded targets.

    Args:
        labels: int `[batch, tgt_len]`; logits: `[batch, tgt_len, vocab]`;
        mask: boolean `[batch, tgt_len]`, True at real tokens.
        label_smoothing: epsilon; the target distribution is (1 - eps) one-hot + eps uniform.
        spread: float32 `[vocab]` summing to 1, the distribution label smoothing spreads
            instead of the uniform one (a model's, over the ids it may output), or None.

    Returns:
        (loss, nll), both float32 `[batch, tgt_len]` and 0 at padding: `loss` is the smoothed
        cross-entropy to train on, `nll` the plain negative log-likelihood (for perplexity).
    """
    logits = ops.cast(logits, "float32")
    labels = ops.cast(labels, "int32")
    if not label_smoothing:
        # The fused softmax cross-entropy: gathering each label's log-probability instead made
        # its gradient a scatter over [batch, tgt_len, vocab].
        nll = ops.sparse_categorical_crossentropy(labels, logits, from_logits=True)
        loss = nll
    else:
        # The fused dense softmax cross-entropy against the smoothed distribution: its kernel
        # computes the gradient with the loss. A logsumexp beside the sparse kernel instead
        # made several more passes over [batch, tgt_len, vocab].
        # TensorFlow's own ops: keras.ops' one_hot has no on/off values (two more passes).
        vocab_size = tf.shape(logits)[-1]
        fixed = ops.stop_gradient(logits)
        if spread is None:
            off = label_smoothing / tf.cast(vocab_size, "float32")
            target = tf.one_hot(labels, vocab_size, on_value=1.0 - label_smoothing + off,
                                off_value=off)  # fmt: skip
            spread_logits = ops.mean(fixed, axis=-1)
        else:
            target = tf.one_hot(labels, vocab_size, on_value=1.0 - label_smoothing,
                                off_value=0.0) + label_smoothing * spread  # fmt: skip
            spread_logits = tf.tensordot(fixed, spread, 1)
        loss = tf.nn.softmax_cross_entropy_with_logits(target, logits)
        # loss = logsumexp(z) - (1 - eps) z_label - eps E_spread(z), so nll = logsumexp(z) -
        # z_label is loss - eps (z_label - E_spread(z)).
        label_logits = ops.take_along_axis(fixed, labels[..., None], axis=-1)[..., 0]
        nll = loss - label_smoothing * (label_logits - spread_logits)
    weights = ops.cast(mask, "float32")
    return loss * weights, nll * weights


# Positions whose logits one step of `projected_token_cross_entropy` holds: large enough that
# each matmul keeps the CPU busy, small enough that the [chunk, vocab] logits stay in cache.
PROJECTION_CHUNK = 256


@tf.function(jit_compile=True)  # XLA fuses the passes over the chunk's logits into a few loops
def _chunk_cross_entropy(features, labels, valid, kernel, label_smoothing, spread):
    """Sums over one chunk of positions and their gradients; see the caller."""
    logits = tf.matmul(features, kernel)
    top = tf.reduce_max(logits, axis=-1)
    exp = tf.exp(logits - top[:, None])
    total = tf.reduce_sum(exp, axis=-1)
    label_logits = tf.gather(logits, labels, batch_dims=1)
    nll = top + tf.math.log(total) - label_logits
    loss = nll + label_smoothing * (label_logits - tf.linalg.matvec(logits, spread))
    hits = tf.cast(label_logits >= top, tf.float32)
    vocab_size = tf.shape(logits)[-1]
    # d loss / d logits = softmax - the smoothed one-hot, zero at the padding rows.
    target = tf.one_hot(labels, vocab_size, on_value=1.0 - label_smoothing, off_value=0.0)
    grad_logits = (exp / total[:, None] - label_smoothing * spread - target) * valid[:, None]
    return (
        tf.reduce_sum(loss * valid),
        tf.reduce_sum(nll * valid),
        tf.reduce_sum(hits * valid),
        tf.matmul(grad_logits, kernel, transpose_b=True),
        tf.matmul(features, grad_logits, transpose_a=True),
    )


def projected_token_cross_entropy(features, labels, kernel, label_smoothing=0.0, spread=None):
    """`token_cross_entropy` of the logits `features @ kernel`, summed, without ever holding
    the logits of every position: they are made, scored and differentiated
    `PROJECTION_CHUNK` positions at a time, so the `[positions, vocab]` passes of the plain
    path (projection, softmax, loss, its gradient, the projection's two gradients) run on a
    cache-sized block. The gradients are computed with the loss, so a forward pass costs what
    a training step's projection and loss cost.

    Args:
        features: float `[positions, model_dim]`, real (non-padding) positions only.
        labels: int `[positions]`; kernel: float `[model_dim, vocab]`.
        label_smoothing, spread: as in `token_cross_entropy`.

    Returns:
        float32 scalars (loss_sum, nll_sum, hits): the summed smoothed cross-entropy (the one
        differentiable output), the summed plain negative log-likelihood, and how many
        positions' label logit is the maximum (`TokenAccuracy`'s count).
    """
    labels = tf.cast(labels, tf.int32)
    label_smoothing = tf.constant(label_smoothing, tf.float32)
    if spread is None:
        vocab_size = tf.shape(kernel)[1]
        spread = tf.fill([vocab_size], 1.0 / tf.cast(vocab_size, tf.float32))

    @tf.custom_gradient
    def fused(features, kernel):
        positions = tf.shape(features)[0]
        chunks = (positions + PROJECTION_CHUNK - 1) // PROJECTION_CHUNK
        padding = chunks * PROJECTION_CHUNK - positions
        rows = tf.reshape(tf.pad(features, [[0, padding], [0, 0]]), [chunks, PROJECTION_CHUNK, -1])
        row_labels = tf.reshape(tf.pad(labels, [[0, padding]]), [chunks, PROJECTION_CHUNK])
        valid = tf.reshape(tf.pad(tf.ones([positions]), [[0, padding]]), [chunks, PROJECTION_CHUNK])

        def chunk(i, sums, kernel_grad, feature_grads):
            loss, nll, hits, feature_grad, chunk_kernel_grad = _chunk_cross_entropy(
                rows[i], row_labels[i], valid[i], kernel, label_smoothing, spread
            )
            return (
                i + 1,
                sums + tf.stack([loss, nll, hits]),
                kernel_grad + chunk_kernel_grad,
                feature_grads.write(i, feature_grad),
            )

        _, sums, kernel_grad, feature_grads = tf.while_loop(
            lambda i, *_: i < chunks,
            chunk,
            (
                tf.constant(0),
                tf.zeros([3]),
                tf.zeros_like(kernel),
                tf.TensorArray(tf.float32, chunks, element_shape=rows.shape[1:]),
            ),
        )
        feature_grad = tf.reshape(feature_grads.stack(), [-1, tf.shape(features)[1]])
        feature_grad = feature_grad[:positions]

        def grad(d_loss, d_nll, d_hits):  # only the loss is differentiable
            return d_loss * feature_grad, d_loss * kernel_grad

        return (sums[0], sums[1], sums[2]), grad

    return fused(tf.cast(features, tf.float32), tf.cast(kernel, tf.float32))


@keras.saving.register_keras_serializable(package="seq2seq")
class TokenAccuracy(keras.metrics.Metric):
    """Share of non-padding target tokens whose argmax prediction is right."""

    def __init__(self, name="token_accuracy", **kwargs):
        super().__init__(name=name, **kwargs)
        self.correct = self.add_variable(shape=(), initializer="zeros", name="correct")
        self.count = self.add_variable(shape=(), initializer="zeros", name="count")

    def update_state(self, labels, logits, mask):
        # The label's logit against the maximum: keras.ops.argmax makes five more passes over
        # [batch, tgt_len, vocab] to tell -0.0 from 0.0. A tie with
        # another token counts as right.
        label_logits = ops.take_along_axis(logits, ops.cast(labels, "int32")[..., None], axis=-1)
        weights = ops.cast(mask, "float32")
        hits = ops.cast(label_logits[..., 0] >= ops.max(logits, axis=-1), "float32")
        self.add_counts(ops.sum(hits * weights), ops.sum(weights))

    def add_counts(self, correct, count):
        """Counts made elsewhere (`projected_token_cross_entropy`'s hits)."""
        self.correct.assign_add(correct)
        self.count.assign_add(count)

    def result(self):
        return ops.divide_no_nan(self.correct, self.count)


@keras.saving.register_keras_serializable(package="seq2seq")
class Perplexity(keras.metrics.Metric):
    """exp of the mean negative log-likelihood per non-padding token, over all batches seen."""

    def __init__(self, name="perplexity", **kwargs):
        super().__init__(name=name, **kwargs)
        self.total_nll = self.add_variable(shape=(), initializer="zeros", name="total_nll")
        self.count = self.add_variable(shape=(), initializer="zeros", name="count")

    def update_state(self, nll, mask):
        self.total_nll.assign_add(ops.sum(nll))
        self.count.assign_add(ops.sum(ops.cast(mask, "float32")))

    def result(self):
        return ops.exp(ops.divide_no_nan(self.total_nll, self.count))
