"""The recurrent attentional encoder-decoder model."""

import keras

from layers.encoder_decoder_model import EncoderDecoderModel
from layers.scheduled_sampling import SamplingSchedule
from layers.special_tokens import BOS_ID, EOS_ID, PAD_ID
from layers.state_bridge import StateBridge


def _deserialize(obj, build=True):
    """A layer from its serialised config (built, as saved, unless `build` is False)."""
    if not isinstance(obj, dict):
        return obj
    if not build:
        obj = {key: value for key, value in obj.items() if key != "build_config"}
    return keras.saving.deserialize_keras_object(obj)


@keras.saving.register_keras_serializable(package="seq2seq")
class RecurrentSeq2Seq(EncoderDecoderModel):
    """Recurrent encoder, bridge and attentional decoder, trained with teacher forcing or
    scheduled sampling. Inputs, labels, outputs and the decoding contract: see
    `EncoderDecoderModel`.

    Args:
        encoder: a `RecurrentEncoder` or `SelfAttentionEncoder` (or its serialised config).
        decoder: an `AttentionDecoder` (or its serialised config).
        bridge: "dense", "copy" or "zero" (see `StateBridge`).
        label_smoothing: epsilon of label smoothing.
        scheduled_sampling: a `SamplingSchedule` (or its config), or None for teacher forcing.
        share_embeddings: the decoder embeds its tokens with the encoder's embedding (the two
            sides must then share one vocabulary and one embedding size).
        pad_id, bos_id, eos_id: ids of the special target tokens.
    """

    LAYER_ARGUMENTS = ("encoder", "decoder")

    def __init__(
        self,
        encoder,
        decoder,
        bridge="dense",
        label_smoothing=0.0,
        scheduled_sampling=None,
        share_embeddings=False,
        pad_id=PAD_ID,
        bos_id=BOS_ID,
        eos_id=EOS_ID,
        **kwargs,
    ):
        super().__init__(label_smoothing, pad_id, bos_id, eos_id, **kwargs)
        self.share_embeddings = bool(share_embeddings)
        self.encoder = _deserialize(encoder)
        # A built layer takes no new sublayer: the decoder gets the shared embedding first.
        self.decoder = _deserialize(decoder, build=not self.share_embeddings)
        if self.share_embeddings:
            sizes = [(e.input_dim, e.output_dim) for e in (self.encoder.embedding,
                                                           self.decoder.embedding)]  # fmt: skip
            if sizes[0] != sizes[1]:
                raise ValueError(
                    "share_embeddings needs one vocabulary and embedding size for both sides, "
                    f"got (vocabulary, size) {sizes[0]} and {sizes[1]}"
                )
            self.decoder.embedding = self.encoder.embedding
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

    def initial_decoder_state(self, encoded):
        return self.decoder.initial_state(self.bridge(encoded["final_states"]))

    def decode_step(self, token_ids, state, encoded, step=None):
        """logits `[batch * k, vocab]`, next state, attention weights `[batch * k, src_len]` or
        None, for k hypotheses per source (see `EncoderDecoderModel`). A recurrent state needs
        no `step`."""
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


# Models saved before the rename name the class "Seq2Seq": they load as RecurrentSeq2Seq.
keras.saving.get_custom_objects()["seq2seq>Seq2Seq"] = RecurrentSeq2Seq
