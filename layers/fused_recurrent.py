"""What the hand-differentiated recurrent layers share: when they apply, and the Keras layer's
side of the recurrence (the input projection of all steps, the mask, the direction and the
outputs)."""

import keras
import tensorflow as tf
from keras import ops, tree


def has_default_gates(cell):
    """Whether a Keras GRU or LSTM cell computes its gates in the default form that the hand-
    differentiated recurrences implement: a bias, tanh and sigmoid, no dropout in the cell."""
    return (
        cell.use_bias
        and cell.activation is keras.activations.tanh
        and cell.recurrent_activation is keras.activations.sigmoid
        and not cell.dropout
        and not cell.recurrent_dropout
    )


def states_over_time(step, gate_inputs, initial_states, mask):
    """A recurrence forward only, keeping nothing for a gradient: `step(gate_input_t, states)`
    -> the new states at each time (a masked step keeps them). Returns the first state after
    each step, `[time, batch, units]`, and the final states."""
    length = tf.shape(gate_inputs)[0]

    # tf.gather, not x[t]: a strided slice by a tensor converts to a dozen ONNX nodes.
    def body(t, states, outputs):
        new_states = step(tf.gather(gate_inputs, t), states)
        if mask is not None:
            kept = tf.gather(mask, t)
            new_states = [tf.where(kept, new, old) for new, old in zip(new_states, states)]
        return t + 1, new_states, outputs.write(t, new_states[0])

    outputs = tf.TensorArray(gate_inputs.dtype, size=length)
    _, final_states, outputs = tf.while_loop(
        lambda t, *_: t < length, body, (0, list(initial_states), outputs)
    )
    return outputs.stack(), final_states


class FusedRecurrence:
    """Mixin for a Keras recurrent layer that runs its recurrence with the input projection of
    every step as one matrix product before the loop, without a GPU (where Keras runs cuDNN)
    and in the default gate form (`has_default_gates`): in training, the loop is the
    subclass's hand-differentiated `recurrence`; elsewhere (inference, validation, the
    exports) it is `states_over_time` of the subclass's `step`, a loop of fewer operations
    than Keras' (each one a node at every step of an exported graph).

    Subclasses define `recurrence(gate_inputs, initial_states, time_mask, recurrent_kernel,
    recurrent_bias)` returning the outputs `[time, batch, units]` and the final states,
    `step(x, states, recurrent_kernel, recurrent_bias)` returning one step's new states from
    x_t W + b, and `split_bias(bias)` returning the input and recurrent biases."""

    def _fused_applies(self):
        return (
            has_default_gates(self.cell)
            and not self.unroll
            and keras.backend.backend() == "tensorflow"
            and not tf.config.list_logical_devices("GPU")
        )

    def fused_weights(self, dtype):
        """The cell's weights in `dtype` (mixed precision computes in it): the input kernel,
        the recurrent kernel, the input bias and the recurrent bias."""
        kernel, recurrent_kernel, bias = (
            ops.cast(weight, dtype)
            for weight in (self.cell.kernel, self.cell.recurrent_kernel, self.cell.bias)
        )
        return (kernel, recurrent_kernel, *self.split_bias(bias))

    def inner_loop(self, sequences, initial_state, mask, training=False):
        if not self._fused_applies():
            return super().inner_loop(sequences, initial_state, mask, training=training)
        initial_states = tree.flatten(initial_state)
        if tree.is_nested(mask):
            mask = mask[0]
        dtype = sequences.dtype
        kernel, recurrent_kernel, input_bias, recurrent_bias = self.fused_weights(dtype)
        # [time, batch, gates * units] in processing order; a batch-major product would need
        # the same transpose on its output.
        gate_inputs = tf.tensordot(tf.transpose(sequences, [1, 0, 2]), kernel, 1) + input_bias
        time_mask = None if mask is None else tf.transpose(ops.cast(mask, "bool"))[:, :, None]
        if self.go_backwards:
            gate_inputs = tf.reverse(gate_inputs, [0])
            time_mask = None if time_mask is None else tf.reverse(time_mask, [0])
        if training:
            states, final_states = self.recurrence(
                gate_inputs, initial_states, time_mask, recurrent_kernel, recurrent_bias
            )
        else:
            states, final_states = states_over_time(
                lambda x, states: self.step(x, states, recurrent_kernel, recurrent_bias),
                gate_inputs, initial_states, time_mask,
            )  # fmt: skip
        outputs = states
        if time_mask is not None:
            # Keras' outputs at masked steps: zeros, or the last unmasked step's output (zeros
            # before the first one).
            shown = (
                time_mask
                if self.zero_output_for_mask
                else tf.math.cumsum(tf.cast(time_mask, "int32"), axis=0) > 0
            )
            outputs = states * tf.cast(shown, dtype)
        outputs = tf.transpose(outputs, [1, 0, 2])
        return outputs[:, -1], outputs, final_states


def recurrent_step(layer, x, states, training=False):
    """One step of a recurrent layer on inputs `[batch, features]` from `states` (a list): the
    output and the new states, as its Keras cell gives them; a fused layer's `step` where its
    fused form applies (fewer operations a step: a decoder's step in an exported graph)."""
    if not (isinstance(layer, FusedRecurrence) and layer._fused_applies()):
        output, new_states = layer.cell(x, states, training=training)
        return output, list(new_states) if isinstance(new_states, (list, tuple)) else [new_states]
    kernel, recurrent_kernel, input_bias, recurrent_bias = layer.fused_weights(x.dtype)
    new_states = layer.step(
        ops.matmul(x, kernel) + input_bias, states, recurrent_kernel, recurrent_bias
    )
    return new_states[0], new_states
