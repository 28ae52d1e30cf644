"""Autoregressive recurrent decoder with attention and input feeding."""

import keras
import tensorflow as tf
from keras import ops

from layers.fused_recurrent import has_default_gates, recurrent_step
from layers.input_feeding_lstm import input_feeding_lstm_recurrence
from layers.luong_attention import LuongAttention
from layers.masking import boolean_mask
from layers.recorded_arguments import RecordsArguments
from layers.recurrent_layers import (
    check_cell_type,
    recurrent_layer,
    states_per_layer,
    token_embedding,
    token_lookup,
)
from layers.sixteen_bit_dropout import SixteenBitDropout, sixteen_bit_dropout


@keras.saving.register_keras_serializable(package="seq2seq")
class AttentionDecoder(RecordsArguments, keras.layers.Layer):
    """Stacked recurrent decoder with one attention layer over the source (Luong et al., 2015).

    At step t, with y_{t-1} the previous target token:
        x_t  = [embed(y_{t-1}); a~_{t-1}]        (input feeding; without it x_t = embed(y_{t-1}))
        h_t  = stacked cells(x_t, state_{t-1})
        c_t, alpha_t = attention(h_t, memory)
        a~_t = tanh(W_c [c_t; h_t])               (the attentional vector)
        logits_t = W_s a~_t
    With `attention=None` the decoder is the fixed-vector baseline: a~_t = h_t and the source
    reaches the decoder only through its initial state.

    Args:
        vocab_size: target vocabulary size.
        embedding_dim: size of the target token embeddings.
        units: units of each recurrent layer.
        num_layers: number of stacked layers.
        cell_type: "lstm", "gru" or "simple_rnn".
        attention: a `SourceAttention` layer (or its serialised config), or None.
        input_feeding: feed a~_{t-1} into step t (needs attention; None: where there is one).
        attention_vector_size: size of a~_t; defaults to `units`.
        dropout: dropout rate on the input of every layer and before the readout.
        residual: add each layer's input to its output, from the second layer on.

    Teacher-forced call:
        target_ids: int `[batch, tgt_len]`, the target shifted right (starting with <s>).
        memory: `[batch, src_len, memory_dim]`; memory_mask: boolean `[batch, src_len]`.
        initial_state: from `StateBridge` (or None for zeros).
        sampling_probability: scalar; if given, each input token after the first is replaced
            with this probability by a token sampled from the model's previous prediction
            (scheduled sampling, Bengio et al., 2015).
    Returns logits `[batch, tgt_len, vocab_size]` and attention weights
    `[batch, tgt_len, src_len]` (None without attention).

    Without input feeding and scheduled sampling, the whole target runs through each fused
    recurrent layer in one call and attention is applied to all steps in one batched call.
    Otherwise the steps run in a `tf.while_loop` using the same weights as `step()`; in
    training, LSTM layers with a multiplicative Luong score run the loop of
    `input_feeding_lstm_recurrence`, whose gradient is written by hand.
    """

    LAYER_ARGUMENTS = ("attention",)

    def __init__(
        self,
        vocab_size,
        embedding_dim,
        units,
        num_layers=1,
        cell_type="lstm",
        attention=None,
        input_feeding=None,
        attention_vector_size=None,
        dropout=0.0,
        residual=False,
        **kwargs,
    ):
        super().__init__(**kwargs)
        if isinstance(attention, dict):
            attention = keras.saving.deserialize_keras_object(attention)
        if input_feeding is None:  # Luong et al.'s input feeding wherever there is attention
            input_feeding = attention is not None
        if input_feeding and attention is None:
            raise ValueError("input_feeding needs an attention layer; set input_feeding=False")
        if int(num_layers) < 1:
            raise ValueError(f"num_layers must be at least 1, got {num_layers}")
        self.vocab_size = int(vocab_size)
        self.embedding_dim = int(embedding_dim)
        self.units = int(units)
        self.num_layers = int(num_layers)
        self.cell_type = check_cell_type(cell_type)
        self.attention = attention
        self.input_feeding = bool(input_feeding)
        self.attention_vector_size = int(attention_vector_size or units)
        self.dropout_rate = float(dropout)
        self.residual = bool(residual)

        self.embedding = token_embedding(vocab_size, embedding_dim)
        self.dropout = SixteenBitDropout(self.dropout_rate)
        self.recurrent_layers = [
            recurrent_layer(self.cell_type, self.units, name=f"layer_{i}")
            for i in range(self.num_layers)
        ]
        if attention is not None:
            self.attention_projection = keras.layers.Dense(
                self.attention_vector_size, activation="tanh", use_bias=False, name="attentional"
            )
        self.output_projection = keras.layers.Dense(self.vocab_size, name="logits")
        self.seed_generator = keras.random.SeedGenerator()

    @property
    def state_sizes(self):
        """Sizes of the recurrent states: a tuple per layer of one int per state tensor."""
        return ((self.units,) * states_per_layer(self.cell_type),) * self.num_layers

    @property
    def readout_dim(self):
        return self.attention_vector_size if self.attention is not None else self.units

    def build(self, target_ids_shape, memory_shape):
        batch = target_ids_shape[0]
        if not self.embedding.built:  # a shared embedding is built once
            self.embedding.build(target_ids_shape)
        input_dim = self.embedding_dim + (self.attention_vector_size if self.input_feeding else 0)
        for layer in self.recurrent_layers:
            layer.build((batch, None, input_dim))
            input_dim = self.units
        if self.attention is not None:
            query_shape = (batch, None, self.units)
            if not self.attention.built:
                self.attention.build(query_shape, memory_shape)
            context_dim = self.attention.value_dim(memory_shape[-1])
            self.attention_projection.build((batch, None, context_dim + self.units))
        self.output_projection.build((batch, None, self.readout_dim))

    # The step function: what search and export call, one token per hypothesis.

    def precompute(self, memory):
        """What depends on the memory alone, computed once per source (a tuple of tensors)."""
        return self.attention.precompute(memory) if self.attention is not None else ()

    def initial_state(self, cell_states):
        """The decoding state from the recurrent layers' initial states (e.g. the bridge's).

        A dict with "cells" (a tuple per layer of `[batch, units]` tensors) and, with input
        feeding, "feed": the previous attentional vector, zeros at the start.
        """
        state = {"cells": tuple(tuple(layer) for layer in cell_states)}
        if self.input_feeding:
            batch = ops.shape(cell_states[0][0])[0]
            state["feed"] = ops.zeros(
                (batch, self.attention_vector_size), dtype=cell_states[0][0].dtype
            )
        return state

    def zero_state(self, batch_size, dtype="float32"):
        cells = tuple(
            tuple(ops.zeros((batch_size, size), dtype=dtype) for size in layer)
            for layer in self.state_sizes
        )
        return self.initial_state(cells)

    def step(self, token_ids, state, memory_cache, memory_mask=None, training=False):
        """One decoding step.

        Args:
            token_ids: int `[batch * k]`, the previous tokens of k hypotheses per source,
                grouped by source (k = 1 outside beam search).
            state: the dict returned by `initial_state` or a previous `step`, `[batch * k, ...]`.
            memory_cache: the tuple returned by `precompute`, once per source (never tiled).
            memory_mask: boolean `[batch, src_len]`.

        Returns:
            logits `[batch * k, vocab_size]`, the new state, and attention weights
            `[batch * k, src_len]` (None without attention).
        """
        readout, state, weights = self._recurrent_step(
            token_lookup(self.embedding, token_ids), state, memory_cache, memory_mask, training
        )
        return self._logits(readout, training), state, weights

    def _recurrent_step(self, embedded, state, memory_cache, memory_mask, training):
        x = embedded
        if self.input_feeding:
            x = ops.concatenate([x, ops.cast(state["feed"], x.dtype)], axis=-1)
        new_cells = []
        for i, (layer, cell_state) in enumerate(zip(self.recurrent_layers, state["cells"])):
            output, new_state = recurrent_step(
                layer, self.dropout(x, training=training), list(cell_state), training
            )
            new_cells.append(tuple(new_state))
            x = output + x if self.residual and i > 0 else output
        readout, weights = self._attend(x, memory_cache, memory_mask)
        new_state = {"cells": tuple(new_cells)}
        if self.input_feeding:
            new_state["feed"] = readout
        return readout, new_state, weights

    def _attend(self, hidden, memory_cache, memory_mask):
        """The attentional vector (or `hidden` itself without attention) and the weights."""
        if self.attention is None:
            return hidden, None
        context, weights = self.attention.attend(hidden, memory_cache, memory_mask)
        attentional = self.attention_projection(
            ops.concatenate([ops.cast(context, hidden.dtype), hidden], axis=-1)
        )
        return attentional, weights

    def _logits(self, readout, training):
        return self.output_projection(self.dropout(readout, training=training))

    # The teacher-forced pass used in training and validation.

    def call(
        self,
        target_ids,
        memory,
        memory_mask=None,
        initial_state=None,
        sampling_probability=None,
        training=None,
    ):
        memory_mask = boolean_mask(memory_mask)
        memory_cache = self.precompute(memory)
        if initial_state is None:
            initial_state = self.zero_state(ops.shape(target_ids)[0], self.compute_dtype)
        if not self.input_feeding and sampling_probability is None:
            return self._fused_forward(
                target_ids, initial_state, memory_cache, memory_mask, training
            )
        if training and sampling_probability is None and self._hand_differentiated_loop_applies():
            return self._input_feeding_lstm_forward(
                target_ids, initial_state, memory_cache, memory_mask, training
            )
        return self._stepwise_forward(
            target_ids, initial_state, memory_cache, memory_mask, sampling_probability, training
        )

    def _fused_forward(self, target_ids, state, memory_cache, memory_mask, training):
        x = self.embedding(target_ids)
        for i, (layer, cell_state) in enumerate(zip(self.recurrent_layers, state["cells"])):
            output, *_ = layer(
                self.dropout(x, training=training),
                initial_state=list(cell_state),
                training=training,
            )
            x = output + x if self.residual and i > 0 else output
        readout, weights = self._attend(x, memory_cache, memory_mask)
        return self._logits(readout, training), weights

    def _hand_differentiated_loop_applies(self):
        attention = self.attention
        return (
            self.input_feeding
            and self.cell_type == "lstm"
            and isinstance(attention, LuongAttention)
            and attention.score_name in ("dot", "general")
            and all(has_default_gates(layer.cell) for layer in self.recurrent_layers)
            and keras.backend.backend() == "tensorflow"
        )

    def _dropout_masks(self, count, shape, training):
        """`count` scaled dropout masks of `shape`, drawn as `self.dropout` draws, or None."""
        if not training or not self.dropout_rate or not count:
            return None
        ones = ops.ones(shape, dtype=self.compute_dtype)
        return tuple(
            sixteen_bit_dropout(ones, self.dropout_rate, self.seed_generator) for _ in range(count)
        )

    def _input_feeding_lstm_forward(self, target_ids, state, memory_cache, memory_mask, training):
        dtype = self.compute_dtype
        batch, length = ops.shape(target_ids)[0], ops.shape(target_ids)[1]
        first_cell = self.recurrent_layers[0].cell
        # Split, not sliced: the gradient of two slices is two kernel-sized arrays of zeros.
        embedding_kernel, feed_kernel = tf.split(
            ops.cast(first_cell.kernel, dtype), [self.embedding_dim, -1], axis=0
        )
        # The embeddings' share of the first layer's gates: one product for all steps.
        embedded = self.dropout(self.embedding(target_ids), training=training)
        first_gate_inputs = tf.tensordot(
            ops.transpose(embedded, (1, 0, 2)), embedding_kernel, 1
        ) + ops.cast(first_cell.bias, dtype)
        later_cells = [layer.cell for layer in self.recurrent_layers[1:]]
        unit_gain = ops.ones((), dtype)
        weights = {
            "gain": ops.cast(self.attention.gain, dtype) if self.attention.scale else unit_gain,
            "feed_kernel": feed_kernel,
            "recurrent_kernels": tuple(
                ops.cast(layer.cell.recurrent_kernel, dtype) for layer in self.recurrent_layers
            ),
            "kernels": tuple(ops.cast(cell.kernel, dtype) for cell in later_cells),
            "biases": tuple(ops.cast(cell.bias, dtype) for cell in later_cells),
            "attentional": ops.cast(self.attention_projection.kernel, dtype),
        }
        feed_masks = self._dropout_masks(1, (length, batch, self.attention_vector_size), training)
        layer_masks = self._dropout_masks(len(later_cells), (length, batch, self.units), training)
        keys, values = (ops.cast(x, dtype) for x in memory_cache)
        outputs, weights_over_source = input_feeding_lstm_recurrence(
            first_gate_inputs,
            tuple(tuple(ops.cast(x, dtype) for x in cell) for cell in state["cells"]),
            ops.cast(state["feed"], dtype),
            keys,
            values,
            memory_mask,
            weights,
            feed_mask=None if feed_masks is None else feed_masks[0],
            layer_masks=layer_masks,
            residual=self.residual,
        )
        logits = self._logits(ops.transpose(outputs, (1, 0, 2)), training)
        return logits, ops.transpose(weights_over_source, (1, 0, 2))

    def _stepwise_forward(
        self, target_ids, state, memory_cache, memory_mask, sampling_probability, training
    ):
        # TensorFlow directly, not keras.ops.while_loop: the loop writes each step's output
        # into a TensorArray (a growing list of a symbolic length), which keras.ops has not.
        sampling = sampling_probability is not None
        batch, length = ops.shape(target_ids)[0], ops.shape(target_ids)[1]
        time_major_ids = ops.transpose(target_ids)
        # Without sampling the readout runs once, batched, after the loop; with sampling the
        # loop needs each step's logits to draw the next input, so it emits logits instead.
        output_dim = self.vocab_size if sampling else self.readout_dim
        outputs = tf.TensorArray(self.compute_dtype, size=length, element_shape=(None, output_dim))
        alignments = tf.TensorArray(self.compute_dtype, size=length, element_shape=(None, None))
        previous_prediction = ops.zeros((batch,), dtype=target_ids.dtype)

        def body(t, state, previous_prediction, outputs, alignments):
            tokens = time_major_ids[t]
            if sampling:
                coin = keras.random.uniform((batch,), seed=self.seed_generator)
                use_prediction = ops.logical_and(coin < sampling_probability, t > 0)
                tokens = ops.where(use_prediction, previous_prediction, tokens)
            readout, state, weights = self._recurrent_step(
                self.embedding(tokens), state, memory_cache, memory_mask, training
            )
            if sampling:
                logits = self._logits(readout, training)
                previous_prediction = ops.cast(
                    ops.squeeze(
                        keras.random.categorical(
                            ops.stop_gradient(ops.cast(logits, "float32")),
                            1,
                            seed=self.seed_generator,
                        ),
                        1,
                    ),
                    target_ids.dtype,
                )
                outputs = outputs.write(t, logits)
            else:
                outputs = outputs.write(t, readout)
            if weights is not None:
                alignments = alignments.write(t, weights)
            return t + 1, state, previous_prediction, outputs, alignments

        _, _, _, outputs, alignments = tf.while_loop(
            lambda t, *_: t < length,
            body,
            (tf.constant(0), state, previous_prediction, outputs, alignments),
        )
        outputs = ops.transpose(outputs.stack(), (1, 0, 2))
        logits = outputs if sampling else self._logits(outputs, training)
        weights = None
        if self.attention is not None:
            weights = ops.transpose(alignments.stack(), (1, 0, 2))
        return logits, weights
