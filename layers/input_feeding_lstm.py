"""The training pass of Luong et al.'s input-feeding decoder with a hand-written gradient."""

import tensorflow as tf

from layers.fused_lstm import lstm_cell, lstm_cell_gradient
from layers.masking import masked_softmax


def input_feeding_lstm_recurrence(
    first_gate_inputs, initial_cells, initial_feed, keys, values, memory_mask, weights,
    feed_mask=None, layer_masks=None, residual=False,
):  # fmt: skip
    """Stacked LSTM layers, multiplicative attention and the attentional vector fed back as
    input (Luong et al., 2015, "Effective Approaches to Attention-based Neural Machine
    Translation", sections 3.1 and 3.3), for every step of a teacher-forced target:

        z^1_t = x_t W^1_x + b^1 + (m_t * a~_{t-1}) W^1_a + h^1_{t-1} R^1     (x_t W^1_x + b^1
        z^l_t = (m^l_t * y^{l-1}_t) W^l + b^l + h^l_{t-1} R^l                 given for all t)
        i, f, g, o = sigmoid, sigmoid, tanh, sigmoid (z^l_t);  c^l_t = f c^l_{t-1} + i g;
        h^l_t = o tanh(c^l_t);  y^l_t = h^l_t (+ y^{l-1}_t with `residual`, from the second on)
        alpha_t = softmax over the source (g y^L_t K);  c_t = alpha_t V
        a~_t = tanh([c_t; y^L_t] W_c)

    TensorFlow's automatic gradient of such a loop stacks every intermediate of every step,
    adds each step's share into every weight's gradient (a full-size sum a step per weight, and
    a dense embedding gradient a step) and differentiates op by op. Here the forward loop keeps
    the few tensors the gradient needs; the backward loop does the per-step products that carry
    the recurrence; every weight's gradient, and the keys' and values', is one product over all
    steps after it.

    Args:
        first_gate_inputs: `[time, batch, 4 * units]`, x_t W^1_x + b^1 (the target embeddings'
            share of the first layer's gates, dropout applied).
        initial_cells: a tuple per layer of (h, c), each `[batch, units]`.
        initial_feed: `[batch, feed_dim]`, a~_0.
        keys: `[batch, query_dim, src_len]` (scaled as the score needs); values:
            `[batch, src_len, value_dim]`; memory_mask: boolean `[batch, src_len]` or None.
        weights: a dict of "gain" (g, a scalar: the score's learned scale, or 1),
            "feed_kernel" `[feed_dim, 4 * units]` (W^1_a), "recurrent_kernels" (a tuple of R^l
            `[units, 4 * units]`), "kernels" and "biases" (W^l and b^l of the layers after
            the first), "attentional" (W_c `[value_dim + units, feed_dim]`).
        feed_mask: `[time, batch, feed_dim]`, the dropout mask m_t (scaled), or None.
        layer_masks: a tuple of `[time, batch, units]` masks m^l, one per layer after the
            first, or None for no dropout.
        residual: add each layer's input to its output from the second layer on.

    Returns:
        The attentional vectors a~_t `[time, batch, feed_dim]` and the attention weights
        alpha_t `[time, batch, src_len]`.
    """
    num_layers = len(initial_cells)
    flat_weights = tf.nest.flatten(weights)

    @tf.custom_gradient
    def recurrence(first_gate_inputs, initial_feed, keys, values, *cells_and_weights):
        flat_cells = cells_and_weights[: 2 * num_layers]
        w = tf.nest.pack_sequence_as(weights, list(cells_and_weights[2 * num_layers :]))
        h0, c0 = flat_cells[0::2], flat_cells[1::2]
        length = tf.shape(first_gate_inputs)[0]
        dtype = first_gate_inputs.dtype
        # Two products, not a concatenation a step: [c; y] W_c = c W_c,c + y W_c,y.
        context_kernel, query_kernel = _attentional_kernels(w, values)

        def step(t, hs, cs, feed, layer_arrays, attention_arrays):
            x_feed = feed if feed_mask is None else feed * feed_mask[t]
            first_gates = first_gate_inputs[t] + tf.matmul(x_feed, w["feed_kernel"])
            query, new_hs, new_cs, layer_steps = _layers_step(
                first_gates, hs, cs, w, layer_masks, t, residual
            )
            alpha, context, attentional = _attend(
                query, keys, values, memory_mask, w["gain"], context_kernel, query_kernel
            )
            return (
                t + 1,
                new_hs,
                new_cs,
                attentional,
                tuple(map(_write, layer_arrays, [t] * len(hs), layer_steps)),
                _write(attention_arrays, t, (query, alpha, context, attentional)),
            )

        _, _, _, _, layer_arrays, attention_arrays = tf.while_loop(
            lambda t, *_: t < length,
            step,
            (
                tf.constant(0),
                tuple(h0),
                tuple(c0),
                initial_feed,
                tuple(_new_arrays(6, dtype, length) for _ in range(num_layers)),
                _new_arrays(4, dtype, length),
            ),
        )
        layer_values = [[array.stack() for array in arrays] for arrays in layer_arrays]
        queries, alphas, contexts, outputs = (array.stack() for array in attention_arrays)

        def gradient(d_outputs, d_alphas):
            return _backward(
                d_outputs, d_alphas, first_gate_inputs, h0, c0, initial_feed, keys, values,
                w, layer_values, queries, alphas, contexts, outputs, feed_mask, layer_masks,
                residual,
            )  # fmt: skip

        return (outputs, alphas), gradient

    flat_cells = [tensor for cell in initial_cells for tensor in cell]
    return recurrence(first_gate_inputs, initial_feed, keys, values, *flat_cells, *flat_weights)


def _layers_step(first_gates, hs, cs, w, layer_masks, t, residual):
    """Step `t` of the stacked LSTM layers, the first's gate inputs `first_gates` given:
    (the top layer's output y^L_t, the new h and c of each layer, and each layer's
    (i, f, g, o, c, h), each gate kept apart: no concatenation here, no split backward)."""
    below = None
    new_hs, new_cs, layer_steps = [], [], []
    for layer in range(len(hs)):
        if layer == 0:
            z = first_gates
        else:
            x = below if layer_masks is None else below * layer_masks[layer - 1][t]
            z = tf.matmul(x, w["kernels"][layer - 1]) + w["biases"][layer - 1]
        z = z + tf.matmul(hs[layer], w["recurrent_kernels"][layer])
        h, c, (i, f, g, o) = lstm_cell(z, cs[layer])
        below = h + below if residual and layer > 0 else h
        layer_steps.append((i, f, g, o, c, h))
        new_hs.append(h)
        new_cs.append(c)
    return below, tuple(new_hs), tuple(new_cs), layer_steps


def _attend(query, keys, values, memory_mask, gain, context_kernel, query_kernel):
    """alpha_t, c_t and a~_t for the top layer's output `query` `[batch, units]`."""
    scores = tf.squeeze(tf.matmul(query[:, None, :], keys), 1) * gain
    alpha = masked_softmax(scores, memory_mask)
    context = tf.squeeze(tf.matmul(alpha[:, None, :], values), 1)
    attentional = tf.tanh(tf.matmul(context, context_kernel) + tf.matmul(query, query_kernel))
    return alpha, context, attentional


def _attentional_kernels(w, values):
    """W_c's rows for the context and for the query."""
    return tf.split(w["attentional"], [values.shape[-1], -1], axis=0)


def _new_arrays(count, dtype, length):
    """`count` empty `TensorArray`s of `length` elements."""
    return tuple(tf.TensorArray(dtype, size=length) for _ in range(count))


def _write(arrays, t, values):
    """`arrays` with each of `values` written at step `t`."""
    return tuple(array.write(t, value) for array, value in zip(arrays, values))


def _previous(initial, values):
    """`[time, ...]` values shifted one step later, `initial` first."""
    return tf.concat([initial[None], values[:-1]], axis=0)


def _product_over_steps(inputs, gradients):
    """sum_t inputs_t^T gradients_t: `[time, batch, m]` and `[time, batch, n]` to `[m, n]`."""
    return tf.matmul(
        tf.reshape(inputs, [-1, inputs.shape[-1]]),
        tf.reshape(gradients, [-1, gradients.shape[-1]]),
        transpose_a=True,
    )


def _backward(
    d_outputs, d_alphas, first_gate_inputs, h0, c0, initial_feed, keys, values, w,
    layer_values, queries, alphas, contexts, outputs, feed_mask, layer_masks, residual,
):  # fmt: skip
    """The gradients of `input_feeding_lstm_recurrence`'s inputs, in the order of its inner
    function's arguments."""
    num_layers = len(h0)
    length = tf.shape(first_gate_inputs)[0]
    dtype = first_gate_inputs.dtype
    if d_alphas is None:
        d_alphas = tf.zeros_like(alphas)
    context_kernel_t, query_kernel_t = (
        tf.transpose(kernel) for kernel in _attentional_kernels(w, values)
    )
    feed_kernel_t = tf.transpose(w["feed_kernel"])
    recurrent_t = [tf.transpose(kernel) for kernel in w["recurrent_kernels"]]
    kernels_t = [tf.transpose(kernel) for kernel in w["kernels"]]
    previous_cs = [_previous(c0[layer], layer_values[layer][4]) for layer in range(num_layers)]

    def back_step(i, d_hs, d_cs, d_feed, gate_arrays, attention_arrays):
        t = length - 1 - i
        out = outputs[t]
        d_pre = (d_outputs[t] + d_feed) * (1 - out * out)
        d_context = tf.matmul(d_pre, context_kernel_t)
        d_query = tf.matmul(d_pre, query_kernel_t)
        alpha = alphas[t]
        d_alpha = tf.squeeze(tf.matmul(d_context[:, None, :], values, transpose_b=True), 1)
        d_alpha = d_alpha + d_alphas[t]
        d_scores = alpha * (d_alpha - tf.reduce_sum(alpha * d_alpha, axis=-1, keepdims=True))
        d_below = d_query + w["gain"] * tf.squeeze(
            tf.matmul(d_scores[:, None, :], keys, transpose_b=True), 1
        )
        new_d_hs, new_d_cs, new_gate_arrays = [None] * num_layers, [None] * num_layers, []
        for layer in reversed(range(num_layers)):
            *gates, c_t = (stacked[t] for stacked in layer_values[layer][:5])
            d_z, new_d_cs[layer] = lstm_cell_gradient(
                d_below + d_hs[layer], d_cs[layer], gates, c_t, previous_cs[layer][t]
            )
            new_gate_arrays.append(gate_arrays[layer].write(t, d_z))
            new_d_hs[layer] = tf.matmul(d_z, recurrent_t[layer])
            if layer > 0:
                d_input = tf.matmul(d_z, kernels_t[layer - 1])
                if layer_masks is not None:
                    d_input = d_input * layer_masks[layer - 1][t]
                d_below = d_input + d_below if residual else d_input
            else:
                d_feed = tf.matmul(d_z, feed_kernel_t)
                if feed_mask is not None:
                    d_feed = d_feed * feed_mask[t]
        new_gate_arrays.reverse()
        return (
            i + 1,
            tuple(new_d_hs),
            tuple(new_d_cs),
            d_feed,
            tuple(new_gate_arrays),
            _write(attention_arrays, t, (d_pre, d_scores, d_context)),
        )

    _, d_h0, d_c0, d_feed0, gate_arrays, attention_arrays = tf.while_loop(
        lambda i, *_: i < length,
        back_step,
        (
            tf.constant(0),
            tuple(tf.zeros_like(h) for h in h0),
            tuple(tf.zeros_like(c) for c in c0),
            tf.zeros_like(initial_feed),
            _new_arrays(num_layers, dtype, length),
            _new_arrays(3, dtype, length),
        ),
    )
    d_zs = [array.stack() for array in gate_arrays]
    d_pres, d_scores, d_contexts = (array.stack() for array in attention_arrays)
    d_weights = _weight_gradients(
        d_zs, d_pres, h0, initial_feed, w, layer_values, queries, contexts, outputs,
        feed_mask, layer_masks, residual,
    )  # fmt: skip
    d_gained_keys = tf.einsum("tbd,tbs->bds", queries, d_scores)  # of g K
    d_weights["gain"] = tf.reduce_sum(keys * d_gained_keys)
    d_keys = w["gain"] * d_gained_keys
    d_values = tf.einsum("tbs,tbv->bsv", alphas, d_contexts)
    d_cells = [d for layer in range(num_layers) for d in (d_h0[layer], d_c0[layer])]
    return (d_zs[0], d_feed0, d_keys, d_values, *d_cells, *tf.nest.flatten(d_weights))


def _weight_gradients(
    d_zs, d_pres, h0, initial_feed, w, layer_values, queries, contexts, outputs, feed_mask,
    layer_masks, residual,
):  # fmt: skip
    """The gradients of the layers' and the attentional vector's weights (all but the gain),
    each one product over all steps."""
    num_layers = len(h0)
    feeds = _previous(initial_feed, outputs)
    if feed_mask is not None:
        feeds = feeds * feed_mask
    belows = []  # each layer's output y^l_t
    for layer in range(num_layers):
        h = layer_values[layer][5]
        belows.append(h + belows[-1] if residual and layer > 0 else h)
    return {
        "feed_kernel": _product_over_steps(feeds, d_zs[0]),
        "recurrent_kernels": tuple(
            _product_over_steps(_previous(h0[layer], layer_values[layer][5]), d_zs[layer])
            for layer in range(num_layers)
        ),
        "kernels": tuple(
            _product_over_steps(
                belows[layer - 1]
                if layer_masks is None
                else belows[layer - 1] * layer_masks[layer - 1],
                d_zs[layer],
            )
            for layer in range(1, num_layers)
        ),  # fmt: skip
        "biases": tuple(tf.reduce_sum(d_zs[layer], axis=[0, 1]) for layer in range(1, num_layers)),
        "attentional": _product_over_steps(tf.concat([contexts, queries], -1), d_pres),
    }
