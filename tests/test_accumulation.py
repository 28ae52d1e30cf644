"""Gradient accumulation: the settings and their checks, the micro-batches of an update as
one element, a training run whose updates are made of micro-batches, and no state left
between updates. That the accumulated update equals one batch of the union's, on one device
and on two replicas: `tests/test_distribute.py`."""

import re

import keras
import numpy as np
import pytest
import tensorflow as tf

from helpers import SMOKE
from pipeline import train
from pipeline.config import load_config
from pipeline.core import micro_batches
from pipeline.core.errors import UserError
from pipeline.model_types.builder import build_model
from pipeline.training.accumulation import describe, micro_batches_per_update
from pipeline.training.optimizers import make_optimizer

QUICK = ["--set", "train.bleu_every_epochs=0", "--set", "data.test_source=null",
         "--set", "data.test_target=null", "--set", "export.after_training=false"]  # fmt: skip


def smoke(*overrides):
    return load_config(SMOKE, list(overrides))


@pytest.mark.parametrize(
    ("overrides", "message"),
    [
        (["train.accumulate_steps=2", "train.effective_batch_size=128"],
         "train.effective_batch_size and train.accumulate_steps both set the accumulation"),
        (["train.effective_batch_tokens=4096"],
         "train.effective_batch_tokens needs train.batch_tokens"),
        (["train.batch_tokens=512", "train.effective_batch_size=64"],
         "train.effective_batch_size needs batches of train.batch_size pairs"),
        (["train.accumulate_steps=0"], "train.accumulate_steps"),
    ],
)  # fmt: skip
def test_contradicting_settings_are_refused_naming_the_keys(overrides, message):
    with pytest.raises(UserError, match=re.escape(message)):
        smoke(*overrides)


def test_the_effective_batch_sets_the_accumulation_from_the_replicas():
    tokens = smoke("train.batch_tokens=1024", "train.effective_batch_tokens=8192")["train"]
    assert micro_batches_per_update(tokens, 1) == 8
    assert micro_batches_per_update(tokens, 2) == 4
    assert micro_batches_per_update(tokens, 8) == 1
    assert describe(tokens, 2, 4) == (
        "Updates of 4 micro-batch(es) x 2 replica(s) x 1,024 tokens (at most) = 8,192 "
        "(train.effective_batch_tokens)"
    )
    pairs = smoke("train.batch_size=32", "train.effective_batch_size=96")["train"]
    assert micro_batches_per_update(pairs, 1) == 3
    with pytest.raises(UserError, match=re.escape(
        "train.effective_batch_size (96) is not a multiple of 2 replica(s) x "
        "train.batch_size (32 pairs); choose a multiple of 64"
    )):  # fmt: skip
        micro_batches_per_update(pairs, 2)
    assert micro_batches_per_update(smoke("train.accumulate_steps=5")["train"], 4) == 5


def batch(rows, source_length, target_length, seed):
    """A padded batch as the training stream makes it: each side padded to its longest row,
    every source non-empty, every label ending in </s>."""
    rng = np.random.default_rng(seed)
    source = np.zeros((rows, source_length), np.int32)
    target_input = np.zeros((rows, target_length), np.int32)
    labels = np.zeros((rows, target_length), np.int32)
    for row in range(rows):
        n = source_length if row == 0 else rng.integers(1, source_length + 1)
        m = target_length if row == rows - 1 else rng.integers(1, target_length + 1)
        source[row, :n] = rng.integers(4, 50, n)
        tokens = rng.integers(4, 50, m - 1)
        target_input[row, :m] = [2, *tokens]
        labels[row, :m] = [*tokens, 3]
    return {"source_ids": source, "target_input_ids": target_input}, labels


SPEC = (
    {"source_ids": tf.TensorSpec([None, None], tf.int32),
     "target_input_ids": tf.TensorSpec([None, None], tf.int32)},
    tf.TensorSpec([None, None], tf.int32),
)  # fmt: skip


def stream(batches):
    return tf.data.Dataset.from_generator(lambda: iter(batches), output_signature=SPEC)


def test_a_group_gives_back_each_batch_with_its_own_shape():
    batches = [batch(5, 7, 3, 0), batch(2, 12, 9, 1), batch(9, 1, 1, 2)]
    (grouped,) = list(micro_batches.group(stream(batches), 3))
    assert grouped[1].shape == (3, 9, 9)
    for index, (inputs, labels) in enumerate(batches):
        got_inputs, got_labels = micro_batches.micro_batch(grouped, index)
        for key in inputs:
            np.testing.assert_array_equal(got_inputs[key], inputs[key])
        np.testing.assert_array_equal(got_labels, labels)
    assert float(micro_batches.sentences(grouped)) == 16
    assert float(micro_batches.target_tokens(grouped)) == sum(
        int((labels != 0).sum()) for _, labels in batches
    )


def train_steps(config, batches, count, start, checkpoint=None):
    """`start`'s weights trained on `batches` grouped by `count`; with `checkpoint` (a path),
    the model and optimizer are restored from it first."""
    model = build_model(config, 60, 60, for_training=True)
    model.accumulate_steps = count
    optimizer = make_optimizer(config["train"])
    model.compile(optimizer=optimizer)
    optimizer.build(model.trainable_variables)
    model.set_weights(start)
    if checkpoint:
        tf.train.Checkpoint(model=model, optimizer=optimizer).read(checkpoint)
    updates = len(batches) // count
    model.fit(micro_batches.group(stream(batches), count), steps_per_epoch=updates,
              shuffle=False, verbose=0)  # fmt: skip
    return model, optimizer


def test_a_run_resumed_between_updates_gives_the_uninterrupted_runs_weights(tmp_path):
    """An update is one training step: what a checkpoint holds (model, optimizer) is all the
    state, and a stop request waits for the step's end, so no micro-batch is half counted."""
    config = smoke()
    keras.utils.set_random_seed(0)
    start = build_model(config, 60, 60).get_weights()
    batches = [batch(4 + i % 3, 3 + i, 2 + (5 * i) % 7, i) for i in range(12)]
    whole, _ = train_steps(config, batches, 3, start)
    first, optimizer = train_steps(config, batches[:6], 3, start)
    saved = tf.train.Checkpoint(model=first, optimizer=optimizer).write(str(tmp_path / "ckpt"))
    resumed, resumed_optimizer = train_steps(config, batches[6:], 3, start, checkpoint=saved)
    assert int(resumed_optimizer.iterations.numpy()) == 4  # updates, not micro-batches
    for a, b in zip(whole.get_weights(), resumed.get_weights(), strict=True):
        np.testing.assert_allclose(a, b, rtol=1e-6, atol=1e-7)


@pytest.mark.parametrize("precision", ["float32", "mixed_bfloat16"])
def test_training_counts_updates_of_accumulated_micro_batches(tmp_path, capsys, precision):
    history = train.main(["--config", str(SMOKE), "--workdir", str(tmp_path), *QUICK,
                          "--set", "train.effective_batch_size=64",
                          "--set", "train.steps_per_epoch=null",
                          "--set", f"train.precision={precision}"])  # fmt: skip
    output = capsys.readouterr().out
    assert "Updates of 2 micro-batch(es) x 1 replica(s) x 32 pairs = 64 " in output
    # Smoke's 1,014 pairs (some over-long) in batches of 64 per update: about 14 steps a pass.
    steps = int(re.search(r"Epochs of (\d+) steps", output).group(1))
    assert 10 <= steps <= 17
    assert all(np.isfinite(history["loss"])) and history["loss"][-1] < history["loss"][0]
    checkpoints = sorted(int(p.name[5:-6]) for p in (tmp_path / "checkpoints").glob("*.index"))
    assert checkpoints[-1] == 2 * steps  # the step counter counts updates
