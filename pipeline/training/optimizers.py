"""Training's optimizer: Adam with a fused update, global-norm clipping that holds under any
`tf.distribute` strategy, and loss scaling for mixed precision."""

import keras
import tensorflow as tf

from pipeline.model_types.training_twins import replicas_in_sync
from pipeline.training.schedules import schedule_from_config


@keras.saving.register_keras_serializable(package="seq2seq")
class FusedAdam(keras.optimizers.Adam):
    """Keras' Adam, each variable's update run as TensorFlow's fused Adam kernel: the same
    formula in one pass over the variable and its two moments, where Keras' update is ten
    element-wise ops, each a pass over the variable.

    Under a `tf.distribute` strategy, `global_clipnorm` clips the replicas' summed gradient:
    Keras clips each replica's share before adding them up, which differs from one device's
    step whenever clipping acts (`tests/test_distribute.py`).
    """

    def _clip_gradients(self, grads):
        if self.global_clipnorm and replicas_in_sync() > 1:
            return grads  # clipped once summed, in `_all_reduce_sum_gradients`
        return super()._clip_gradients(grads)

    def _all_reduce_sum_gradients(self, grads_and_vars):
        summed = super()._all_reduce_sum_gradients(grads_and_vars)
        if not (self.global_clipnorm and replicas_in_sync() > 1):
            return summed
        grads, variables = zip(*summed)
        return list(zip(super()._clip_gradients(list(grads)), variables))

    def update_step(self, gradient, variable, learning_rate):
        if self.amsgrad:
            return super().update_step(gradient, variable, learning_rate)
        dtype = variable.dtype
        step = tf.cast(self.iterations + 1, dtype)
        index = self._get_variable_index(variable)
        tf.raw_ops.ResourceApplyAdam(
            var=variable.handle,
            m=self._momentums[index].handle,
            v=self._velocities[index].handle,
            beta1_power=tf.pow(tf.cast(self.beta_1, dtype), step),
            beta2_power=tf.pow(tf.cast(self.beta_2, dtype), step),
            lr=tf.cast(learning_rate, dtype),
            beta1=tf.cast(self.beta_1, dtype),
            beta2=tf.cast(self.beta_2, dtype),
            epsilon=tf.cast(self.epsilon, dtype),
            grad=tf.cast(tf.convert_to_tensor(gradient), dtype),
        )


class StepCountingLossScaleOptimizer(keras.optimizers.LossScaleOptimizer):
    """Keras' dynamic loss scaling, with `iterations` counting every step.

    Keras' `LossScaleOptimizer` skips a step whose scaled gradients overflow without counting
    it, but checkpoint numbers, epoch boundaries and the training stream's position are
    counted in `iterations`: a resumed run would replay batches. Here a skipped step counts.
    """

    def _stateful_handle_non_finite_grads(self):
        super()._stateful_handle_non_finite_grads()
        self.inner_optimizer.iterations.assign_add(1)


def make_optimizer(train, schedule=None):
    """Training's optimizer: Adam on `schedule` (by default the configured one) with the
    configured `adam_beta2`, global-norm clipping (of the unscaled gradients), under dynamic
    loss scaling when training in mixed_float16."""
    schedule = schedule or schedule_from_config(train, train["learning_rate"])
    adam = FusedAdam(
        schedule, beta_2=train["adam_beta2"], global_clipnorm=train["clip_norm"] or None
    )
    if train["precision"] == "mixed_float16":  # float16 gradients underflow without scaling
        return StepCountingLossScaleOptimizer(adam)
    return adam
