"""An LSTM layer whose training pass runs the recurrence with a hand-written gradient."""

import keras
import tensorflow as tf

from layers.fused_recurrent import FusedRecurrence


def lstm_cell(z, c):
    """One LSTM step from its pre-activations z `[batch, 4 * units]` (Keras' gate order i, f,
    g, o) and the previous cell: the new h and c, and the gates (i, f, g, o) its gradient needs."""
    z_i, z_f, z_g, z_o = tf.split(z, 4, axis=-1)
    i, f, g, o = tf.sigmoid(z_i), tf.sigmoid(z_f), tf.tanh(z_g), tf.sigmoid(z_o)
    new_c = f * c + i * g
    return o * tf.tanh(new_c), new_c, (i, f, g, o)


def lstm_cell_gradient(d_h, d_c, gates, c, previous_c):
    """`lstm_cell` backwards: from the gradients of its h and c, given its gates, its new cell
    and the previous one, the gradients of z and of the previous cell."""
    i, f, g, o = gates
    tanh_c = tf.tanh(c)
    d_cell = d_c + d_h * o * (1 - tanh_c * tanh_c)
    d_z = tf.concat(
        [
            d_cell * g * i * (1 - i),
            d_cell * previous_c * f * (1 - f),
            d_cell * i * (1 - g * g),
            d_h * tanh_c * o * (1 - o),
        ],
        axis=-1,
    )
    return d_z, d_cell * f


def lstm_recurrence(gate_inputs, initial_h, initial_c, mask, recurrent_kernel):
    """The LSTM recurrence (Keras' gate order i, f, g, o) with a hand-written backward loop.

        i, f, g, o = sigmoid, sigmoid, tanh, sigmoid (x_t W + b + h_{t-1} R)
        c_t = f c_{t-1} + i g,   h_t = o tanh(c_t)   (h_{t-1}, c_{t-1} where the step is masked)

    As in `gru_recurrence`: the forward loop keeps the gates and cells the gradient needs, the
    backward loop does one matrix product a step, and the recurrent kernel's gradient is one
    product over all steps after it.

    Args:
        gate_inputs: `[time, batch, 4 * units]`, x_t W + b in processing order.
        initial_h, initial_c: `[batch, units]`.
        mask: boolean `[time, batch, 1]` (False: the step keeps the state), or None.
        recurrent_kernel: `[units, 4 * units]`, the i, f, g, o blocks side by side.

    Returns:
        `[time, batch, units]` twice: h and c after each step.
    """
    units = recurrent_kernel.shape[0]

    @tf.custom_gradient
    def recurrence(gate_inputs, initial_h, initial_c, recurrent_kernel):
        length = tf.shape(gate_inputs)[0]
        # h, c and each gate in an array of its own: no concatenation here, no split backward.
        arrays = [tf.TensorArray(gate_inputs.dtype, size=length) for _ in range(6)]

        def step(t, h, c, *arrays):
            new_h, new_c, gates = lstm_cell(gate_inputs[t] + tf.matmul(h, recurrent_kernel), c)
            if mask is not None:
                new_h, new_c = tf.where(mask[t], new_h, h), tf.where(mask[t], new_c, c)
            values = (new_h, new_c, *gates)
            return (t + 1, new_h, new_c, *(a.write(t, v) for a, v in zip(arrays, values)))

        _, _, _, *arrays = tf.while_loop(
            lambda t, *_: t < length, step, (0, initial_h, initial_c, *arrays)
        )
        hs, cs, *gates = (array.stack() for array in arrays)

        def gradient(d_hs, d_cs):
            previous_h = tf.concat([initial_h[None], hs[:-1]], axis=0)
            previous_c = tf.concat([initial_c[None], cs[:-1]], axis=0)
            kernel_t = tf.transpose(recurrent_kernel)
            if d_cs is None:
                d_cs = tf.zeros_like(cs)

            def back_step(i, d_h, d_c, d_gates):
                t = length - 1 - i
                d_h, d_c = d_h + d_hs[t], d_c + d_cs[t]
                if mask is None:
                    d_step_h, d_step_c = d_h, d_c
                else:
                    d_step_h = tf.where(mask[t], d_h, tf.zeros_like(d_h))
                    d_step_c = tf.where(mask[t], d_c, tf.zeros_like(d_c))
                d_z, d_previous_c = lstm_cell_gradient(
                    d_step_h, d_step_c, [gate[t] for gate in gates], cs[t], previous_c[t]
                )
                d_previous_h = tf.matmul(d_z, kernel_t) + (d_h - d_step_h)
                d_previous_c = d_previous_c + (d_c - d_step_c)
                return i + 1, d_previous_h, d_previous_c, d_gates.write(t, d_z)

            _, d_initial_h, d_initial_c, d_gates = tf.while_loop(
                lambda i, *_: i < length,
                back_step,
                (
                    0,
                    tf.zeros_like(initial_h),
                    tf.zeros_like(initial_c),
                    tf.TensorArray(gate_inputs.dtype, size=length),
                ),
            )
            d_gates = d_gates.stack()
            d_kernel = tf.matmul(
                tf.reshape(previous_h, [-1, units]),
                tf.reshape(d_gates, [-1, 4 * units]),
                transpose_a=True,
            )
            return d_gates, d_initial_h, d_initial_c, d_kernel

        return (hs, cs), gradient

    return recurrence(gate_inputs, initial_h, initial_c, recurrent_kernel)


@keras.saving.register_keras_serializable(package="seq2seq")
class FusedLSTM(FusedRecurrence, keras.layers.LSTM):
    """`keras.layers.LSTM`, with the same weights and results, that trains faster on a CPU: in
    the default gate form (`has_default_gates`) its training pass runs `lstm_recurrence` (see
    `FusedRecurrence`). Arguments, call and returns as Keras' LSTM.
    """

    @staticmethod
    def split_bias(bias):
        return bias, 0

    @staticmethod
    def step(x, states, recurrent_kernel, recurrent_bias):
        h, c = states
        new_h, new_c, _ = lstm_cell(x + tf.matmul(h, recurrent_kernel), c)
        return [new_h, new_c]

    @staticmethod
    def recurrence(gate_inputs, initial_states, time_mask, recurrent_kernel, recurrent_bias):
        initial_h, initial_c = initial_states
        hs, cs = lstm_recurrence(gate_inputs, initial_h, initial_c, time_mask, recurrent_kernel)
        return hs, [hs[-1], cs[-1]]
