"""The models of `layers/` as training runs them under any `tf.distribute` strategy.

The layers keep to Keras' public API and to one device's objective. What training across
replicas adds lives here: the loss averaged over every replica's target tokens (or
sentences, `train.loss_normalization`), and two Keras
behaviours worked around (each pinned by `tests/test_distribute.py`, which fails when Keras
changes them). `build_model(..., for_training=True)` builds these twins; what is translated,
saved and exported is always the plain model, which takes the trained weights.
"""

import tensorflow as tf
from keras import ops

import layers
from layers.token_losses import projected_token_cross_entropy


def sum_over_replicas(value):
    """`value` summed over the replicas of a `tf.distribute` step; itself with one replica."""
    context = tf.distribute.get_replica_context()
    if context is None or context.num_replicas_in_sync == 1:
        return value
    return context.all_reduce(tf.distribute.ReduceOp.SUM, value)


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
    `loss_normalization` (`pipeline.config.LOSS_NORMALIZATIONS`) is set by the trainer."""

    loss_normalization = "tokens"

    def compute_loss(self, x=None, y=None, y_pred=None, sample_weight=None, training=True):
        # Each replica's loss sum over the global token (or sentence) count: tf.distribute adds
        # the replicas' gradients, which then add up to the gradient of the mean over all their
        # tokens, however unevenly the tokens fall. With one replica, the plain mean.
        loss_sum, tokens = self.token_loss(y, y_pred)
        by_sentences = self.loss_normalization == "sentences"
        count = ops.cast(ops.shape(y)[0], "float32") if by_sentences else tokens
        loss = ops.divide_no_nan(loss_sum, sum_over_replicas(count))
        if self.losses:  # each replica its share
            loss = loss + ops.sum(self.losses) / sum_over_replicas(1.0)
        return loss

    def train_step(self, data):
        return rank_one_logs(super().train_step(data))

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
        loss_sum, nll_sum, hits = projected_token_cross_entropy(
            tf.boolean_mask(y_pred, mask), tf.boolean_mask(y, mask), self.output_kernel(),
            self.label_smoothing,
        )  # fmt: skip
        tokens = ops.sum(ops.cast(mask, "float32"))
        self.token_accuracy.add_counts(hits, tokens)
        self.perplexity.update_state(nll_sum, mask)
        return loss_sum, tokens
