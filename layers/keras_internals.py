"""Every use of Keras' and keras-hub's private code, in one place: `keras.src` modules and
attributes whose names start with an underscore. A Keras or keras-hub upgrade that changes
them breaks this file, and its tests (tests/test_keras_internals.py) say which use broke."""

import contextlib
from typing import NamedTuple


@contextlib.contextmanager
def weights_saved_through_disk():
    """While the block runs, `model.save` writes a .keras file's weights through a temporary
    file beside the output, each read where it lies. Keras writes them to an in-memory HDF5
    file first when it judges the memory sufficient (and without psutil it judges so below 1
    GB): a second copy of every weight at the peak. And it hands HDF5 each weight as a NumPy
    copy made through another (`np.array` of a variable): three times the largest weight (an
    embedding table) at the peak, where a read-only view of the variable's buffer does. (Not
    for loading: Keras would extract the weights into a folder beside the model, and a reader
    must not write in a work directory.)"""
    import numpy as np
    import tensorflow as tf
    from keras.src.saving import saving_lib

    convert = saving_lib.backend.convert_to_numpy

    def in_place(value):
        if isinstance(value, (saving_lib.backend.Variable, tf.Variable)):
            return buffer_view(value)
        return np.asarray(value) if isinstance(value, tf.Tensor) else convert(value)

    judge = saving_lib.is_memory_sufficient
    saving_lib.is_memory_sufficient = lambda model: False
    saving_lib.backend.convert_to_numpy = in_place
    try:
        yield
    finally:
        saving_lib.is_memory_sufficient = judge
        saving_lib.backend.convert_to_numpy = convert


def buffer_view(variable):
    """A read-only NumPy view of a Keras (or TensorFlow) variable's buffer: in eager mode
    reading a variable shares its buffer, where `variable.numpy()` and `np.array` copy it."""
    import keras
    import numpy as np

    value = variable.value if isinstance(variable, keras.Variable) else variable
    return np.asarray(value.read_value())


def unscale_loss_for_distribution(loss):
    """`loss` as one replica's share of the global batch's loss, times the number of replicas
    (Keras scales each replica's loss down by it): what the model's loss metric records."""
    from keras.src.losses.loss import unscale_loss_for_distribution as unscale

    return unscale(loss)


def loss_tracker(model):
    """The `keras.Model`'s own loss metric (the "loss" of its logs), which a custom
    `train_step` updates."""
    return model._loss_tracker


@contextlib.contextmanager
def variables_initialised_by(initial_value):
    """While the block runs, each Keras variable created takes `initial_value(variable)` (a
    function giving its value) where that is not None, else its initialiser's draw."""
    from keras.src.backend.tensorflow import core

    draw = core.Variable._initialize_with_initializer

    def initialise(variable, initializer):
        value = initial_value(variable)
        if value is None:
            return draw(variable, initializer)
        return variable._initialize(value)

    core.Variable._initialize_with_initializer = initialise
    try:
        yield
    finally:
        core.Variable._initialize_with_initializer = draw


class EncoderSublayers(NamedTuple):
    """The parts of a built keras-hub `TransformerEncoder`."""

    self_attention: object  # keras.layers.MultiHeadAttention
    self_attention_norm: object
    self_attention_dropout: object  # after the self-attention sublayer
    feedforward_intermediate: object  # keras.layers.Dense
    feedforward_output: object
    feedforward_norm: object
    feedforward_dropout: object  # after the feed-forward sublayer


def encoder_sublayers(layer):
    """`EncoderSublayers` of the built keras-hub `TransformerEncoder` `layer`."""
    return EncoderSublayers(
        layer._self_attention_layer, layer._self_attention_layer_norm,
        layer._self_attention_dropout, layer._feedforward_intermediate_dense,
        layer._feedforward_output_dense, layer._feedforward_layer_norm,
        layer._feedforward_dropout,
    )  # fmt: skip


def attention_weights_dropout(attention):
    """The dropout layer a built `keras.layers.MultiHeadAttention` applies to its attention
    weights."""
    return attention._dropout_layer


def set_attention_weights_dropout(attention, rate):
    """Sets the rate of the dropout on a built `MultiHeadAttention`'s attention weights
    (which it reads from `_dropout`, whether to apply it, and from its dropout layer)."""
    attention._dropout = attention._dropout_layer.rate = rate
