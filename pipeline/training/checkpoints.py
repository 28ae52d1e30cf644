"""Training checkpoints: what they hold, and reading a model's weights back from them.

A checkpoint holds the model, its Adam optimizer and the run's state (`run_state`). Keras 3
does not track layers kept in Python lists (stacked recurrent layers, Transformer layers) for
`tf.train.Checkpoint`; their weights reach the checkpoint through the optimizer's list of the
model's trainable variables. So whatever reads a checkpoint builds the same optimizer as
training, from the same configuration: `training_checkpoint` is the one place that says how.
"""

import numpy as np
import tensorflow as tf

from pipeline.core.errors import UnusableFileError, UserError, first_line
from pipeline.training.optimizers import make_optimizer
from pipeline.training.run_state import training_checkpoint


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
