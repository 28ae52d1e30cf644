"""Layers whose configuration is their constructor's arguments, recorded as they are made: a
layer's `get_config` returns every one by the name its constructor takes, so an argument added
to a constructor cannot be left out of the saved model."""

import functools
import inspect
import types

import keras


class RecordsArguments:
    """Mixin (first among the bases) of a Keras layer or model: each subclass that defines an
    `__init__` has it record its arguments, and `get_config` returns the base class's
    configuration (name, dtype, trainable) with them. Where constructors chain, the most derived
    one's arguments are kept. A layer among the arguments is saved as Keras serialises it;
    another object with a `get_config` (`SamplingSchedule`), as its configuration."""

    # Arguments the constructor makes a sublayer of (given a layer or its configuration): saved
    # as that sublayer, the attribute of the same name, is when the model is saved.
    LAYER_ARGUMENTS = ()

    def __init_subclass__(cls, **kwargs):
        super().__init_subclass__(**kwargs)
        if "__init__" in vars(cls):
            cls.__init__ = _recording(cls.__init__)

    def get_config(self):
        arguments = {**self.recorded_arguments,
                     **{name: getattr(self, name) for name in self.LAYER_ARGUMENTS}}  # fmt: skip
        return {**super().get_config(), **{k: _saved(v) for k, v in arguments.items()}}


def _recording(init):
    """`init`, setting `self.recorded_arguments`: a read-only {name: value} of every named
    parameter but `self`, defaults included (a container Keras and TensorFlow do not track)."""
    signature = inspect.signature(init)
    named = [name for name, parameter in signature.parameters.items()
             if name != "self" and parameter.kind is not inspect.Parameter.VAR_KEYWORD]  # fmt: skip

    @functools.wraps(init)
    def recording_init(self, *args, **kwargs):
        bound = signature.bind(self, *args, **kwargs)
        bound.apply_defaults()
        given = {name: bound.arguments[name] for name in named}
        init(self, *args, **kwargs)
        self.recorded_arguments = types.MappingProxyType(given)

    recording_init.__signature__ = signature  # for Keras, which reads it without unwrapping
    return recording_init


def _saved(value):
    if isinstance(value, keras.layers.Layer):
        return keras.saving.serialize_keras_object(value)
    if hasattr(value, "get_config"):
        return value.get_config()
    return list(value) if isinstance(value, tuple) else value
