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


class FusedRecurrence:
    """Mixin for a Keras recurrent layer whose training pass runs a hand-differentiated
    recurrence: in training, without a GPU (where Keras runs cuDNN), in the default gate form
    (`has_default_gates`), the input projection of every step is one matrix product before the
    loop and the loop is the subclass's `recurrence`. Everywhere else (inference, validation,
    the exports) the layer is Keras' own, so exported graphs do not change.

    Subclasses define `recurrence(gate_inputs, initial_states, time_mask, recurrent_kernel,
    recurrent_bias)` returning the outputs `[time, batch, units]` and the final states, and
    `split_bias(bias)` returning the input and recurrent biases."""

    def _fused_applies(self):
        return (
            has_default_gates(self.cell)
            and not self.unroll
            and keras.backend.backend() == "tensorflow"
            and not tf.config.list_logical_devices("GPU")
        )

    def inner_loop(self, sequences, initial_state, mask, training=False):
        if not (training and self._fused_applies()):
            return super().inner_loop(sequences, initial_state, mask, training=training)
        initial_states = tree.flatten(initial_state)
        if tree.is_nested(mask):
            mask = mask[0]
        dtype = sequences.dtype
        kernel, recurrent_kernel, bias = (
            ops.cast(weight, dtype)
            for weight in (self.cell.kernel, self.cell.recurrent_kernel, self.cell.bias)
        )
        input_bias, recurrent_bias = self.split_bias(bias)
        # [time, batch, gates * units] in processing order; a batch-major product would need
        # the same transpose on its output.
        gate_inputs = tf.tensordot(tf.transpose(sequences, [1, 0, 2]), kernel, 1) + input_bias
        time_mask = None if mask is None else tf.transpose(ops.cast(mask, "bool"))[:, :, None]
        if self.go_backwards:
            gate_inputs = tf.reverse(gate_inputs, [0])
            time_mask = None if time_mask is None else tf.reverse(time_mask, [0])
        states, final_states = self.recurrence(
            gate_inputs, initial_states, time_mask, recurrent_kernel, recurrent_bias
        )
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
