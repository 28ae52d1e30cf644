"""Translating lists of sentences: tokenise, batch by length, search, detokenise, restore order."""

import numpy as np
import tensorflow as tf

from pipeline.search import greedy_search, max_decode_length


class Translator:
    """Translates sentences with a trained model and its tokenizers.

    Sentences are sorted by length and decoded in batches of `batch_size` so that little
    work goes to padding; the output keeps the input order. A translation never depends on
    the other sentences of its batch (padding is masked throughout).
    """

    def __init__(self, model, source_tokenizer, target_tokenizer, decode_config):
        self.model = model
        self.source_tokenizer = source_tokenizer
        self.target_tokenizer = target_tokenizer
        self.batch_size = decode_config["batch_size"]
        self.length_limits = (
            decode_config["max_length_ratio"],
            decode_config["max_length_offset"],
            decode_config["max_length_cap"],
        )
        self._search = tf.function(
            self._search_batch,
            input_signature=[tf.TensorSpec([None, None], tf.int32)],
            reduce_retracing=True,
        )

    def _search_batch(self, source_ids):
        lengths = tf.reduce_sum(tf.cast(source_ids != self.model.pad_id, tf.int32), axis=1)
        max_length = max_decode_length(lengths, *self.length_limits)
        ids, _, _, _ = greedy_search(self.model, source_ids, max_length)
        return ids

    def translate(self, sentences, progress=None):
        """Translations of `sentences` (a list of strings), in order."""
        if not sentences:
            return []
        source_ids = self.source_tokenizer.tokenize(tf.constant(sentences))
        order = np.argsort(source_ids.row_lengths().numpy(), kind="stable")
        translations = [None] * len(sentences)
        for start in range(0, len(order), self.batch_size):
            indices = order[start : start + self.batch_size]
            batch = tf.gather(source_ids, indices).to_tensor(self.model.pad_id)
            output_ids = self._search(batch)
            texts = self.target_tokenizer.detokenize(output_ids).numpy()
            for index, text in zip(indices, texts):
                translations[index] = text.decode("utf-8")
            if progress is not None:
                progress(len(indices))
        return translations
