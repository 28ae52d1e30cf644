"""A layer's constructor arguments recorded as it is made, so that its `get_config` returns
every one of them by the name the constructor takes, and a new argument cannot be left out."""

import functools
import inspect
import types


def records_arguments(init):
    """Decorates a layer's `__init__`: afterwards `layer.recorded_arguments` maps the name of
    every named parameter but `self` to its value (defaults included; tuples as lists, as
    JSON holds them); the catch-all `**kwargs` (name, dtype) are Keras' own `get_config`'s.
    Read-only, and no container that Keras or TensorFlow would track."""
    signature = inspect.signature(init)
    named = [name for name, parameter in signature.parameters.items()
             if name != "self" and parameter.kind is not inspect.Parameter.VAR_KEYWORD]  # fmt: skip

    @functools.wraps(init)
    def recording_init(self, *args, **kwargs):
        bound = signature.bind(self, *args, **kwargs)
        bound.apply_defaults()
        given = {name: _as_json(bound.arguments[name]) for name in named}
        init(self, *args, **kwargs)
        self.recorded_arguments = types.MappingProxyType(given)

    return recording_init


def _as_json(value):
    return list(value) if isinstance(value, tuple) else value
