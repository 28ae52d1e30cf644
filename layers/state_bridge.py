"""Bridges from the encoder's final states to the decoder's initial states."""

import keras
from keras import ops

from layers.recorded_arguments import RecordsArguments

BRIDGES = ("dense", "copy", "zero")


@keras.saving.register_keras_serializable(package="seq2seq")
class StateBridge(RecordsArguments, keras.layers.Layer):
    """Maps encoder final states to decoder initial states.

    - "dense": all encoder states, concatenated, go through one tanh layer whose output is
      split into the decoder's states (any encoder/decoder shapes).
    - "copy": encoder layer i's states become decoder layer i's (structures must match).
    - "zero": the decoder starts from zeros (it still sees the source through attention).

    Args:
        kind: "dense", "copy" or "zero".
        target_state_sizes: the decoder's state sizes, a tuple per layer of ints.

    Call:
        source_states: a tuple per encoder layer of `[batch, size]` tensors.

    Returns:
        A tuple per decoder layer of `[batch, size]` tensors, matching `target_state_sizes`.
    """

    def __init__(self, kind="dense", target_state_sizes=(), **kwargs):
        super().__init__(**kwargs)
        if kind not in BRIDGES:
            raise ValueError(f"bridge must be one of {BRIDGES}, got {kind!r}")
        self.kind = kind
        self.target_state_sizes = tuple(
            tuple(int(s) for s in layer) for layer in target_state_sizes
        )

    def build(self, source_states_shape):
        source_sizes = tuple(tuple(shape[-1] for shape in layer) for layer in source_states_shape)
        if self.kind == "copy" and source_sizes != self.target_state_sizes:
            raise ValueError(
                "bridge 'copy' needs encoder and decoder states of the same structure, got "
                f"encoder {source_sizes} and decoder {self.target_state_sizes}; "
                "use bridge 'dense' instead."
            )
        if self.kind == "dense":
            total_in = sum(sum(layer) for layer in source_sizes)
            total_out = sum(sum(layer) for layer in self.target_state_sizes)
            self.projection = keras.layers.Dense(total_out, activation="tanh", name="projection")
            self.projection.build((source_states_shape[0][0][0], total_in))

    def call(self, source_states):
        if self.kind == "copy":
            return tuple(tuple(layer) for layer in source_states)
        first = source_states[0][0]
        if self.kind == "zero":
            batch = ops.shape(first)[0]
            return tuple(
                tuple(ops.zeros((batch, size), dtype=first.dtype) for size in layer)
                for layer in self.target_state_sizes
            )
        flat = ops.concatenate([s for layer in source_states for s in layer], axis=-1)
        projected = self.projection(flat)
        states, offset = [], 0
        for layer in self.target_state_sizes:
            layer_states = []
            for size in layer:
                layer_states.append(projected[:, offset : offset + size])
                offset += size
            states.append(tuple(layer_states))
        return tuple(states)

    def compute_output_shape(self, source_states_shape):
        batch = source_states_shape[0][0][0]
        return tuple(tuple((batch, s) for s in layer) for layer in self.target_state_sizes)
