"""Trains the smoke model (and with `python tests/mirrored_steps.py transformer`, a tiny
Transformer) for a few steps on one device and, from the same start, mirrored over two logical
CPU devices with each global batch split in halves of unequal token counts, with training's
optimizer clipping every step. Prints both runs' per-step losses and final weights' largest
difference, as JSON.

Run as a script (`python tests/mirrored_steps.py`): the CPU must be split before TensorFlow
initialises, which a test process has already done.
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
from pipeline.model_types.builder import build_model  # noqa: E402
from pipeline.training.optimizers import FusedAdam  # noqa: E402

STEPS, HALF, VOCAB = 6, 8, 300
TRANSFORMER = [
    "model.type=transformer", "model.model_dim=16", "model.num_heads=2", "model.ffn_dim=32",
    "model.encoder_layers=1", "model.decoder_layers=1", "train.label_smoothing=0.1",
]  # fmt: skip


def half_batch(rng):
    """A right-padded half batch whose rows have random lengths (so token counts differ)."""
    source_len, target_len = rng.integers(3, 15), rng.integers(3, 15)
    source = np.zeros((HALF, source_len), np.int32)
    target = np.zeros((HALF, target_len + 1), np.int32)
    for row in range(HALF):
        n, m = rng.integers(1, source_len + 1), rng.integers(1, target_len + 1)
        source[row, :n] = rng.integers(4, VOCAB, n)
        target[row, : m + 1] = [2, *rng.integers(4, VOCAB, m)]
    labels = np.zeros_like(target)
    for row in range(HALF):
        tokens = target[row][target[row] != 0][1:]
        labels[row, : len(tokens) + 1] = [*tokens, 3]
    return source, target, labels


def pad_to(array, width):
    return np.pad(array, [(0, 0), (0, width - array.shape[1])])


def global_batch(halves):
    """The two halves as one batch, padded to the longer one."""
    parts = list(zip(*halves))
    out = [np.concatenate([pad_to(p, max(x.shape[1] for x in group)) for p in group])
           for group in parts]  # fmt: skip
    return {"source_ids": out[0], "target_input_ids": out[1]}, out[2]


def train(strategy, dataset, config, initial_weights):
    with strategy.scope():
        model = build_model(config, VOCAB, VOCAB, for_training=True)
        optimizer = FusedAdam(1e-2, global_clipnorm=config["train"]["clip_norm"])
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


def main():
    overrides = ["train.clip_norm=0.05"]  # below every step's gradient norm here
    if sys.argv[1:] == ["transformer"]:
        overrides += TRANSFORMER
    config = load_config(PROJECT_ROOT / "configs" / "smoke.yaml", overrides)
    rng = np.random.default_rng(3)
    steps = [(half_batch(rng), half_batch(rng)) for _ in range(STEPS)]

    keras.utils.set_random_seed(1)
    single = tf.data.Dataset.from_generator(
        lambda: (global_batch(halves) for halves in steps),
        output_signature=(
            {
                "source_ids": tf.TensorSpec([None, None], tf.int32),
                "target_input_ids": tf.TensorSpec([None, None], tf.int32),
            },
            tf.TensorSpec([None, None], tf.int32),
        ),
    )
    with tf.distribute.get_strategy().scope():
        start = build_model(config, VOCAB, VOCAB).get_weights()
    single_losses, single_weights = train(tf.distribute.get_strategy(), single, config, start)

    mirrored = tf.distribute.MirroredStrategy(
        ["/cpu:0", "/cpu:1"], cross_device_ops=tf.distribute.ReductionToOneDevice()
    )

    def per_pipeline(context):
        # One pipeline feeds the replicas in turn: half 0 to replica 0, half 1 to replica 1.
        def halves():
            for pair in steps:
                for source, target, labels in pair:
                    yield {"source_ids": source, "target_input_ids": target}, labels

        return tf.data.Dataset.from_generator(halves, output_signature=single.element_spec)

    distributed = mirrored.distribute_datasets_from_function(per_pipeline)
    mirrored_losses, mirrored_weights = train(mirrored, distributed, config, start)
    difference = max(float(np.abs(a - b).max()) for a, b in zip(single_weights, mirrored_weights))
    print(json.dumps({
        "replicas": mirrored.num_replicas_in_sync,
        "single": single_losses,
        "mirrored": mirrored_losses,
        "max_weight_difference": difference,
    }))  # fmt: skip


if __name__ == "__main__":
    main()
