"""The model described by the `model` section of a configuration, built by its model type."""

import contextlib

import keras

from pipeline.model_types import MODEL_TYPES


@contextlib.contextmanager
def dtype_policy(name):
    """Keras' global dtype policy set to `name` while the block runs, then restored.

    Each layer takes the global policy when it is created, so a model built in this block
    keeps `name` and no model built outside it is affected.
    """
    previous = keras.config.dtype_policy()
    keras.config.set_dtype_policy(name)
    try:
        yield
    finally:
        keras.config.set_dtype_policy(previous)


def build_model(
    config, source_vocab_size, target_vocab_size, precision="float32", for_training=False
):
    """The model of `config["model"]["type"]`, built (its weights created).

    `precision` is its dtype policy (`pipeline.config.PRECISIONS`): training passes
    `train.precision`; translation and export keep the float32 default. The weights are
    float32 under every policy, so they move between the two with `set_weights`.
    `for_training` builds the model's twin that trains under any `tf.distribute` strategy
    (`training_twins`), with the same weights.
    """
    model_type = MODEL_TYPES[config["model"]["type"]]
    with dtype_policy(precision):
        model = model_type.build(config, source_vocab_size, target_vocab_size, for_training)
        model.build({"source_ids": (None, None), "target_input_ids": (None, None)})
    return model
