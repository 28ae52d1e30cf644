"""A GRU layer whose training pass runs the recurrence with a hand-written gradient."""

import keras
import tensorflow as tf

from layers.fused_recurrent import FusedRecurrence


def gru_cell(x, h, recurrent_kernel, recurrent_bias):
    """One GRU step (Keras' `reset_after` form) from x_t W + b_x `[batch, 3 * units]` and the
    previous state: the new state, and the gates z, r, the candidate n and h_{t-1} R_n + b_n
    that its gradient needs."""
    units = recurrent_kernel.shape[0]
    x_zr, x_n = tf.split(x, [2 * units, units], axis=-1)
    h_zr, h_n = tf.split(
        tf.matmul(h, recurrent_kernel) + recurrent_bias, [2 * units, units], axis=-1
    )
    zr = tf.sigmoid(x_zr + h_zr)
    z, r = tf.split(zr, 2, axis=-1)  # one exported node a step, where slices are one each
    n = tf.tanh(x_n + r * h_n)
    return n + z * (h - n), zr, n, h_n


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
            new_h, zr, n, h_n = gru_cell(gate_inputs[t], h, recurrent_kernel, recurrent_bias)
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


@keras.saving.register_keras_serializable(package="seq2seq")
class FusedGRU(FusedRecurrence, keras.layers.GRU):
    """`keras.layers.GRU`, with the same weights and results, that trains faster on a CPU: in
    Keras' default GRU form (`reset_after` and `has_default_gates`) its training pass runs
    `gru_recurrence` (see `FusedRecurrence`). Arguments, call and returns as Keras' GRU.
    """

    def _fused_applies(self):
        return self.cell.reset_after and super()._fused_applies()

    @staticmethod
    def split_bias(bias):
        return bias[0], bias[1]

    @staticmethod
    def step(x, states, recurrent_kernel, recurrent_bias):
        return [gru_cell(x, states[0], recurrent_kernel, recurrent_bias)[0]]

    @staticmethod
    def recurrence(gate_inputs, initial_states, time_mask, recurrent_kernel, recurrent_bias):
        (initial_state,) = initial_states
        states = gru_recurrence(
            gate_inputs, initial_state, time_mask, recurrent_kernel, recurrent_bias
        )
        return states, [states[-1]]
