"""The models of `layers/` as training runs them under any `tf.distribute` strategy.

The layers keep to Keras' public API and to one device's objective. What training across
replicas and micro-batches adds lives here: the loss averaged over every replica's target
tokens (or sentences, `train.loss_normalization`), gradient accumulation (one update from
several micro-batches, `train.accumulate_steps`), and two Keras
behaviours worked around (each pinned by `tests/test_distribute.py`, which fails when Keras
changes them). `build_model(..., for_training=True)` builds these twins; what is translated,
saved and exported is always the plain model, which takes the trained weights.
"""

import tensorflow as tf
from keras import ops

import layers
from layers.keras_internals import loss_tracker, unscale_loss_for_distribution
from layers.token_losses import projected_token_cross_entropy
from pipeline.core import micro_batches


def sum_over_replicas(value):
    """`value` summed over the replicas of a `tf.distribute` step; itself with one replica."""
    if replicas_in_sync() == 1:
        return value
    return tf.distribute.get_replica_context().all_reduce(tf.distribute.ReduceOp.SUM, value)


def replicas_in_sync():
    """The replicas of the current `tf.distribute` step (1 outside one)."""
    context = tf.distribute.get_replica_context()
    return 1 if context is None else context.num_replicas_in_sync


def rank_one_logs(logs):
    """Works around Keras' reduction of a step's logs under MultiWorkerMirroredStrategy:
    `keras/src/backend/tensorflow/trainer.py: reduce_per_replica` averages each replica's
    value with `strategy.reduce("MEAN", v, axis=0)`, which a scalar lacks. Each log gets that
    axis (the values are equal on every replica, being synchronised metrics)."""
    if not isinstance(tf.distribute.get_strategy(), tf.distribute.MultiWorkerMirroredStrategy):
        return logs
    return {name: ops.reshape(value, [1]) for name, value in logs.items()}


class DistributedTraining:
    """Mixin for an `layers.EncoderDecoderModel` subclass: its training under any strategy.
    `loss_normalization` (`pipeline.config.LOSS_NORMALIZATIONS`) and `accumulate_steps` (the
    micro-batches of an update, `pipeline.core.micro_batches`) are set by the trainer."""

    loss_normalization = "tokens"
    accumulate_steps = 1

    def compute_loss(self, x=None, y=None, y_pred=None, sample_weight=None, training=True):
        # Each replica's loss sum over the global token (or sentence) count: tf.distribute adds
        # the replicas' gradients, which then add up to the gradient of the mean over all their
        # tokens, however unevenly the tokens fall. With one replica, the plain mean.
        loss_sum, tokens = self.token_loss(y, y_pred)
        by_sentences = self.loss_normalization == "sentences"
        count = ops.cast(ops.shape(y)[0], "float32") if by_sentences else tokens
        return self.share_of_loss(loss_sum, sum_over_replicas(count), parts=1)

    def share_of_loss(self, loss_sum, total, parts):
        """One part's share of the update's loss: its loss sum over the update's `total` count,
        and its share of any added losses (one of `parts` on each replica)."""
        loss = ops.divide_no_nan(loss_sum, total)
        if self.losses:
            loss = loss + ops.sum(self.losses) / float(replicas_in_sync() * parts)
        return loss

    def train_step(self, data):
        if self.accumulate_steps == 1:
            return rank_one_logs(super().train_step(data))
        return rank_one_logs(self.accumulated_train_step(data))

    def accumulated_train_step(self, grouped):
        """One update from the micro-batches of `grouped`: each one's gradient of its loss sum
        over the whole update's count (every micro-batch on every replica), added up and
        applied once, which is the update that one batch of their union gives. The
        micro-batches run one after another, so memory holds one at a time."""
        by_sentences = self.loss_normalization == "sentences"
        count = (micro_batches.sentences if by_sentences else micro_batches.target_tokens)(grouped)
        total = sum_over_replicas(count)
        weights = self.trainable_weights

        def accumulate(index, loss, gradients):
            x, y = micro_batches.micro_batch(grouped, index)
            with tf.GradientTape() as tape:
                loss_sum, _ = self.token_loss(y, self(x, training=True))
                part = self.share_of_loss(loss_sum, total, self.accumulate_steps)
                scaled = self.optimizer.scale_loss(part)
            added = tape.gradient(scaled, weights)
            gradients = [
                sum_ if new is None else sum_ + tf.convert_to_tensor(new)
                for sum_, new in zip(gradients, added, strict=True)
            ]
            return index + 1, loss + part, gradients

        _, loss, gradients = tf.while_loop(
            lambda index, *_: index < self.accumulate_steps,
            accumulate,
            (tf.constant(0), tf.constant(0.0), [tf.zeros(w.shape, w.dtype) for w in weights]),
            parallel_iterations=1,
        )
        loss_tracker(self).update_state(unscale_loss_for_distribution(loss),
                                        sample_weight=micro_batches.sentences(grouped))  # fmt: skip
        self.optimizer.apply_gradients(zip(gradients, weights))
        return self.get_metrics_result()

    def test_step(self, data):
        return rank_one_logs(super().test_step(data))

    def _maybe_symbolic_build(self, iterator=None, data_batch=None):
        # Works around `keras/src/backend/tensorflow/trainer.py: _maybe_symbolic_build`: under
        # a strategy, Keras builds from a first batch averaged over the replicas, which fails
        # when replicas hold batches of different lengths (length bucketing) and would skip
        # that batch. Built layers and a built optimizer need no sample batch.
        layers_built = all(layer.built for layer in self._flatten_layers())
        if layers_built and self.optimizer is not None and self.optimizer.built:
            return
        super()._maybe_symbolic_build(iterator=iterator, data_batch=data_batch)


class TrainingRecurrentSeq2Seq(DistributedTraining, layers.RecurrentSeq2Seq):
    """`layers.RecurrentSeq2Seq` as training runs it (never saved: see the module)."""


class TrainingTransformer(DistributedTraining, layers.Transformer):
    """`layers.Transformer` as training runs it (never saved: see the module).

    Its `call` stops before the output projection, returning `output_features`; the loss
    projects the real target positions only, a block at a time
    (`layers.token_losses.projected_token_cross_entropy`), not every padded position at once.
    """

    def call(self, inputs, training=None):
        return self.output_features(inputs, training=training)[0]

    def token_loss(self, y, y_pred):
        mask = ops.not_equal(y, self.pad_id)
        features, kernel = tf.boolean_mask(y_pred, mask), self.output_kernel()
        bias = self.logit_bias()
        if bias is not None:  # the bias as one more feature, always 1
            features = tf.concat([features, tf.ones_like(features[:, :1])], axis=1)
            kernel = tf.concat([tf.cast(kernel, "float32"), bias[None]], axis=0)
        loss_sum, nll_sum, hits = projected_token_cross_entropy(
            features, tf.boolean_mask(y, mask), kernel, self.label_smoothing,
            self.smoothing_spread(),
        )  # fmt: skip
        tokens = ops.sum(ops.cast(mask, "float32"))
        self.token_accuracy.add_counts(hits, tokens)
        self.perplexity.update_state(nll_sum, mask)
        return loss_sum, tokens
