"""Translating lists of sentences: tokenise, batch by length, search, detokenise, restore order."""

import dataclasses

import numpy as np
import tensorflow as tf

from pipeline.core import multilingual
from pipeline.core.graph_function import graph_function
from pipeline.core.translation_text import translation_text
from pipeline.data.length_batches import length_sorted_batches
from pipeline.data.tokenizer import EOS_ID, PAD_ID, UNK_ID
from pipeline.decoding.search import search
from pipeline.decoding.search_options import SearchOptions

__all__ = ["Hypothesis", "SearchOptions", "Translator", "replace_unknown"]


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

    def __init__(self, model, source_tokenizer, target_tokenizer, options, batch_size=64,
                 languages=None, strip_translation_spaces=False):  # fmt: skip
        self.model = model
        self.source_tokenizer = source_tokenizer
        self.target_tokenizer = target_tokenizer
        self.options = options
        self.batch_size = batch_size
        # How requests name their languages (`multilingual.RequestLanguages`).
        self.languages = languages or multilingual.RequestLanguages.of({})
        self.strip_translation_spaces = strip_translation_spaces
        self._searches = {}  # SearchOptions -> its traced searches, without and with a prefix

    @classmethod
    def from_trained(cls, trained, batch_size=None, **options):
        """A translator of `pipeline.workdir.load_trained`'s (config, model, source tokenizer,
        target tokenizer), searching with the config's decode section overridden by
        `options` (any search option), `batch_size` sentences at a time (default:
        decode.batch_size)."""
        config, model, source_tokenizer, target_tokenizer = trained
        search = SearchOptions.from_config(config["decode"], **options)
        batch_size = batch_size or config["decode"]["batch_size"]
        languages = multilingual.RequestLanguages.of(multilingual.model_languages(config["data"]))
        return cls(model, source_tokenizer, target_tokenizer, search, batch_size, languages,
                   config["data"]["strip_translation_spaces"])  # fmt: skip

    def _searchers(self, options):
        if options not in self._searches:

            def search_batch(source_ids, target_prefix=None):
                ids, _, scores, attention = search(self.model, source_ids, options, target_prefix)
                return ids, scores, attention

            ids = tf.TensorSpec([None, None], tf.int32)
            self._searches[options] = (
                graph_function(search_batch, input_signature=[ids]),
                graph_function(search_batch, input_signature=[ids, ids]),
            )
        return self._searches[options]

    def hypotheses(self, sentences, target_prefix=None, progress=None, **options):
        """The `n_best` `Hypothesis`es (best first) of each sentence, in input order; with
        `target_prefix` (a text per sentence, "" for none), each starts with its text.
        `options`: any `SearchOptions` field, for this call (None: the translator's)."""
        if not sentences:
            return []
        options = self.options.with_overrides(**options)
        without_prefix, with_prefix = self._searchers(options)
        source_ids = self.source_tokenizer.tokenize(tf.constant(sentences))
        source_ids = source_ids[:, : options.max_source_length]  # as the exports do
        if target_prefix is not None:
            prefix_ids = self.target_tokenizer.tokenize(tf.constant(list(target_prefix)))
        results = [None] * len(sentences)
        for indices in length_sorted_batches(source_ids.row_lengths().numpy(), self.batch_size):
            batch = tf.gather(source_ids, indices)
            # Empty sentences alone still need one (padding) column to encode.
            width = max(1, int(batch.bounding_shape(1)))
            padded = batch.to_tensor(PAD_ID, shape=[len(indices), width])
            if target_prefix is None:
                outputs = without_prefix(padded)
            else:
                outputs = with_prefix(padded, tf.gather(prefix_ids, indices).to_tensor(PAD_ID))
            ids, scores, attention = (t.numpy() for t in outputs)
            for row, index in enumerate(indices):
                source = batch[row].numpy().tolist()
                results[index] = [
                    self._hypothesis(
                        source, ids[row, n], scores[row, n], attention[row, n], options
                    )
                    for n in range(ids.shape[1])
                ]
            if progress is not None:
                progress(len(indices))
        return results

    def translate(self, sentences, target_prefix=None, progress=None, target_language=None,
                  source_language=None, **options):  # fmt: skip
        """The best translation of each sentence, as text ("" for an empty sentence).
        `target_language`: a multilingual model's language to translate into, one code or
        one a sentence; `source_language` likewise, for a model that takes it (`ValueError`
        when missing or unknown)."""
        return [
            hypotheses[0].text
            for hypotheses in self.hypotheses(
                self.requests(sentences, target_language, source_language),
                self.target_prefixes(sentences, target_language, target_prefix),
                progress,
                **options,
            )  # fmt: skip
        ]

    def translate_n_best(self, sentences, n_best, target_prefix=None, progress=None,
                         target_language=None, source_language=None, **options):  # fmt: skip
        """The `n_best` (text, score) pairs of each sentence, best first."""
        return [
            [(hypothesis.text, hypothesis.score) for hypothesis in hypotheses]
            for hypotheses in self.hypotheses(
                self.requests(sentences, target_language, source_language),
                self.target_prefixes(sentences, target_language, target_prefix),
                progress,
                n_best=n_best,
                **options,
            )  # fmt: skip
        ]

    def requests(self, *args, **kwargs):
        """`multilingual.RequestLanguages.requests` of this model."""
        return self.languages.requests(*args, **kwargs)

    def target_prefixes(self, *args, **kwargs):
        """`multilingual.RequestLanguages.target_prefixes` of this model."""
        return self.languages.target_prefixes(*args, **kwargs)

    def _hypothesis(self, source, ids, score, attention, options):
        ids = [token for token in ids.tolist() if token != PAD_ID]
        length = ids.index(EOS_ID) + 1 if EOS_ID in ids else len(ids)
        ids = ids[:length]
        attention = attention[:length, : len(source)]
        source_pieces = [self.source_tokenizer.processor.id_to_piece(i) for i in source]
        # A multilingual source's tag is the request, not the sentence: alignments, plots and
        # <unk> replacement see the sentence's pieces only.
        tag = multilingual.leading_tag_pieces(source_pieces, self.languages.source_side_tags)
        source_pieces, attention = source_pieces[tag:], attention[:, tag:]
        target_pieces = [self.target_tokenizer.processor.id_to_piece(i) for i in ids]
        if options.replace_unknown:
            target_pieces = replace_unknown(ids, target_pieces, source_pieces, attention)
        words = [p for p, token in zip(target_pieces, ids) if token != EOS_ID]
        text = translation_text(self.target_tokenizer.processor.decode_pieces(words),
                                self.strip_translation_spaces)  # fmt: skip
        return Hypothesis(text, float(score), target_pieces, source_pieces, attention)
