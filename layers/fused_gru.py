"""A GRU layer whose training pass runs the recurrence with a hand-written gradient."""

import keras
import tensorflow as tf
from keras import ops, tree


def gru_recurrence(gate_inputs, initial_state, mask, recurrent_kernel, recurrent_bias):
    """The GRU recurrence (Keras' `reset_after` form) with a hand-written backward loop.

        z, r = sigmoid(x_zr + h_{t-1} R_zr + b_zr),   n = tanh(x_n + r * (h_{t-1} R_n + b_n))
        h_t  = n + z * (h_{t-1} - n)                  (h_{t-1} where the step is masked)

    TensorFlow's automatic gradient of a while loop pushes every intermediate of every step
    onto a stack and differentiates each op on its own; here the forward loop keeps the four
    tensors the gradient needs, the backward loop does one matrix product a step, and the
    gradient of the recurrent kernel is one product over all steps after it.

    Args:
        gate_inputs: `[time, batch, 3 * units]`, x_t W + b_x in processing order.
        initial_state: `[batch, units]`.
        mask: boolean `[time, batch, 1]` (False: the step keeps the state), or None.
        recurrent_kernel: `[units, 3 * units]`, the z, r, n blocks side by side.
        recurrent_bias: `[3 * units]`.

    Returns:
        `[time, batch, units]`: the state after each step.
    """
    units = recurrent_kernel.shape[0]

    @tf.custom_gradient
    def recurrence(gate_inputs, initial_state, recurrent_kernel, recurrent_bias):
        length = tf.shape(gate_inputs)[0]
        arrays = [tf.TensorArray(gate_inputs.dtype, size=length) for _ in range(4)]

        def step(t, h, states, gates, candidates, recurrent_n):
            x_zr, x_n = tf.split(gate_inputs[t], [2 * units, units], axis=-1)
            h_zr, h_n = tf.split(
                tf.matmul(h, recurrent_kernel) + recurrent_bias, [2 * units, units], axis=-1
            )
            zr = tf.sigmoid(x_zr + h_zr)
            n = tf.tanh(x_n + zr[:, units:] * h_n)
            new_h = n + zr[:, :units] * (h - n)
            if mask is not None:
                new_h = tf.where(mask[t], new_h, h)
            return (
                t + 1,
                new_h,
                states.write(t, new_h),
                gates.write(t, zr),
                candidates.write(t, n),
                recurrent_n.write(t, h_n),
            )

        _, _, *arrays = tf.while_loop(lambda t, *_: t < length, step, (0, initial_state, *arrays))
        states, gates, candidates, recurrent_n = (array.stack() for array in arrays)

        def gradient(d_states):
            previous = tf.concat([initial_state[None], states[:-1]], axis=0)
            kernel_t = tf.transpose(recurrent_kernel)
            d_arrays = [tf.TensorArray(gate_inputs.dtype, size=length) for _ in range(2)]

            def back_step(i, d_h, d_inputs, d_recurrent):
                t = length - 1 - i
                d_h = d_h + d_states[t]
                d_cell = d_h if mask is None else tf.where(mask[t], d_h, tf.zeros_like(d_h))
                z, r = tf.split(gates[t], 2, axis=-1)
                n = candidates[t]
                d_n = d_cell * (1 - z) * (1 - n * n)
                d_z = d_cell * (previous[t] - n) * z * (1 - z)
                d_r = d_n * recurrent_n[t] * r * (1 - r)
                d_h_gates = tf.concat([d_z, d_r, d_n * r], axis=-1)
                d_previous = d_cell * z + tf.matmul(d_h_gates, kernel_t)
                if mask is not None:
                    d_previous = d_previous + (d_h - d_cell)
                return (
                    i + 1,
                    d_previous,
                    d_inputs.write(t, tf.concat([d_z, d_r, d_n], axis=-1)),
                    d_recurrent.write(t, d_h_gates),
                )

            _, d_initial, d_inputs, d_recurrent = tf.while_loop(
                lambda i, *_: i < length,
                back_step,
                (0, tf.zeros_like(initial_state), *d_arrays),
            )
            d_inputs, d_recurrent = d_inputs.stack(), d_recurrent.stack()
            flat_recurrent = tf.reshape(d_recurrent, [-1, 3 * units])
            d_kernel = tf.matmul(
                tf.reshape(previous, [-1, units]), flat_recurrent, transpose_a=True
            )
            return d_inputs, d_initial, d_kernel, tf.reduce_sum(flat_recurrent, axis=0)

        return states, gradient

    return recurrence(gate_inputs, initial_state, recurrent_kernel, recurrent_bias)


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


@keras.saving.register_keras_serializable(package="seq2seq")
class FusedGRU(keras.layers.GRU):
    """`keras.layers.GRU`, with the same weights and results, that trains faster on a CPU.

    In training, without a GPU (where Keras runs cuDNN), and in Keras' default GRU form
    (`reset_after`, tanh and sigmoid, a bias, no dropout inside the layer), the input projection
    of every step is one matrix product before the loop and the recurrence is
    `gru_recurrence`. Everywhere else (inference, validation, the exports) this is Keras' GRU
    as it is, so exported graphs do not change. Arguments, call and returns as Keras' GRU.
    """

    def _fused_applies(self):
        cell = self.cell
        return (
            cell.reset_after
            and has_default_gates(cell)
            and not self.unroll
            and keras.backend.backend() == "tensorflow"
            and not tf.config.list_logical_devices("GPU")
        )

    def inner_loop(self, sequences, initial_state, mask, training=False):
        if not (training and self._fused_applies()):
            return super().inner_loop(sequences, initial_state, mask, training=training)
        if tree.is_nested(initial_state):
            initial_state = initial_state[0]
        if tree.is_nested(mask):
            mask = mask[0]
        dtype = sequences.dtype
        kernel, recurrent_kernel, bias = (
            ops.cast(weight, dtype)
            for weight in (self.cell.kernel, self.cell.recurrent_kernel, self.cell.bias)
        )
        # [time, batch, 3 * units] in processing order; a batch-major product would need the
        # same transpose on its output.
        gate_inputs = tf.tensordot(tf.transpose(sequences, [1, 0, 2]), kernel, 1) + bias[0]
        time_mask = None if mask is None else tf.transpose(ops.cast(mask, "bool"))[:, :, None]
        if self.go_backwards:
            gate_inputs = tf.reverse(gate_inputs, [0])
            time_mask = None if time_mask is None else tf.reverse(time_mask, [0])
        states = gru_recurrence(gate_inputs, initial_state, time_mask, recurrent_kernel, bias[1])
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
        return outputs[:, -1], outputs, [states[-1]]
