"""The attentional encoder-decoder model."""

import keras

from layers.encoder_decoder_model import EncoderDecoderModel
from layers.scheduled_sampling import SamplingSchedule
from layers.state_bridge import StateBridge


def _deserialize(obj):
    return keras.saving.deserialize_keras_object(obj) if isinstance(obj, dict) else obj


@keras.saving.register_keras_serializable(package="seq2seq")
class Seq2Seq(EncoderDecoderModel):
    """Recurrent encoder, bridge and attentional decoder, trained with teacher forcing or
    scheduled sampling. Inputs, labels, outputs and the decoding contract: see
    `EncoderDecoderModel`.

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
        super().__init__(label_smoothing, pad_id, bos_id, eos_id, **kwargs)
        self.encoder = _deserialize(encoder)
        self.decoder = _deserialize(decoder)
        if isinstance(scheduled_sampling, dict):
            scheduled_sampling = SamplingSchedule.from_config(scheduled_sampling)
        self.scheduled_sampling = scheduled_sampling
        self.bridge = StateBridge(bridge, self.decoder.state_sizes, name="bridge")

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
    def source_vocab_size(self):
        return self.encoder.vocab_size

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

    def initial_decoder_state(self, encoded, max_length=None):
        return self.decoder.initial_state(self.bridge(encoded["final_states"]))

    def decode_step(self, token_ids, state, encoded, step=None):
        """logits `[batch * k, vocab]`, next state, attention weights `[batch * k, src_len]` or
        None, for k hypotheses per source (see `EncoderDecoderModel`). A recurrent state needs
        neither `max_length` nor `step`."""
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

    def get_config(self):
        config = super().get_config()
        config.update(
            encoder=keras.saving.serialize_keras_object(self.encoder),
            decoder=keras.saving.serialize_keras_object(self.decoder),
            bridge=self.bridge.kind,
            scheduled_sampling=(
                self.scheduled_sampling.get_config() if self.scheduled_sampling else None
            ),
        )
        return config
