"""The model's log-probability of given translations (forced decoding), for scoring and
filtering corpora and for forced alignment."""

import dataclasses

import numpy as np
import tensorflow as tf

from pipeline.core.graph_function import graph_function
from pipeline.data.length_batches import length_sorted_batches
from pipeline.data.tokenizer import BOS_ID, EOS_ID, PAD_ID


@dataclasses.dataclass
class PairScore:
    """One pair's score: `log_prob` is the natural-log probability of the whole target,
    </s> included, over `tokens` target tokens; `attention` is `[tokens, source tokens]`."""

    log_prob: float
    tokens: int
    attention: np.ndarray

    @property
    def per_token(self):
        return self.log_prob / self.tokens


class Scorer:
    """Scores (source, target) pairs with a trained model, teacher-forced, in batches.

    Pairs are sorted by length within each call and batched by `batch_size`; results keep the
    input order, and a pair's score never depends on its batch-mates (padding is masked).
    Sources are cut at `max_source_length` pieces, as translation and the exports do; targets
    are scored whole.
    """

    def __init__(self, model, source_tokenizer, target_tokenizer, batch_size=64,
                 max_source_length=None):  # fmt: skip
        self.model = model
        self.source_tokenizer = source_tokenizer
        self.target_tokenizer = target_tokenizer
        self.batch_size = batch_size
        self.max_source_length = max_source_length
        ids = tf.TensorSpec([None, None], tf.int32)
        self._score = graph_function(
            self._score_batch, input_signature=[ids, ids, ids], reduce_retracing=True
        )

    def _score_batch(self, source_ids, target_input_ids, target_output_ids):
        """Each target token's log-probability `[batch, tgt_len]` (0 at padding) and the
        attention `[batch, tgt_len, src_len]`."""
        logits, attention = self.model.forward(
            {"source_ids": source_ids, "target_input_ids": target_input_ids}, training=False
        )
        log_probs = tf.nn.log_softmax(tf.cast(logits, tf.float32), axis=-1)
        token_log_probs = tf.gather(log_probs, target_output_ids, batch_dims=2)
        real = tf.not_equal(target_output_ids, PAD_ID)
        return tf.where(real, token_log_probs, 0.0), attention

    def score(self, sources, targets):
        """A `PairScore` for each (source, target) pair, in input order."""
        if not sources:
            return []
        source_ids = self.source_tokenizer.tokenize(tf.constant(sources))
        if self.max_source_length:
            source_ids = source_ids[:, : self.max_source_length]
        source_ids = source_ids.to_list()
        target_ids = self.target_tokenizer.tokenize(tf.constant(targets)).to_list()
        results = [None] * len(sources)
        for indices in length_sorted_batches([len(t) for t in target_ids], self.batch_size):
            sources_in = [source_ids[i] for i in indices]
            targets_in = [[BOS_ID, *target_ids[i]] for i in indices]
            targets_out = [[*target_ids[i], EOS_ID] for i in indices]
            token_log_probs, attention = (
                t.numpy()
                for t in self._score(padded(sources_in), padded(targets_in), padded(targets_out))
            )
            for row, index in enumerate(indices):
                tokens = len(targets_out[row])
                results[index] = PairScore(
                    float(token_log_probs[row].sum(dtype=np.float64)),
                    tokens,
                    attention[row, :tokens, : len(sources_in[row])],
                )
        return results


def padded(rows):
    """int32 `[len(rows), longest row]` (at least one column), right-padded with PAD_ID."""
    array = np.full((len(rows), max(1, *map(len, rows))), PAD_ID, dtype=np.int32)
    for r, row in enumerate(rows):
        array[r, : len(row)] = row
    return array
