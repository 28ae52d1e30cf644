"""The model described by the `model` section of a configuration, built by its model type."""

import contextlib

import keras

from pipeline.model_types import MODEL_TYPES

SEED_STATE = "seed_generator"  # in the paths of the dropout layers' seed states


@contextlib.contextmanager
def variables_made_as_zeros():
    """The model's weights created as zeros rather than drawn by their initialisers, for a
    model whose weights `set_weights` then replaces every one: drawing NLLB's embedding table
    at random takes seconds and leaves the memory of its temporaries with the allocator, and
    some initialisers have no bfloat16 kernel. The dropout layers' seed states, which no
    checkpoint holds, are made as before."""
    import tensorflow as tf

    from layers.keras_internals import variables_initialised_by

    def zeros(variable):
        if SEED_STATE in variable.path:
            return None
        return lambda: tf.zeros(variable.shape, dtype=variable.dtype)

    with variables_initialised_by(zeros):
        yield


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
        model = model_type.build(model_type.properties(config), source_vocab_size,
                                 target_vocab_size, for_training, config["train"])  # fmt: skip
        model.build({"source_ids": (None, None), "target_input_ids": (None, None)})
    return model


def at_precision(model, precision):
    """`model` itself under "float32"; else a copy of it built under the dtype policy
    `precision` ("bfloat16": weights and products in bfloat16), its weights cast from
    `model`'s. An ensemble's members are copied one by one."""
    from pipeline.model_types.ensemble import Ensemble

    if precision == "float32":
        return model
    if isinstance(model, Ensemble):
        return Ensemble([at_precision(m, precision) for m in model.members], model.weights)
    with dtype_policy(precision), variables_made_as_zeros():
        copy = type(model).from_config(_with_dtype_policy(model.get_config(), precision))
        copy.build({"source_ids": (None, None), "target_input_ids": (None, None)})
    copy.set_weights(model.get_weights())
    return copy


def _with_dtype_policy(config, policy):
    """A layer configuration with every layer's `dtype` in it, nested ones too, `policy`."""
    if isinstance(config, dict):
        return {key: policy if key == "dtype" else _with_dtype_policy(value, policy)
                for key, value in config.items()}  # fmt: skip
    if isinstance(config, (list, tuple)):
        return type(config)(_with_dtype_policy(value, policy) for value in config)
    return config
