"""Masked token-level cross-entropy, accuracy and perplexity for padded target sequences."""

import keras
import tensorflow as tf
from keras import ops


def token_cross_entropy(labels, logits, mask, label_smoothing=0.0):
    """Per-token losses over padded targets.

    Args:
        labels: int `[batch, tgt_len]`; logits: `[batch, tgt_len, vocab]`;
        mask: boolean `[batch, tgt_len]`, True at real tokens.
        label_smoothing: epsilon; the target distribution is (1 - eps) one-hot + eps uniform.

    Returns:
        (loss, nll), both float32 `[batch, tgt_len]` and 0 at padding: `loss` is the smoothed
        cross-entropy to train on, `nll` the plain negative log-likelihood (for perplexity).
    """
    logits = ops.cast(logits, "float32")
    labels = ops.cast(labels, "int32")
    if not label_smoothing:
        # The fused softmax cross-entropy: gathering each label's log-probability instead made
        # its gradient a scatter over [batch, tgt_len, vocab], ~7% of a training step.
        nll = ops.sparse_categorical_crossentropy(labels, logits, from_logits=True)
        loss = nll
    else:
        # The fused dense softmax cross-entropy against the smoothed distribution: its kernel
        # computes the gradient with the loss. A logsumexp beside the sparse kernel instead
        # made ~6 more passes over [batch, tgt_len, vocab], ~12% of a training step.
        # TensorFlow's own ops: keras.ops' one_hot has no on/off values (two more passes).
        vocab_size = tf.shape(logits)[-1]
        off = label_smoothing / tf.cast(vocab_size, "float32")
        target = tf.one_hot(labels, vocab_size, on_value=1.0 - label_smoothing + off, off_value=off)
        loss = tf.nn.softmax_cross_entropy_with_logits(target, logits)
        # loss = logsumexp(z) - (1 - eps) z_label - eps mean(z), so nll = logsumexp(z) - z_label
        # is loss - eps (z_label - mean(z)).
        fixed = ops.stop_gradient(logits)
        label_logits = ops.take_along_axis(fixed, labels[..., None], axis=-1)[..., 0]
        nll = loss - label_smoothing * (label_logits - ops.mean(fixed, axis=-1))
    weights = ops.cast(mask, "float32")
    return loss * weights, nll * weights


@keras.saving.register_keras_serializable(package="seq2seq")
class TokenAccuracy(keras.metrics.Metric):
    """Share of non-padding target tokens whose argmax prediction is right."""

    def __init__(self, name="token_accuracy", **kwargs):
        super().__init__(name=name, **kwargs)
        self.correct = self.add_variable(shape=(), initializer="zeros", name="correct")
        self.count = self.add_variable(shape=(), initializer="zeros", name="count")

    def update_state(self, labels, logits, mask):
        # The label's logit against the maximum: keras.ops.argmax makes five more passes over
        # [batch, tgt_len, vocab] to tell -0.0 from 0.0 (~9% of a training step). A tie with
        # another token counts as right.
        label_logits = ops.take_along_axis(logits, ops.cast(labels, "int32")[..., None], axis=-1)
        weights = ops.cast(mask, "float32")
        hits = ops.cast(label_logits[..., 0] >= ops.max(logits, axis=-1), "float32")
        self.correct.assign_add(ops.sum(hits * weights))
        self.count.assign_add(ops.sum(weights))

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
