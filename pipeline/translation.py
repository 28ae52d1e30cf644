"""Translating lists of sentences: tokenise, batch by length, search, detokenise, restore order."""

import dataclasses

import numpy as np
import tensorflow as tf

from pipeline.config import defaults
from pipeline.length_batches import length_sorted_batches
from pipeline.search import (
    beam_search,
    blank_empty_sources,
    decode_length_limits,
    greedy_search,
    sampling_search,
)
from pipeline.tokenizer import EOS_ID, PAD_ID, UNK_ID

DECODE_DEFAULTS = defaults()["decode"]


@dataclasses.dataclass(frozen=True)
class SearchOptions:
    """How to search: beam search (beam_size 1 is greedy) or, with a temperature, sampling."""

    # The decode section's defaults, declared once in the configuration schema.
    beam_size: int = DECODE_DEFAULTS["beam_size"]
    n_best: int = 1
    length_penalty: float = DECODE_DEFAULTS["length_penalty"]
    length_penalty_type: str = DECODE_DEFAULTS["length_penalty_type"]
    coverage_penalty: float = DECODE_DEFAULTS["coverage_penalty"]
    min_length: int = DECODE_DEFAULTS["min_length"]
    no_repeat_ngram_size: int = DECODE_DEFAULTS["no_repeat_ngram_size"]
    max_length_ratio: float = DECODE_DEFAULTS["max_length_ratio"]
    max_length_offset: int = DECODE_DEFAULTS["max_length_offset"]
    max_length_cap: int = DECODE_DEFAULTS["max_length_cap"]
    max_source_length: int = DECODE_DEFAULTS["max_source_length"]
    replace_unknown: bool = DECODE_DEFAULTS["replace_unknown"]
    sampling_temperature: float | None = None
    sampling_topk: int = 0
    sampling_topp: float = 1.0
    seed: int = 0

    @classmethod
    def from_config(cls, decode_config, **overrides):
        names = {field.name for field in dataclasses.fields(cls)}
        values = {k: v for k, v in decode_config.items() if k in names}
        values.update({k: v for k, v in overrides.items() if v is not None})
        return cls(**values)


@dataclasses.dataclass
class Hypothesis:
    """One translation of a sentence, with what produced it."""

    text: str
    score: float
    target_tokens: list  # subword pieces, </s> included when the hypothesis ended
    source_tokens: list
    attention: np.ndarray  # [len(target_tokens), len(source_tokens)]


def replace_unknown(target_ids, target_pieces, source_pieces, attention):
    """Each <unk> target piece becomes the source piece it attends to most (Luong et al.,
    2015); `attention` is `[len(target_pieces), len(source_pieces)]`."""
    if not source_pieces:
        return list(target_pieces)
    return [
        source_pieces[int(np.argmax(attention[t]))] if token == UNK_ID else piece
        for t, (token, piece) in enumerate(zip(target_ids, target_pieces))
    ]


class Translator:
    """Translates sentences with a trained model, its tokenizers and `SearchOptions`.

    Sentences are sorted by length and decoded in batches of `batch_size` so that little
    work goes to padding; results keep the input order. A translation never depends on the
    other sentences of its batch: padding is masked throughout, each sentence has its own
    length limit, and sampling draws from each sentence's own seed.
    """

    def __init__(self, model, source_tokenizer, target_tokenizer, options, batch_size=64):
        self.model = model
        self.source_tokenizer = source_tokenizer
        self.target_tokenizer = target_tokenizer
        self.options = options
        self.batch_size = batch_size
        ids = tf.TensorSpec([None, None], tf.int32)
        self._search = tf.function(self._search_batch, input_signature=[ids])
        self._search_with_prefix = tf.function(self._search_batch, input_signature=[ids, ids])

    def _search_batch(self, source_ids, target_prefix=None):
        """ids `[batch, n, max_len]`, scores `[batch, n]`, attention `[batch, n, max_len, src]`;
        each hypothesis starting with its row of `target_prefix` (int32, right-padded)."""
        o = self.options
        limits = decode_length_limits(
            source_ids, PAD_ID, o.max_length_ratio, o.max_length_offset, o.max_length_cap
        )
        if o.sampling_temperature is not None:
            single = sampling_search(
                self.model, source_ids, limits, o.sampling_temperature, o.sampling_topk,
                o.sampling_topp, seed=(o.seed, 0), min_length=o.min_length,
                no_repeat_ngram_size=o.no_repeat_ngram_size, target_prefix=target_prefix,
            )  # fmt: skip
        elif o.beam_size == 1 and o.n_best == 1:
            single = greedy_search(
                self.model, source_ids, limits, o.min_length, o.no_repeat_ngram_size,
                target_prefix,
            )  # fmt: skip
        else:
            single = None
            outputs = beam_search(
                self.model, source_ids, limits, o.beam_size, o.n_best,
                o.length_penalty, o.length_penalty_type, o.coverage_penalty, o.min_length,
                o.no_repeat_ngram_size, target_prefix,
            )  # fmt: skip
        if single is not None:
            outputs = [x[:, None] for x in single]  # one hypothesis per sentence
        ids, _, scores, attention = blank_empty_sources(source_ids, PAD_ID, *outputs)
        return ids, scores, attention

    def translate(self, sentences, progress=None, target_prefix=None):
        """The `n_best` hypotheses (best first) of each sentence, in input order; with
        `target_prefix` (a text per sentence, "" for none), each starts with its text."""
        if not sentences:
            return []
        source_ids = self.source_tokenizer.tokenize(tf.constant(sentences))
        source_ids = source_ids[:, : self.options.max_source_length]  # as the exports do
        if target_prefix is not None:
            prefix_ids = self.target_tokenizer.tokenize(tf.constant(list(target_prefix)))
        results = [None] * len(sentences)
        for indices in length_sorted_batches(source_ids.row_lengths().numpy(), self.batch_size):
            batch = tf.gather(source_ids, indices)
            # Empty sentences alone still need one (padding) column to encode.
            width = max(1, int(batch.bounding_shape(1)))
            padded = batch.to_tensor(PAD_ID, shape=[len(indices), width])
            if target_prefix is None:
                outputs = self._search(padded)
            else:
                prefix = tf.gather(prefix_ids, indices).to_tensor(PAD_ID)
                outputs = self._search_with_prefix(padded, prefix)
            ids, scores, attention = (t.numpy() for t in outputs)
            for row, index in enumerate(indices):
                source = batch[row].numpy().tolist()
                results[index] = [
                    self._hypothesis(source, ids[row, n], scores[row, n], attention[row, n])
                    for n in range(ids.shape[1])
                ]
            if progress is not None:
                progress(len(indices))
        return results

    def translate_best(self, sentences, progress=None):
        """The best translation of each sentence, as text."""
        return [hypotheses[0].text for hypotheses in self.translate(sentences, progress)]

    def _hypothesis(self, source, ids, score, attention):
        ids = [token for token in ids.tolist() if token != PAD_ID]
        length = ids.index(EOS_ID) + 1 if EOS_ID in ids else len(ids)
        ids = ids[:length]
        attention = attention[:length, : len(source)]
        source_pieces = [self.source_tokenizer.processor.id_to_piece(i) for i in source]
        target_pieces = [self.target_tokenizer.processor.id_to_piece(i) for i in ids]
        if self.options.replace_unknown:
            target_pieces = replace_unknown(ids, target_pieces, source_pieces, attention)
        words = [p for p, token in zip(target_pieces, ids) if token != EOS_ID]
        text = self.target_tokenizer.processor.decode_pieces(words)
        return Hypothesis(text, float(score), target_pieces, source_pieces, attention)
