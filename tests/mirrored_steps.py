"""Trains the smoke model (`transformer`: a tiny Transformer) for a few steps, each on a
global batch made of parts of unequal lengths and token counts, with training's optimizer
clipping every step, from the same start four ways:

- `single`: one device, each step one batch of all its parts;
- `mirrored`: two logical CPU devices, each replica one batch of its half of the parts;
- `accumulated`: one device, each update accumulated over every part (micro-batches);
- `mirrored_accumulated`: two replicas, each accumulating over its half of the parts.

Prints, for each variant, each run's per-step losses and its final weights' largest
difference from `single`'s, as JSON. A variant's options: `transformer`, `parts=N`
micro-batches per replica (default 3), and any configuration override
(`train.label_smoothing=0`, `train.loss_normalization=sentences`).

Run as a script, the variants as JSON (`python tests/mirrored_steps.py '{"name": ["transformer",
"parts=3"], ...}'`): the CPU must be split before TensorFlow initialises, which a test process
has already done; one process runs every variant, so that TensorFlow starts once.
"""

import json
import os
import sys

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")
sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import tensorflow as tf  # noqa: E402

tf.config.set_logical_device_configuration(
    tf.config.list_physical_devices("CPU")[0], [tf.config.LogicalDeviceConfiguration()] * 2
)

import keras  # noqa: E402
import numpy as np  # noqa: E402

from pipeline.config import PROJECT_ROOT, load_config  # noqa: E402
from pipeline.core import micro_batches  # noqa: E402
from pipeline.model_types.builder import build_model  # noqa: E402
from pipeline.training.optimizers import FusedAdam  # noqa: E402

STEPS, ROWS, VOCAB = 6, 8, 300
# Adam's first steps are the gradient's sign times the learning rate, whatever its size: with
# its usual epsilon, a gradient that is 0 in exact arithmetic (an attention key's bias) moves
# by the sign of float noise. Above that noise, each run follows its gradients.
ADAM_EPSILON = 1e-3
TRANSFORMER = [
    "model.type=transformer", "model.model_dim=16", "model.num_heads=2", "model.ffn_dim=32",
    "model.encoder_layers=1", "model.decoder_layers=1", "train.label_smoothing=0.1",
]  # fmt: skip
SPEC = (
    {
        "source_ids": tf.TensorSpec([None, None], tf.int32),
        "target_input_ids": tf.TensorSpec([None, None], tf.int32),
    },
    tf.TensorSpec([None, None], tf.int32),
)


def part_batch(rng):
    """A right-padded batch whose rows have random lengths (so token counts differ)."""
    source_len, target_len = rng.integers(3, 15), rng.integers(3, 15)
    source = np.zeros((ROWS, source_len), np.int32)
    target = np.zeros((ROWS, target_len + 1), np.int32)
    for row in range(ROWS):
        n, m = rng.integers(1, source_len + 1), rng.integers(1, target_len + 1)
        source[row, :n] = rng.integers(4, VOCAB, n)
        target[row, : m + 1] = [2, *rng.integers(4, VOCAB, m)]
    labels = np.zeros_like(target)
    for row in range(ROWS):
        tokens = target[row][target[row] != 0][1:]
        labels[row, : len(tokens) + 1] = [*tokens, 3]
    return source, target, labels


def pad_to(array, width):
    return np.pad(array, [(0, 0), (0, width - array.shape[1])])


def union(parts):
    """The parts as one batch, padded to the longest."""
    columns = list(zip(*parts))
    out = [np.concatenate([pad_to(p, max(x.shape[1] for x in column)) for p in column])
           for column in columns]  # fmt: skip
    return {"source_ids": out[0], "target_input_ids": out[1]}, out[2]


def as_example(part):
    source, target, labels = part
    return {"source_ids": source, "target_input_ids": target}, labels


def train(strategy, dataset, config, initial_weights, accumulate_steps=1):
    with strategy.scope():
        model = build_model(config, VOCAB, VOCAB, for_training=True)
        model.loss_normalization = config["train"]["loss_normalization"]
        model.accumulate_steps = accumulate_steps
        optimizer = FusedAdam(1e-2, epsilon=ADAM_EPSILON,
                              global_clipnorm=config["train"]["clip_norm"])  # fmt: skip
        model.compile(optimizer=optimizer)
        optimizer.build(model.trainable_variables)
    if initial_weights is not None:
        model.set_weights(initial_weights)
    losses = []
    record = keras.callbacks.LambdaCallback(
        on_train_batch_end=lambda batch, logs: losses.append(float(logs["loss"]))
    )
    model.fit(dataset, epochs=1, steps_per_epoch=STEPS, callbacks=[record], verbose=0)
    return losses, model.get_weights()


def runs_of(arguments, mirrored):
    """{run name: (losses, weights)} of the variant of `arguments`."""
    options = dict(a.split("=", 1) for a in arguments if a.startswith("parts="))
    parts = int(options.get("parts", 3))
    overrides = ["train.clip_norm=0.05"]  # below every step's gradient norm here
    overrides += TRANSFORMER if "transformer" in arguments else []
    overrides += [a for a in arguments if "=" in a and not a.startswith("parts=")]
    config = load_config(PROJECT_ROOT / "configs" / "smoke.yaml", overrides)
    rng = np.random.default_rng(3)
    steps = [[part_batch(rng) for _ in range(2 * parts)] for _ in range(STEPS)]

    def stream(batches):
        return lambda context=None: tf.data.Dataset.from_generator(batches, output_signature=SPEC)

    def each_part():  # replica 0 takes the first half of a step's parts, replica 1 the second
        for step in steps:
            for half in (step[:parts], step[parts:]):
                yield from map(as_example, half)

    def each_half():
        for step in steps:
            yield from (union(step[:parts]), union(step[parts:]))

    keras.utils.set_random_seed(1)
    with tf.distribute.get_strategy().scope():
        start = build_model(config, VOCAB, VOCAB).get_weights()
    one_device = tf.distribute.get_strategy()
    return {
        "single": train(one_device, stream(lambda: (union(step) for step in steps))(), config,
                        start),
        "mirrored": train(mirrored, mirrored.distribute_datasets_from_function(
            stream(each_half)), config, start),
        "accumulated": train(one_device, micro_batches.group(stream(
            lambda: (as_example(p) for step in steps for p in step))(), 2 * parts), config,
            start, accumulate_steps=2 * parts),
        "mirrored_accumulated": train(mirrored, mirrored.distribute_datasets_from_function(
            lambda context: micro_batches.group(stream(each_part)(), parts)), config, start,
            accumulate_steps=parts),
    }  # fmt: skip


def report(runs, replicas):
    single_weights = runs["single"][1]
    return {
        "replicas": replicas,
        **{name: {"losses": losses, "max_weight_difference": max(
            float(np.abs(a - b).max()) for a, b in zip(single_weights, weights))}
           for name, (losses, weights) in runs.items()},
    }  # fmt: skip


def main():
    mirrored = tf.distribute.MirroredStrategy(
        ["/cpu:0", "/cpu:1"], cross_device_ops=tf.distribute.ReductionToOneDevice()
    )
    variants = json.loads(sys.argv[1])
    print(json.dumps({name: report(runs_of(arguments, mirrored), mirrored.num_replicas_in_sync)
                      for name, arguments in variants.items()}))  # fmt: skip


if __name__ == "__main__":
    main()
