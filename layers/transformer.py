"""The Transformer encoder-decoder (Vaswani et al., 2017) on the shared decoding contract."""

import math

import keras
import keras_hub
import numpy as np
import tensorflow as tf
from keras import ops

from layers.encoder_decoder_model import EncoderDecoderModel
from layers.masking import sequence_mask
from layers.sixteen_bit_dropout import SixteenBitDropout
from layers.special_tokens import BOS_ID, EOS_ID, PAD_ID
from layers.split_sine_positions import SplitSinePositions
from layers.transformer_decoder_layer import TransformerDecoderLayer
from layers.transformer_encoder_layer import TransformerEncoderLayer

# positions -> its layer, made with (max_positions, name).
POSITION_LAYERS = {
    "sinusoidal": lambda length, name: keras_hub.layers.SinePositionEncoding(name=name),
    "learned": lambda length, name: keras_hub.layers.PositionEmbedding(length, name=name),
    # The same sinusoids with the sines first: Marian's, and fairseq's (M2M100's).
    "sinusoidal_halves": lambda length, name: SplitSinePositions(length, "marian", name=name),
    "sinusoidal_fairseq": lambda length, name: SplitSinePositions(length, "fairseq", name=name),
}
NEVER = -1e9  # the logit of a suppressed token: finite, so that sums of scores stay numbers


@keras.saving.register_keras_serializable(package="seq2seq")
class Transformer(EncoderDecoderModel):
    """Self-attention encoder and decoder with positional encodings, residual connections,
    layer normalisation and position-wise feed-forward layers.

    The encoder is a stack of keras-hub `TransformerEncoder` layers; the decoder a stack of
    `TransformerDecoderLayer`s, which decode incrementally with growing self-attention
    caches. Token embeddings are scaled by sqrt(model_dim) and summed with the positions
    (keras-hub's `SinePositionEncoding` or a learned `PositionEmbedding`). Inputs, outputs and
    the decoding contract: see `EncoderDecoderModel`; the attention weights it returns are the
    last decoder layer's cross-attention, averaged over heads.

    The model properties (`model_dim` ... `suppressed_ids`) are the `model` keys of a
    Transformer configuration, by the same names and with the meanings of
    docs/configuration.md, where `pipeline.model_types.transformer` declares them; the builder
    passes them here by name and `get_config` returns every constructor argument
    (`RecordsArguments`). `target_language_first`, `label_smoothing`, `pad_id`, `bos_id` and
    `eos_id`: see `EncoderDecoderModel`. A suppressed id's logit is `NEVER` at every decoding
    step and in training, so that search never outputs it and no softmax counts it; label
    smoothing spreads over the other ids. `positions` takes the keys of `POSITION_LAYERS`.
    """

    def __init__(
        self,
        source_vocab_size,
        target_vocab_size,
        model_dim=512,
        num_heads=8,
        ffn_dim=2048,
        encoder_layers=6,
        decoder_layers=6,
        dropout=0.1,
        attention_dropout=None,
        ffn_dropout=None,
        positions="sinusoidal",
        max_positions=512,
        tie_embeddings=True,
        normalize_first=True,
        share_embeddings=False,
        activation="relu",
        output_bias=False,
        source_eos=False,
        target_language_first=False,
        scale_embeddings=True,
        decoder_num_heads=None,
        decoder_ffn_dim=None,
        suppressed_ids=(),
        embedding_norm=False,
        label_smoothing=0.0,
        pad_id=PAD_ID,
        bos_id=BOS_ID,
        eos_id=EOS_ID,
        **kwargs,
    ):
        super().__init__(label_smoothing, pad_id, bos_id, eos_id, target_language_first, **kwargs)
        if positions not in POSITION_LAYERS:
            raise ValueError(f"positions must be one of {tuple(POSITION_LAYERS)}, got "
                             f"{positions!r}")  # fmt: skip
        self._source_vocab_size = int(source_vocab_size)
        self._target_vocab_size = int(target_vocab_size)
        self.model_dim = int(model_dim)
        self.num_heads = int(num_heads)
        self.ffn_dim = int(ffn_dim)
        self.num_encoder_layers = int(encoder_layers)
        self.num_decoder_layers = int(decoder_layers)
        self.dropout_rate = float(dropout)
        self.attention_dropout_rate = float(
            dropout if attention_dropout is None else attention_dropout
        )
        self.ffn_dropout_rate = float(dropout if ffn_dropout is None else ffn_dropout)
        self.positions = positions
        self.max_positions = int(max_positions)
        self.tie_embeddings = bool(tie_embeddings)
        self.normalize_first = bool(normalize_first)
        self.share_embeddings = bool(share_embeddings)
        self.activation = activation
        self.use_output_bias = bool(output_bias)
        self.source_eos = bool(source_eos)
        self.scale_embeddings = bool(scale_embeddings)
        self.decoder_num_heads = int(decoder_num_heads or num_heads)
        self.decoder_ffn_dim = int(decoder_ffn_dim or ffn_dim)
        self.suppressed_ids = tuple(int(i) for i in suppressed_ids)
        self.embedding_norm = bool(embedding_norm)
        if self.share_embeddings and self._source_vocab_size != self._target_vocab_size:
            raise ValueError(
                "share_embeddings needs one vocabulary for both sides, got "
                f"{self._source_vocab_size} source and {self._target_vocab_size} target ids"
            )

        # N(0, 1/d) embeddings, scaled by sqrt(d): inputs of unit variance, and a tied output
        # projection of the usual scale.
        initializer = keras.initializers.RandomNormal(stddev=self.model_dim**-0.5)
        self.target_embedding = keras_hub.layers.ReversibleEmbedding(
            self._target_vocab_size, self.model_dim, tie_weights=self.tie_embeddings,
            embeddings_initializer=initializer, name="target_embedding",
        )  # fmt: skip
        # Shared: one matrix embeds both sides (and, tied, projects the output).
        self.source_embedding = self.target_embedding if self.share_embeddings else (
            keras.layers.Embedding(
                self._source_vocab_size, self.model_dim, embeddings_initializer=initializer,
                name="source_embedding",
            )
        )  # fmt: skip
        self.source_positions, self.target_positions = (
            POSITION_LAYERS[positions](self.max_positions, f"{side}_positions")
            for side in ("source", "target")
        )
        self.source_embedding_norm = self.target_embedding_norm = None
        if self.embedding_norm:
            self.source_embedding_norm, self.target_embedding_norm = (
                keras.layers.LayerNormalization(epsilon=1e-5, name=f"{side}_embedding_norm")
                for side in ("source", "target")
            )
        self.dropout = SixteenBitDropout(self.dropout_rate)
        self._create_stacks()

    def _create_stacks(self):
        """The encoder and decoder layers, and a pre-norm stack's final normalisations."""
        self.encoder_layers = [
            TransformerEncoderLayer(
                self.ffn_dim,
                self.num_heads,
                attention_dropout=self.attention_dropout_rate,
                dropout=self.dropout_rate,
                activation=self.activation,
                normalize_first=self.normalize_first,
                name=f"encoder_layer_{i}",
            )  # fmt: skip
            for i in range(self.num_encoder_layers)
        ]
        self.decoder_layers = [
            TransformerDecoderLayer(
                self.decoder_ffn_dim,
                self.decoder_num_heads,
                dropout=self.dropout_rate,
                attention_dropout=self.attention_dropout_rate,
                ffn_dropout=self.ffn_dropout_rate,
                activation=self.activation,
                normalize_first=self.normalize_first,
                name=f"decoder_layer_{i}",
            )  # fmt: skip
            for i in range(self.num_decoder_layers)
        ]
        # Pre-norm stacks end unnormalised: normalise their outputs once.
        self.encoder_norm = self.decoder_norm = None
        if self.normalize_first:
            self.encoder_norm = keras.layers.LayerNormalization(epsilon=1e-5, name="encoder_norm")
            self.decoder_norm = keras.layers.LayerNormalization(epsilon=1e-5, name="decoder_norm")

    def build(self, input_shape):
        sequence = (None, None, self.model_dim)
        for embedding in {
            id(e): e for e in (self.source_embedding, self.target_embedding)
        }.values():
            embedding.build((None, None))
        for layer in (self.source_positions, self.target_positions):
            layer.build(sequence)
        if self.embedding_norm:
            self.source_embedding_norm.build(sequence)
            self.target_embedding_norm.build(sequence)
        for layer in self.encoder_layers:
            layer.build(sequence)
        for layer in self.decoder_layers:
            layer.build(sequence, sequence)
        if self.normalize_first:
            self.encoder_norm.build(sequence)
            self.decoder_norm.build(sequence)
        self.output_bias = None
        if self.use_output_bias:
            self.output_bias = self.add_weight(
                shape=(self._target_vocab_size,), initializer="zeros", name="output_bias"
            )
        # A [vocab] bias of the logits: NEVER at the suppressed ids.
        self._suppression = None
        if self.suppressed_ids:
            suppression = np.zeros(self._target_vocab_size, np.float32)
            suppression[list(self.suppressed_ids)] = NEVER
            self._suppression = suppression

    @property
    def source_vocab_size(self):
        return self._source_vocab_size

    @property
    def target_vocab_size(self):
        return self._target_vocab_size

    def _embed(self, embedding, positions, norm, token_ids, start_index=0, training=False):
        x = embedding(token_ids)
        if self.scale_embeddings:
            x = x * ops.cast(math.sqrt(self.model_dim), self.compute_dtype)
        x = x + ops.cast(positions(x, start_index=start_index), x.dtype)
        if norm is not None:
            x = norm(x)
        return self.dropout(x, training=training)

    def _final_norm(self, norm, x):
        return x if norm is None else norm(x)

    def _logits(self, features):
        if self.tie_embeddings:
            logits = self._by_embedding(features)
        else:
            logits = self.target_embedding(features, reverse=True)
        bias = self.logit_bias()
        return logits if bias is None else logits + ops.cast(bias, logits.dtype)

    def _by_embedding(self, features):
        """`features` `[..., model_dim]` times the transposed target embedding.

        By the `[vocab, model_dim]` matrix as stored, adjoint: TensorFlow's batched product
        takes a beam's few rows faster than a MatMul by the transpose (which an einsum becomes
        too). Rows flattened: the gradient of a product broadcast over [batch, time] would
        hold a [vocab, model_dim] matrix per sequence. tf2onnx writes the adjoint as a
        transpose only where it knows the matrix's shape: hence the static one.
        """
        embeddings = tf.ensure_shape(
            ops.cast(self.target_embedding.embeddings, features.dtype),
            (self._target_vocab_size, self.model_dim),
        )
        stepping = len(features.shape) == 2  # a decoder step's rows, already flat
        rows = features if stepping else tf.reshape(features, (-1, self.model_dim))
        logits = tf.raw_ops.BatchMatMulV2(x=rows, y=embeddings, adj_y=True)
        if stepping:
            return logits
        shape = tf.concat([tf.shape(features)[:-1], [self._target_vocab_size]], 0)
        return tf.reshape(logits, shape)

    def logit_bias(self):
        """float32 `[target_vocab_size]` added to the logits, or None: `output_bias` and
        `NEVER` at the `suppressed_ids`."""
        if self._suppression is None:
            return None if self.output_bias is None else ops.cast(self.output_bias, "float32")
        suppression = ops.convert_to_tensor(self._suppression, "float32")
        if self.output_bias is None:
            return suppression
        return ops.cast(self.output_bias, "float32") + suppression

    def smoothing_spread(self):
        """Label smoothing's uniform distribution over the ids the model may output (not
        `suppressed_ids`), float32 `[target_vocab_size]`; None: over every id."""
        if self._suppression is None:
            return None
        allowed = (self._suppression == 0).astype(np.float32)
        return ops.convert_to_tensor(allowed / allowed.sum())

    def _with_source_eos(self, source_ids):
        """`source_ids` with </s> after each source's last token (and one more column)."""
        source_ids = ops.convert_to_tensor(source_ids, "int32")
        lengths = ops.sum(ops.cast(ops.not_equal(source_ids, self.pad_id), "int32"), axis=1)
        padded = ops.pad(source_ids, [[0, 0], [0, 1]], constant_values=self.pad_id)
        at_end = ops.arange(ops.shape(padded)[1])[None, :] == lengths[:, None]
        return ops.where(at_end, self.eos_id, padded)

    def _source_weights(self, weights, memory_mask):
        """Attention weights over the sources as the caller gave them (`[rows, ..., src_len]`,
        rows grouped by source as the search groups them): with `source_eos`, the appended
        </s>'s share is left out and the rest renormalised, so that alignments, plots and
        <unk> replacement see a distribution over the caller's tokens."""
        if not self.source_eos:
            return weights
        # Position j is one of the caller's tokens iff j + 1 is unmasked (</s> follows the last).
        real = ops.cast(memory_mask[:, 1:], weights.dtype)
        sources = ops.shape(real)[0]
        grouped = ops.reshape(weights[..., :-1], (sources, -1, ops.shape(real)[1]))
        grouped = grouped * real[:, None, :]
        total = ops.maximum(ops.sum(grouped, axis=-1, keepdims=True), 1e-9)
        return ops.reshape(grouped / total, ops.shape(weights[..., :-1]))

    # Decoding contract.

    def encode(self, source_ids, training=False):
        """The encoder's memory, each decoder layer's cross-attention keys and values, and
        the source mask: computed once per source."""
        if self.source_eos:
            source_ids = self._with_source_eos(source_ids)
        memory_mask = sequence_mask(source_ids, self.pad_id)
        x = self._embed(self.source_embedding, self.source_positions, self.source_embedding_norm,
                        source_ids, 0, training)  # fmt: skip
        for layer in self.encoder_layers:
            x = layer(x, padding_mask=memory_mask, training=training)
        memory = self._final_norm(self.encoder_norm, x)
        return {
            "memory": memory,
            "memory_cache": tuple(layer.precompute(memory) for layer in self.decoder_layers),
            "memory_mask": memory_mask,
        }

    def initial_decoder_state(self, encoded):
        """Empty self-attention caches (no positions yet) for every decoder layer."""
        batch = ops.shape(encoded["memory"])[0]
        return {
            "self_attention": tuple(
                layer.initial_cache(batch, encoded["memory"].dtype) for layer in self.decoder_layers
            )
        }

    def decode_step(self, token_ids, state, encoded, step):
        """logits `[batch * k, vocab]`, the state with this position's keys and values cached,
        and the last layer's cross-attention weights `[batch * k, src_len]`."""
        x = self._embed(self.target_embedding, self.target_positions, self.target_embedding_norm,
                        token_ids[:, None], start_index=step)[:, 0]  # fmt: skip
        caches = []
        for layer, cache, memory_cache in zip(
            self.decoder_layers, state["self_attention"], encoded["memory_cache"]
        ):
            x, cache, weights = layer.step(x, cache, memory_cache, encoded["memory_mask"])
            caches.append(cache)
        logits = self._logits(self._final_norm(self.decoder_norm, x))
        weights = self._source_weights(weights, encoded["memory_mask"])
        return logits, {"self_attention": tuple(caches)}, weights

    # Teacher-forced pass.

    def output_features(self, inputs, training=None):
        """What the output projection takes, `[batch, tgt_len, model_dim]`, and the last
        layer's cross-attention weights `[batch, tgt_len, src_len]`."""
        encoded = self.encode(inputs["source_ids"], training=training)
        x = self._embed(self.target_embedding, self.target_positions, self.target_embedding_norm,
                        inputs["target_input_ids"], 0, training)  # fmt: skip
        for layer, memory_cache in zip(self.decoder_layers, encoded["memory_cache"]):
            x, weights = layer(x, memory_cache, encoded["memory_mask"], training=training)
        weights = self._source_weights(weights, encoded["memory_mask"])
        return self._final_norm(self.decoder_norm, x), weights

    def output_kernel(self):
        """`[model_dim, target_vocab_size]`: logits are `output_features` times it (plus
        `output_bias`, where the model has one)."""
        if self.tie_embeddings:
            return ops.transpose(self.target_embedding.embeddings)
        return self.target_embedding.reverse_embeddings

    def forward(self, inputs, training=None):
        """Logits `[batch, tgt_len, vocab]` and the last layer's cross-attention weights
        `[batch, tgt_len, src_len]`."""
        features, weights = self.output_features(inputs, training=training)
        return self._logits(features), weights

    def call(self, inputs, training=None):
        return self.forward(inputs, training=training)[0]

    @classmethod
    def from_config(cls, config):
        # The names that model.keras files of earlier releases hold.
        renamed = {"intermediate_dim": "ffn_dim", "decoder_intermediate_dim": "decoder_ffn_dim"}
        return cls(**{renamed.get(key, key): value for key, value in config.items()})
