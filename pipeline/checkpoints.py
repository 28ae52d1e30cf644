"""Training checkpoints: what they hold, and reading a model's weights back from them.

A checkpoint holds the model, its Adam optimizer and the run's state (`run_state`). Keras 3
does not track layers kept in Python lists (stacked recurrent layers, Transformer layers) for
`tf.train.Checkpoint`; their weights reach the checkpoint through the optimizer's list of the
model's trainable variables. So whatever reads a checkpoint builds the same optimizer as
training, from the same configuration: `training_checkpoint` is the one place that says how.
"""

import keras
import numpy as np
import tensorflow as tf

from pipeline.errors import UnusableFileError, UserError, first_line
from pipeline.run_state import training_checkpoint
from pipeline.schedules import schedule_from_config


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
        if self.global_clipnorm and _replicas_in_sync() > 1:
            return grads  # clipped once summed, in `_all_reduce_sum_gradients`
        return super()._clip_gradients(grads)

    def _all_reduce_sum_gradients(self, grads_and_vars):
        summed = super()._all_reduce_sum_gradients(grads_and_vars)
        if not (self.global_clipnorm and _replicas_in_sync() > 1):
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


def _replicas_in_sync():
    context = tf.distribute.get_replica_context()
    return 1 if context is None else context.num_replicas_in_sync


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


def last_checkpoints(checkpoint_dir, count, up_to_step=None):
    """The `count` most recent checkpoint prefixes in `checkpoint_dir` (those saved at or
    before training step `up_to_step`, when given), oldest first."""
    state = tf.train.get_checkpoint_state(str(checkpoint_dir))
    paths = list(state.all_model_checkpoint_paths) if state else []
    if not paths:
        raise UserError(f"{checkpoint_dir}: no checkpoints here")
    if up_to_step is not None:
        steps = [int(path.rsplit("-", 1)[1]) for path in paths]  # saved as ckpt-STEP
        kept = ", ".join(map(str, steps))
        paths = [path for path, step in zip(paths, steps) if step <= up_to_step]
        if not paths:
            raise UserError(
                f"{checkpoint_dir}: no checkpoint at or before step {up_to_step} is kept "
                f"(steps {kept})"
            )
    return paths[-count:]


def average_checkpoints(model, train, paths):
    """Sets `model`'s weights to the element-wise mean of its weights in each checkpoint.

    `train` is the training configuration the checkpoints were written under (it fixes the
    optimizer's layout); a compiled model reads them through its own optimizer, whose state
    is then the last checkpoint's. A checkpoint that does not hold this model is a
    `UnusableFileError`, and then the model is left unchanged.
    """
    if not paths:
        raise UserError("no checkpoints to average")
    original = model.get_weights()
    # A compiled model tracks its optimizer: the checkpoint's optimizer must be that one.
    optimizer = getattr(model, "optimizer", None) or make_optimizer(train)
    if not optimizer.built:
        optimizer.build(model.trainable_variables)
    reader = training_checkpoint(model, optimizer)
    total = [np.zeros(weight.shape, dtype=np.float64) for weight in original]
    try:
        for path in paths:
            try:
                reader.restore(path).expect_partial().assert_existing_objects_matched()
            except Exception as error:  # the checkpoint reader raises many types
                raise UnusableFileError(
                    path,
                    f"cannot read this model's weights from the checkpoint "
                    f"({first_line(error)}); nothing was changed",
                ) from None
            for accumulated, weight in zip(total, model.get_weights(), strict=True):
                accumulated += weight
    except BaseException:
        model.set_weights(original)
        raise
    model.set_weights(
        [
            (accumulated / len(paths)).astype(weight.dtype)
            for accumulated, weight in zip(total, original, strict=True)
        ]
    )
