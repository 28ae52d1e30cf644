"""Training checkpoints: what they hold, and reading a model's weights back from them.

A checkpoint holds the model, its Adam optimizer and the run's state (`run_state`). Keras 3
does not track layers kept in Python lists (stacked recurrent layers, Transformer layers) for
`tf.train.Checkpoint`; their weights reach the checkpoint through the optimizer's list of the
model's trainable variables. So whatever reads a checkpoint builds the same optimizer as
training, from the same configuration: `training_checkpoint` is the one place that says how.
"""

import dataclasses
import json
from pathlib import Path

import numpy as np
import tensorflow as tf

from pipeline.core.atomic_files import write_text_atomically
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


BEST_DIR = "best"  # under the checkpoint folder: the best checkpoints (`train.keep_best`)
BEST_INDEX = "best.json"  # there: which they are, best first, with their scores


@dataclasses.dataclass(frozen=True)
class StoppingMetric:
    """What early stopping and `train.keep_best` watch (one of `WATCHED_METRICS`, by
    `pipeline.config.STOPPING_METRICS` name): the epoch logs' key, and whether a higher value
    is better."""

    name: str
    log_key: str
    higher_is_better: bool
    description: str

    def value(self, logs):
        """The epoch's value (None when this epoch did not measure it)."""
        value = (logs or {}).get(self.log_key)
        return None if value is None else float(value)

    def better(self, value, than):
        return value > than if self.higher_is_better else value < than


WATCHED_METRICS = {  # by pipeline.config.STOPPING_METRICS name
    "loss": StoppingMetric("loss", "val_loss", False, "validation loss"),
    "bleu": StoppingMetric("bleu", "val_bleu", True, "validation BLEU"),
    "chrf": StoppingMetric("chrf", "val_chrf", True, "validation chrF"),
}


class BestCheckpoints:
    """The `count` best checkpoints of a run by `metric`, in `checkpoint_dir/best/`, and their
    index (`best.json`: each one's name, step, epoch and value, best first). The index is
    replaced atomically after a new checkpoint is written and before a dropped one is deleted,
    so it names only complete checkpoints; files it does not name are left-overs of an
    interrupted update and go at the next."""

    def __init__(self, checkpoint_dir, count, metric):
        self.directory = Path(checkpoint_dir) / BEST_DIR
        self.count, self.metric = count, metric

    def entries(self):
        return read_best_index(self.directory.parent)

    def offer(self, checkpoint, step, epoch, value):
        """Keeps `checkpoint` (a `tf.train.Checkpoint` at `step`, the end of `epoch`) when
        `value` ranks among the best; returns whether it was kept."""
        entries = [e for e in self.entries() if e["step"] != step]
        ranked = sorted([*entries, {"value": value, "step": step}],
                        key=self._order)[: self.count]  # fmt: skip
        if not any(entry["step"] == step for entry in ranked):
            return False
        self.directory.mkdir(parents=True, exist_ok=True)
        name = f"ckpt-{step}"
        checkpoint.write(str(self.directory / name))
        new = {"checkpoint": name, "step": step, "epoch": epoch, "metric": self.metric.name,
               "value": value}  # fmt: skip
        kept = [new if entry["step"] == step else entry for entry in ranked]
        write_text_atomically(self.directory / BEST_INDEX, json.dumps(kept, indent=1) + "\n")
        named = {entry["checkpoint"] for entry in kept}
        for path in self.directory.glob("ckpt-*"):
            if path.name.split(".", 1)[0] not in named:
                path.unlink(missing_ok=True)
        return True

    def _order(self, entry):
        # Best first; between equal values, the earlier checkpoint.
        return (-entry["value"] if self.metric.higher_is_better else entry["value"],
                entry["step"])  # fmt: skip


def read_best_index(checkpoint_dir):
    """`checkpoint_dir/best/best.json`'s entries, best first ([] when there is none)."""
    path = Path(checkpoint_dir) / BEST_DIR / BEST_INDEX
    if not path.exists():
        return []
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except ValueError as error:
        raise UnusableFileError(
            path, f"not a best-checkpoint index ({first_line(error)})"
        ) from None


def best_checkpoints(checkpoint_dir, count):
    """The `count` best kept checkpoints (`train.keep_best`) as (prefix, entry), best first."""
    entries = read_best_index(checkpoint_dir)
    if not entries:
        raise UserError(
            f"{checkpoint_dir}: no best checkpoints kept (train with train.keep_best: N)"
        )
    directory = Path(checkpoint_dir) / BEST_DIR
    return [(str(directory / entry["checkpoint"]), entry) for entry in entries[:count]]
