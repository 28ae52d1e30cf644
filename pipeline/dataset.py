"""Parallel corpora to `tf.data`: tokenised once, filtered, bucketed by length, shuffled."""

import dataclasses

import numpy as np
import tensorflow as tf

from pipeline.tokenizer import BOS_ID, EOS_ID

TOKENIZE_CHUNK = 8192


@dataclasses.dataclass
class EncodedCorpus:
    """Token ids of the pairs kept from a corpus, and the indices of those pairs in it."""

    source_ids: tf.RaggedTensor
    target_ids: tf.RaggedTensor
    kept: np.ndarray
    target_tokens: int

    def __len__(self):
        return len(self.kept)


def _tokenize_all(tokenizer, lines):
    chunks = [
        tokenizer.tokenize(tf.constant(lines[i : i + TOKENIZE_CHUNK]))
        for i in range(0, len(lines), TOKENIZE_CHUNK)
    ]
    return tf.concat(chunks, axis=0)


def encode_corpus(corpus, source_tokenizer, target_tokenizer, data_config, name, log=print):
    """Tokenises `corpus` and drops empty and over-long pairs, reporting how many.

    A target is over-long when it needs more than `max_target_length` positions with its </s>.
    """
    source_ids = _tokenize_all(source_tokenizer, corpus.sources)
    target_ids = _tokenize_all(target_tokenizer, corpus.targets)
    source_lengths = source_ids.row_lengths().numpy()
    target_lengths = target_ids.row_lengths().numpy()
    empty = (source_lengths == 0) | (target_lengths == 0)
    too_long = ~empty & (
        (source_lengths > data_config["max_source_length"])
        | (target_lengths + 1 > data_config["max_target_length"])
    )
    kept = np.flatnonzero(~empty & ~too_long)
    log(
        f"{name}: {len(corpus)} pairs from {corpus.origin}; kept {len(kept)}, dropped "
        f"{int(empty.sum())} empty and {int(too_long.sum())} over-long (> "
        f"{data_config['max_source_length']} source / {data_config['max_target_length']} "
        "target tokens)"
    )
    return EncodedCorpus(
        source_ids=tf.gather(source_ids, kept),
        target_ids=tf.gather(target_ids, kept),
        kept=kept,
        target_tokens=int(target_lengths[kept].sum() + len(kept)),
    )


def _to_model_inputs(source, target):
    bos, eos = tf.constant([BOS_ID], tf.int32), tf.constant([EOS_ID], tf.int32)
    inputs = {"source_ids": source, "target_input_ids": tf.concat([bos, target], 0)}
    return inputs, tf.concat([target, eos], 0)


def _example_length(inputs, labels):
    return tf.maximum(tf.shape(inputs["source_ids"])[0], tf.shape(labels)[0])


def bucket_boundaries(max_length, width):
    """Upper bounds (exclusive) of the length buckets: width+1, 2*width+1, ..."""
    return list(range(width + 1, max_length + 1, width))


def make_dataset(
    encoded,
    batch_size,
    batch_tokens=None,
    bucket_width=5,
    max_length=100,
    shuffle_buffer=None,
    seed=None,
    input_context=None,
):
    """A dataset of `({"source_ids", "target_input_ids"}, target_output_ids)` padded batches.

    Pairs are grouped in buckets of similar length so that batches waste little padding.
    Batches hold `batch_size` pairs, or with `batch_tokens` as many pairs as fit that many
    tokens at the bucket's longest length. With `shuffle_buffer` the pairs are reshuffled every
    epoch from `seed`. `batch_size` and `batch_tokens` are per replica: with a
    `tf.distribute.InputContext`, each input pipeline reads its own shard of the pairs.
    """
    dataset = tf.data.Dataset.from_tensor_slices((encoded.source_ids, encoded.target_ids))
    if input_context is not None:
        dataset = dataset.shard(input_context.num_input_pipelines, input_context.input_pipeline_id)
    dataset = dataset.map(_to_model_inputs, num_parallel_calls=tf.data.AUTOTUNE).cache()
    if shuffle_buffer:
        dataset = dataset.shuffle(shuffle_buffer, seed=seed, reshuffle_each_iteration=True)
    boundaries = bucket_boundaries(max_length, bucket_width)
    if batch_tokens:
        uppers = [b - 1 for b in boundaries] + [max_length]
        sizes = [max(1, batch_tokens // upper) for upper in uppers]
    else:
        sizes = [batch_size] * (len(boundaries) + 1)
    dataset = dataset.bucket_by_sequence_length(
        _example_length, boundaries, sizes, drop_remainder=False
    )
    return dataset.prefetch(tf.data.AUTOTUNE)


def count_batches(dataset):
    """Batches in one pass over a finite dataset. Shuffling does not change the count: each
    pair's length bucket is fixed."""
    return int(dataset.reduce(0, lambda count, _: count + 1))


def with_known_length(dataset):
    """The same finite dataset with its number of batches declared, so that Keras shows
    progress against it and ends each pass cleanly instead of warning that data ran out."""
    return dataset.apply(tf.data.experimental.assert_cardinality(count_batches(dataset)))
