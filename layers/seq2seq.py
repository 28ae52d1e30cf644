"""The attentional encoder-decoder model."""

import keras
import tensorflow as tf
from keras import ops

from layers.scheduled_sampling import SamplingSchedule
from layers.state_bridge import StateBridge
from layers.token_losses import (
    Perplexity,
    TokenAccuracy,
    replicas_in_sync,
    sum_over_replicas,
    token_cross_entropy,
)


def _logs_for_multi_worker(logs):
    """Under MultiWorkerMirroredStrategy, Keras averages each replica's logs along axis 0,
    which scalars lack: give them one (the values are equal, being synchronised metrics)."""
    if not isinstance(tf.distribute.get_strategy(), tf.distribute.MultiWorkerMirroredStrategy):
        return logs
    return {name: ops.reshape(value, [1]) for name, value in logs.items()}


def _deserialize(obj):
    return keras.saving.deserialize_keras_object(obj) if isinstance(obj, dict) else obj


@keras.saving.register_keras_serializable(package="seq2seq")
class Seq2Seq(keras.Model):
    """Encoder, bridge and decoder, trained with teacher forcing or scheduled sampling.

    Inputs (a dict):
        source_ids: int `[batch, src_len]`, right-padded with `pad_id`.
        target_input_ids: int `[batch, tgt_len]`, `<s> y_1 ... y_n`, right-padded.
    Labels: int `[batch, tgt_len]`, `y_1 ... y_n </s>`, right-padded.
    Output: logits `[batch, tgt_len, target_vocab_size]`.

    Training minimises the cross-entropy averaged over the non-padding target tokens (with
    optional label smoothing) and reports `token_accuracy` and `perplexity`.

    Decoding uses the step-function contract below, which search and export depend on (never
    the reverse), so any encoder/decoder pair that honours it plugs into them:
        encoded = model.encode(source_ids)                 # dict of batch-major tensors
        state = model.initial_decoder_state(encoded)       # nest of batch-major tensors
        logits, state, weights = model.decode_step(token_ids, state, encoded)
    `encoded` holds one row per source. Search may keep k hypotheses per source: it repeats
    each row of the state k times, and `decode_step` then takes `[batch * k]` tokens and
    state rows, grouped by source (rows i*k ... i*k+k-1 belong to source i), with the
    untiled `encoded`, and returns `[batch * k, ...]` outputs.

    Args:
        encoder: a `RecurrentEncoder` (or its serialised config).
        decoder: an `AttentionDecoder` (or its serialised config).
        bridge: "dense", "copy" or "zero" (see `StateBridge`).
        label_smoothing: epsilon of label smoothing.
        scheduled_sampling: a `SamplingSchedule` (or its config), or None for teacher forcing.
        pad_id, bos_id, eos_id: ids of the special target tokens.
    """

    def __init__(
        self,
        encoder,
        decoder,
        bridge="dense",
        label_smoothing=0.0,
        scheduled_sampling=None,
        pad_id=0,
        bos_id=2,
        eos_id=3,
        **kwargs,
    ):
        super().__init__(**kwargs)
        if not 0.0 <= float(label_smoothing) < 1.0:
            raise ValueError(f"label_smoothing must be in [0, 1), got {label_smoothing}")
        self.encoder = _deserialize(encoder)
        self.decoder = _deserialize(decoder)
        if isinstance(scheduled_sampling, dict):
            scheduled_sampling = SamplingSchedule.from_config(scheduled_sampling)
        self.scheduled_sampling = scheduled_sampling
        self.bridge = StateBridge(bridge, self.decoder.state_sizes, name="bridge")
        self.label_smoothing = float(label_smoothing)
        self.pad_id, self.bos_id, self.eos_id = int(pad_id), int(bos_id), int(eos_id)
        self.token_accuracy = TokenAccuracy()
        self.perplexity = Perplexity()

    def build(self, input_shape):
        source_shape = tuple(input_shape["source_ids"])
        target_shape = tuple(input_shape["target_input_ids"])
        memory_shape, states_shape, _ = self.encoder.compute_output_shape(source_shape)
        if not self.encoder.built:
            self.encoder.build(source_shape)
        if not self.bridge.built:
            self.bridge.build(states_shape)
        if not self.decoder.built:
            self.decoder.build(target_shape, memory_shape)

    # Decoding contract.

    @property
    def target_vocab_size(self):
        return self.decoder.vocab_size

    def encode(self, source_ids, training=False):
        """Runs the encoder once per source: a dict of batch-major tensors for `decode_step`."""
        memory, final_states, memory_mask = self.encoder(source_ids, training=training)
        return {
            "memory": memory,
            "memory_cache": self.decoder.precompute(memory),
            "memory_mask": memory_mask,
            "final_states": final_states,
        }

    def initial_decoder_state(self, encoded):
        return self.decoder.initial_state(self.bridge(encoded["final_states"]))

    def decode_step(self, token_ids, state, encoded):
        """logits `[batch * k, vocab]`, next state, attention weights `[batch * k, src_len]` or
        None, for k hypotheses per source (see the decoding contract above)."""
        return self.decoder.step(
            token_ids, state, encoded["memory_cache"], encoded["memory_mask"], training=False
        )

    # Teacher-forced pass.

    def forward(self, inputs, training=None, sampling_probability=None):
        """Logits `[batch, tgt_len, vocab]` and attention weights `[batch, tgt_len, src_len]`."""
        memory, final_states, memory_mask = self.encoder(inputs["source_ids"], training=training)
        return self.decoder(
            inputs["target_input_ids"],
            memory,
            memory_mask=memory_mask,
            initial_state=self.decoder.initial_state(self.bridge(final_states)),
            sampling_probability=sampling_probability,
            training=training,
        )

    def call(self, inputs, training=None):
        sampling_probability = None
        if training and self.scheduled_sampling is not None:
            step = self.optimizer.iterations if self.optimizer is not None else 0
            sampling_probability = self.scheduled_sampling(step)
        logits, _ = self.forward(
            inputs, training=training, sampling_probability=sampling_probability
        )
        return logits

    def compute_loss(self, x=None, y=None, y_pred=None, sample_weight=None, training=True):
        mask = ops.not_equal(y, self.pad_id)
        losses, nll = token_cross_entropy(y, y_pred, mask, self.label_smoothing)
        # This replica's share of the mean over every replica's target tokens (see
        # `sum_over_replicas`); with one replica, the plain mean.
        tokens = sum_over_replicas(ops.sum(ops.cast(mask, "float32")))
        loss = ops.divide_no_nan(ops.sum(losses), tokens)
        self.token_accuracy.update_state(y, y_pred, mask)
        self.perplexity.update_state(nll, mask)
        if self.losses:
            loss = loss + ops.sum(self.losses) / replicas_in_sync()  # each replica: its share
        return loss

    def train_step(self, data):
        return _logs_for_multi_worker(super().train_step(data))

    def test_step(self, data):
        return _logs_for_multi_worker(super().test_step(data))

    def _maybe_symbolic_build(self, iterator=None, data_batch=None):
        # Under tf.distribute, Keras averages a first batch over the replicas to build from;
        # that fails when replicas hold batches of different lengths (length bucketing) and
        # would skip that batch. Built layers and a built optimizer need no sample batch.
        layers_built = all(layer.built for layer in self._flatten_layers())
        if layers_built and self.optimizer is not None and self.optimizer.built:
            return
        super()._maybe_symbolic_build(iterator=iterator, data_batch=data_batch)

    def get_config(self):
        config = super().get_config()
        config.update(
            encoder=keras.saving.serialize_keras_object(self.encoder),
            decoder=keras.saving.serialize_keras_object(self.decoder),
            bridge=self.bridge.kind,
            label_smoothing=self.label_smoothing,
            scheduled_sampling=(
                self.scheduled_sampling.get_config() if self.scheduled_sampling else None
            ),
            pad_id=self.pad_id,
            bos_id=self.bos_id,
            eos_id=self.eos_id,
        )
        return config

    @classmethod
    def from_config(cls, config):
        return cls(**config)
