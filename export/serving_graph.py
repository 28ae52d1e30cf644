"""The exported graph: a `tf.Module` whose functions become the SavedModel's signatures.

The module tracks only the model's underlying `tf.Variable`s (and the tokenizers' resources),
never the Keras model itself: a tracked Keras 3 model saves a graph that `tf.saved_model.load`
reads but the session-based loader of TF Serving and `saved_model_cli run` cannot.
Search runs on the model's step function (`pipeline.search`), as it does in process.
"""

import tensorflow as tf
import tensorflow_text as tf_text

from pipeline.search import beam_search, blank_empty_sources, max_decode_length
from pipeline.tokenizer import PAD_ID, UNK_ID

BEAM_SEARCH = "beam_search"
SERVING_DEFAULT = "serving_default"
MAX_BEAM_SIZE = 64


class TranslationGraph(tf.Module):
    """Signatures of a trained model, with the decoding defaults of its configuration.

    `beam_search`: source ids int32 `[batch, src_len]` (right-padded with 0) and optional
    scalars `beam_size`, `n_best`, `length_penalty`, `max_length` (0: ratio x source length +
    offset) -> `ids` int32 `[batch, n_best, max_len]`, `lengths` int32 `[batch, n_best]`,
    `scores` float32 `[batch, n_best]` and `attention` float32 `[batch, n_best, max_len,
    src_len]`. Lengths are capped at `max_length_cap` whatever is asked; sources are cut at
    `decode.max_source_length`; ids outside the vocabulary read as <unk>; an all-padding
    source gives ids all 0, length 0 and score 0.

    `translate` (the `serving_default` signature): sentences string `[batch]` ->
    `translations` string `[batch]` and `scores` float32 `[batch]`, with SentencePiece
    tokenisation (sources cut at `decode.max_source_length` pieces), beam search with the defaults
    and detokenisation in the graph. An empty sentence translates to an empty string.
    """

    def __init__(self, model, source_model_proto, target_model_proto, decode):
        super().__init__(name="translation")
        # The variables, not the model: see the module docstring.
        self.model_variables = [variable.value for variable in model.variables]
        # Distinct names matter: the SentencePiece kernel shares its model resource by node
        # name, so two unnamed tokenizers restored from a SavedModel both get the first model.
        self.source_tokenizer = tf_text.SentencepieceTokenizer(
            source_model_proto, tf.int32, name="source_sentencepiece"
        )
        self.target_tokenizer = tf_text.SentencepieceTokenizer(
            target_model_proto, tf.int32, name="target_sentencepiece"
        )
        self.max_source_length = max_source_length = decode["max_source_length"]
        self.defaults = {
            "beam_size": int(decode["beam_size"]),
            "n_best": 1,
            "length_penalty": float(decode["length_penalty"]),
            "max_length": 0,
        }
        penalty_type, cap = decode["length_penalty_type"], decode["max_length_cap"]
        ratio, offset = decode["max_length_ratio"], decode["max_length_offset"]
        self.max_length_cap = cap

        source_vocab_size = model.source_vocab_size

        def search(source_ids, beam_size, n_best, length_penalty, max_length):
            # Requests are untrusted: ids outside the vocabulary read as <unk>, long sources
            # are cut, and the beam is kept within [1, MAX_BEAM_SIZE].
            valid = tf.logical_and(source_ids >= 0, source_ids < source_vocab_size)
            source_ids = tf.where(valid, source_ids, UNK_ID)[:, :max_source_length]
            lengths = tf.reduce_sum(tf.cast(source_ids != PAD_ID, tf.int32), axis=1)
            automatic = max_decode_length(lengths, ratio, offset, cap)
            max_length = tf.where(max_length > 0, tf.minimum(max_length, cap), automatic)
            outputs = beam_search(
                model,
                source_ids,
                max_length,
                beam_size=tf.clip_by_value(beam_size, 1, MAX_BEAM_SIZE),
                n_best=tf.maximum(n_best, 1),
                alpha=length_penalty,
                penalty=penalty_type,
                beta=decode["coverage_penalty"],
                min_length=decode["min_length"],
            )
            ids, lengths, scores, attention = blank_empty_sources(source_ids, PAD_ID, *outputs)
            return {"ids": ids, "lengths": lengths, "scores": scores, "attention": attention}

        d = {key: tf.constant(value) for key, value in self.defaults.items()}

        # Defaults that are tensors become the signature's defaults: a request may omit them.
        @tf.function(
            input_signature=[
                tf.TensorSpec([None, None], tf.int32, name="source_ids"),
                tf.TensorSpec([], tf.int32, name="beam_size"),
                tf.TensorSpec([], tf.int32, name="n_best"),
                tf.TensorSpec([], tf.float32, name="length_penalty"),
                tf.TensorSpec([], tf.int32, name="max_length"),
            ]
        )
        def beam_search_ids(
            source_ids,
            beam_size=d["beam_size"],
            n_best=d["n_best"],
            length_penalty=d["length_penalty"],
            max_length=d["max_length"],
        ):
            return search(source_ids, beam_size, n_best, length_penalty, max_length)

        @tf.function(input_signature=[tf.TensorSpec([None], tf.string, name="sentences")])
        def translate(sentences):
            pieces = self.source_tokenizer.tokenize(sentences)[:, :max_source_length]
            source_ids = pieces.to_tensor(PAD_ID)
            # A batch of empty sentences still needs one (padding) column to encode.
            width = tf.maximum(tf.shape(source_ids)[1], 1)
            source_ids = tf.pad(source_ids, [[0, 0], [0, width - tf.shape(source_ids)[1]]])
            best = search(source_ids, d["beam_size"], 1, d["length_penalty"], 0)
            return {
                "translations": self.target_tokenizer.detokenize(best["ids"][:, 0]),
                "scores": best["scores"][:, 0],
            }

        self.beam_search = beam_search_ids
        self.translate = translate

    def signatures(self):
        return {SERVING_DEFAULT: self.translate, BEAM_SEARCH: self.beam_search}
