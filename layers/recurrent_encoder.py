"""Stacked, optionally bidirectional, recurrent encoder."""

import keras
from keras import ops

from layers.masking import reverse_padded, sequence_mask
from layers.recorded_arguments import RecordsArguments
from layers.recurrent_layers import (
    check_cell_type,
    recurrent_layer,
    states_per_layer,
    token_embedding,
)
from layers.sixteen_bit_dropout import SixteenBitDropout
from layers.special_tokens import PAD_ID

MERGE_MODES = ("concat", "sum")


@keras.saving.register_keras_serializable(package="seq2seq")
class RecurrentEncoder(RecordsArguments, keras.layers.Layer):
    """Embeds source tokens and runs a stack of LSTM/GRU/SimpleRNN layers over them.

    Args:
        vocab_size: source vocabulary size.
        embedding_dim: size of the token embeddings.
        units: units of each recurrent layer (per direction).
        num_layers: number of stacked layers.
        cell_type: "lstm", "gru" or "simple_rnn".
        bidirectional: run every layer in both directions.
        merge_mode: how the two directions' outputs and states are combined, "concat" or "sum".
        dropout: dropout rate on the input of every layer and on the final outputs.
        output_dropout: dropout rate on the final outputs only (None: `dropout`); 0 leaves
            the attention's memory undropped, as OpenNMT-py's RNN encoder does.
        residual: add each layer's input to its output, from the second layer on.
        reverse_source: feed the source tokens in reverse order (Sutskever et al., 2014). Only
            the order of the recurrence changes: outputs are returned in source order, so
            attention weights still align with the source as written.
        pad_id: id of the padding token; padded positions are masked.

    Call:
        source_ids: int `[batch, src_len]`, right-padded with `pad_id`.

    Returns:
        outputs: `[batch, src_len, output_dim]` with `output_dim` = units, or 2 * units for a
            bidirectional encoder with merge_mode="concat".
        final_states: one tuple per layer of `[batch, output_dim]` states: (h, c) for LSTM,
            (h,) otherwise; bidirectional states are merged like the outputs.
        mask: boolean `[batch, src_len]`, True at real tokens.
    """

    def __init__(
        self,
        vocab_size,
        embedding_dim,
        units,
        num_layers=1,
        cell_type="lstm",
        bidirectional=False,
        merge_mode="concat",
        dropout=0.0,
        output_dropout=None,
        residual=False,
        reverse_source=False,
        pad_id=PAD_ID,
        **kwargs,
    ):
        super().__init__(**kwargs)
        if merge_mode not in MERGE_MODES:
            raise ValueError(f"merge_mode must be one of {MERGE_MODES}, got {merge_mode!r}")
        if int(num_layers) < 1:
            raise ValueError(f"num_layers must be at least 1, got {num_layers}")
        self.vocab_size = int(vocab_size)
        self.embedding_dim = int(embedding_dim)
        self.units = int(units)
        self.num_layers = int(num_layers)
        self.cell_type = check_cell_type(cell_type)
        self.bidirectional = bool(bidirectional)
        self.merge_mode = merge_mode
        self.dropout_rate = float(dropout)
        self.output_dropout_rate = (
            self.dropout_rate if output_dropout is None else float(output_dropout)
        )
        self.residual = bool(residual)
        self.reverse_source = bool(reverse_source)
        self.pad_id = int(pad_id)

        self.embedding = token_embedding(vocab_size, embedding_dim)
        self.dropout = SixteenBitDropout(self.dropout_rate)
        # Its own layer only at its own rate: a dropout's seed state is a variable, and models
        # saved without one must still load.
        self.output_dropout = (
            self.dropout
            if self.output_dropout_rate == self.dropout_rate
            else SixteenBitDropout(self.output_dropout_rate)
        )
        self.recurrent_layers = []
        for i in range(self.num_layers):
            layer = recurrent_layer(self.cell_type, self.units, name=f"layer_{i}")
            if self.bidirectional:
                layer = keras.layers.Bidirectional(layer, merge_mode=None, name=f"bi_layer_{i}")
            self.recurrent_layers.append(layer)

    @property
    def output_dim(self):
        concat = self.bidirectional and self.merge_mode == "concat"
        return self.units * (2 if concat else 1)

    @property
    def state_sizes(self):
        """Sizes of `final_states`: a tuple per layer of one int per state tensor."""
        per_layer = (self.output_dim,) * states_per_layer(self.cell_type)
        return (per_layer,) * self.num_layers

    def build(self, source_ids_shape):
        if not self.embedding.built:  # a shared embedding is built once
            self.embedding.build(source_ids_shape)
        batch, length = source_ids_shape[0], source_ids_shape[1]
        input_dim = self.embedding_dim
        for layer in self.recurrent_layers:
            layer.build((batch, length, input_dim))
            input_dim = self.output_dim

    def _merge(self, forward, backward):
        if self.merge_mode == "concat":
            return ops.concatenate([forward, backward], axis=-1)
        return forward + backward

    def _run_layer(self, layer, inputs, mask, training):
        if not self.bidirectional:
            outputs, *states = layer(inputs, mask=mask, training=training)
            return outputs, tuple(states)
        # merge_mode=None returns [forward_out, backward_out, forward states..., backward states...]
        forward_out, backward_out, *states = layer(inputs, mask=mask, training=training)
        n = len(states) // 2
        merged_states = tuple(self._merge(f, b) for f, b in zip(states[:n], states[n:]))
        return self._merge(forward_out, backward_out), merged_states

    def call(self, source_ids, training=None):
        mask = sequence_mask(source_ids, self.pad_id)
        lengths = ops.sum(ops.cast(mask, "int32"), axis=1)
        if self.reverse_source:
            source_ids = reverse_padded(source_ids, lengths)
        x = self.embedding(source_ids)
        final_states = []
        for i, layer in enumerate(self.recurrent_layers):
            outputs, states = self._run_layer(
                layer, self.dropout(x, training=training), mask, training
            )
            x = outputs + x if self.residual and i > 0 else outputs
            final_states.append(states)
        outputs = self.output_dropout(x, training=training)
        if self.reverse_source:
            outputs = reverse_padded(outputs, lengths)
        return outputs, tuple(final_states), mask

    def compute_mask(self, source_ids, mask=None):
        return None

    def compute_output_shape(self, source_ids_shape):
        batch, length = source_ids_shape[0], source_ids_shape[1]
        states = tuple(
            tuple((batch, size) for size in layer_sizes) for layer_sizes in self.state_sizes
        )
        return (batch, length, self.output_dim), states, (batch, length)
