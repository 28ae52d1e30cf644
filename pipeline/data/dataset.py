"""Parallel corpora to `tf.data`: the training corpora as a stream, small splits in memory.

Training pairs are streamed: files are read line by line (the order of a corpus' shard files
reshuffled every pass), tokenised in a parallel map, filtered, mixed by corpus weight,
shuffled in a bounded buffer and batched by length. Nothing of the corpus' size is held in
memory, and the stream never ends: `fit` runs epochs of a fixed number of steps. Validation
and test splits are tokenised once and kept in memory.
"""

import dataclasses
import math

import numpy as np
import tensorflow as tf

from pipeline.core import micro_batches
from pipeline.core.errors import UserError
from pipeline.data.tokenizer import BOS_ID, EOS_ID

TOKENIZE_CHUNK = 8192  # sentences tokenised at once in memory
STREAM_TOKENIZE_BATCH = 256  # lines tokenised at once on the stream
ESTIMATE_SAMPLE = 10_000  # sampled sentences that estimate the batches in a pass
COUNTS = ("read", "empty", "over-long", "bad")  # per corpus, of the lines a stream read


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


def _kept(source_lengths, target_lengths, data_config):
    """(empty, over-long) masks: a target is over-long when it needs more than
    `max_target_length` positions with its </s>."""
    empty = (source_lengths == 0) | (target_lengths == 0)
    too_long = ~empty & (
        (source_lengths > data_config["max_source_length"])
        | (target_lengths + 1 > data_config["max_target_length"])
    )
    return empty, too_long


def encode_corpus(corpus, source_tokenizer, target_tokenizer, data_config, name, log=print):
    """Tokenises an in-memory `corpus` and drops empty and over-long pairs, reporting how many."""
    source_ids = _tokenize_all(source_tokenizer, corpus.sources)
    target_ids = _tokenize_all(target_tokenizer, corpus.targets)
    source_lengths = source_ids.row_lengths().numpy()
    target_lengths = target_ids.row_lengths().numpy()
    empty, too_long = _kept(source_lengths, target_lengths, data_config)
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


def _bucket_batch_sizes(batch_size, batch_tokens, bucket_width, max_length):
    """Pairs per batch in each length bucket: `batch_size`, or as many as fit `batch_tokens`
    at the bucket's longest length."""
    boundaries = bucket_boundaries(max_length, bucket_width)
    if not batch_tokens:
        return boundaries, [batch_size] * (len(boundaries) + 1)
    uppers = [b - 1 for b in boundaries] + [max_length]
    return boundaries, [max(1, batch_tokens // upper) for upper in uppers]


def batching_options(config):
    """`batch_by_length`'s options (batch sizes per replica) from a configuration."""
    data, train = config["data"], config["train"]
    return dict(
        batch_size=train["batch_size"],
        batch_tokens=train["batch_tokens"],
        bucket_width=train["bucket_width"],
        max_length=max(data["max_source_length"], data["max_target_length"]),
    )


def batch_by_length(examples, batch_size, batch_tokens=None, bucket_width=5, max_length=100):
    """`({"source_ids", "target_input_ids"}, target_output_ids)` examples -> padded batches
    of examples of similar length (little padding wasted).

    Batches hold `batch_size` pairs, or with `batch_tokens` as many pairs as fit that many
    tokens at the bucket's longest length.
    """
    boundaries, sizes = _bucket_batch_sizes(batch_size, batch_tokens, bucket_width, max_length)
    return examples.bucket_by_sequence_length(
        _example_length, boundaries, sizes, drop_remainder=False
    )


def make_dataset(encoded, batch_size, batch_tokens=None, bucket_width=5, max_length=100):
    """The batches of an in-memory `EncodedCorpus` (validation, evaluation), in corpus order
    within each length bucket."""
    pairs = tf.data.Dataset.from_tensor_slices((encoded.source_ids, encoded.target_ids))
    examples = pairs.map(_to_model_inputs, num_parallel_calls=tf.data.AUTOTUNE).cache()
    batches = batch_by_length(examples, batch_size, batch_tokens, bucket_width, max_length)
    return batches.prefetch(tf.data.AUTOTUNE)


def count_batches(dataset):
    """Batches in one pass over a finite dataset."""
    return int(dataset.reduce(0, lambda count, _: count + 1))


def with_known_length(dataset):
    """The same finite dataset with its number of batches declared, so that Keras shows
    progress against it and ends each pass cleanly instead of warning that data ran out."""
    return dataset.apply(tf.data.experimental.assert_cardinality(count_batches(dataset)))


# The training stream.


class StreamCounters:
    """What one input pipeline's stream has read from each corpus: lines read and dropped
    (`COUNTS`), in variables its map updates, and where in each corpus' endless stream it
    started. A corpus' position counts lines from the start of its first pass."""

    def __init__(self, corpora, start):
        self.corpora = corpora
        self.start = list(start)
        self.strides = [1] * len(corpora)  # lines of the stream per line read (line sharding)
        self.counts = [
            tf.Variable(tf.zeros(len(COUNTS), tf.int64), trainable=False) for _ in corpora
        ]

    def read(self):
        """`[corpora, len(COUNTS)]` int64: what the stream has read so far."""
        return np.stack([counts.numpy() for counts in self.counts])

    def positions(self):
        read = self.read()[:, 0]
        return [s + int(r) * k for s, r, k in zip(self.start, read, self.strides)]

    def summary(self):
        """One line per corpus: pairs read and passes made, pairs kept and dropped."""
        lines = []
        for corpus, counts, stride in zip(self.corpora, self.read(), self.strides):
            read, empty, too_long, bad = (int(c) for c in counts)
            passes = read * stride / corpus.lines
            lines.append(
                f"train stream: {corpus.name}: read {read:,} pairs ({passes:.2f} passes), kept "
                f"{read - empty - too_long - bad:,}, dropped {empty:,} empty, {too_long:,} "
                f"over-long" + (f", {bad:,} bad" if bad else "")
            )
        return lines


def _pass_order(shard_count, seed, data_pass):
    """The order of a corpus' shard files in pass `data_pass`: the same in eager and graph."""
    return tf.random.experimental.stateless_shuffle(
        tf.range(shard_count, dtype=tf.int64), seed=tf.stack([tf.cast(seed, tf.int64), data_pass])
    )


def _shard_lines(sources, targets):
    """A function from a shard's index to its `(source line, target line)` dataset; a TSV's
    lines come as `(line, "")`."""

    def read(path):
        compression = tf.where(tf.strings.regex_full_match(path, r".*\.gz"), "GZIP", "")
        return tf.data.TextLineDataset(path, compression_type=compression)

    def lines(index):
        source = read(tf.gather(sources, index))
        if targets is None:
            return source.map(lambda line: (line, tf.constant("")))
        return tf.data.Dataset.zip(source, read(tf.gather(targets, index)))

    return lines


def _corpus_lines(shards, start, seed):
    """The endless line stream of `shards`, every pass in a new file order, from line `start`
    of its first pass (whole files skipped unread)."""
    sources = tf.constant([shard.source for shard in shards])
    targets = None if shards[0].target is None else tf.constant([s.target for s in shards])
    shard_lines = _shard_lines(sources, targets)
    data_pass, offset = divmod(start, sum(shard.lines for shard in shards))
    order = _pass_order(len(shards), seed, data_pass).numpy()
    lengths = np.array([shards[index].lines for index in order])
    position = int(np.searchsorted(np.cumsum(lengths), offset, side="right"))  # the file
    offset -= int(lengths[:position].sum())
    index = order[position]
    first_pass = shard_lines(index).skip(offset)
    if position + 1 < len(order):
        rest = tf.data.Dataset.from_tensor_slices(order[position + 1 :])
        first_pass = first_pass.concatenate(rest.flat_map(shard_lines))

    def whole_pass(number):
        return tf.data.Dataset.from_tensor_slices(_pass_order(len(shards), seed, number)).flat_map(
            shard_lines
        )

    later = tf.data.Dataset.range(data_pass + 1, np.iinfo(np.int64).max).flat_map(whole_pass)
    return first_pass.concatenate(later)


def _is_utf8(lines):
    return tf.equal(tf.strings.unicode_transcode(lines, "UTF-8", "UTF-8", errors="replace"), lines)


def _prefixed(lines, prefix):
    """`prefix` before each of `lines` (a string tensor), but a blank line stays blank, to be
    dropped as empty."""
    if not prefix:
        return lines
    return tf.where(tf.equal(tf.strings.strip(lines), ""), lines, prefix + lines)


def _encoder(source_tokenizer, target_tokenizer, data_config, counts, tsv, source_prefix="",
             target_prefix=""):  # fmt: skip
    """The map from a batch of lines to the training examples of the pairs it keeps, as
    ragged `({"source_ids", "target_input_ids"}, target_output_ids)`, counting what it reads
    and drops into `counts`; `source_prefix` and `target_prefix` go before each side's lines
    (`TrainingCorpus`'). Bad lines (already counted by the corpus scan) are dropped only
    where `data.skip_bad_lines` lets the scan pass them. Working on whole batches keeps the
    per-pair work of the stream to unbatching, shuffling and bucketing."""
    check = data_config["skip_bad_lines"]

    def encode(source_lines, target_lines):
        valid = tf.ones_like(source_lines, tf.bool)
        if tsv:
            line = source_lines
            valid = tf.strings.regex_full_match(line, "[^\t]*\t.*")
            source_lines = tf.strings.regex_replace(line, "\t.*", "")
            target_lines = tf.strings.regex_replace(
                tf.strings.regex_replace(line, "^[^\t]*\t", ""), "\t.*", ""
            )
        if check:
            valid &= _is_utf8(source_lines) & _is_utf8(target_lines)
        source_lines = _prefixed(source_lines, source_prefix)
        target_lines = _prefixed(target_lines, target_prefix)
        source = source_tokenizer.tokenize(tf.where(valid, source_lines, ""))
        target = target_tokenizer.tokenize(tf.where(valid, target_lines, ""))
        empty, too_long = _kept(source.row_lengths(), target.row_lengths(), data_config)
        empty &= valid
        dropped = [empty, too_long, ~valid]
        counts.assign_add(
            tf.stack(
                [tf.size(valid, tf.int64)]
                + [tf.reduce_sum(tf.cast(mask, tf.int64)) for mask in dropped]
            )
        )
        keep = valid & ~empty & ~too_long
        source, target = tf.ragged.boolean_mask(source, keep), tf.ragged.boolean_mask(target, keep)
        column = tf.ones_like(target[:, :1])  # one position per kept pair
        inputs = {"source_ids": source, "target_input_ids": tf.concat([column * BOS_ID, target], 1)}
        return inputs, tf.concat([target, column * EOS_ID], 1)

    return encode


def _as_dense(inputs, labels):
    """Identity on the values: rows of a ragged batch come here as dense tensors, and leave
    with dense specs, which `padded_batch` needs."""
    return inputs, labels


def stream_training_examples(
    corpora, source_tokenizer, target_tokenizer, data_config, counters, seed, input_context=None
):
    """The endless, mixed stream of training examples (`_to_model_inputs`), not yet shuffled.

    Each corpus starts at `counters.start`. With several input pipelines (an
    `InputContext`), a corpus with at least as many shard files as pipelines is split by file
    (each pipeline reads only its own files); one with fewer files is read whole by every
    pipeline, each keeping every n-th line. Returns the dataset and, per corpus, how it was
    split (for the log).
    """
    pipelines, pipeline = 1, 0
    if input_context is not None:
        pipelines, pipeline = input_context.num_input_pipelines, input_context.input_pipeline_id
    streams, sharding = [], []
    for number, corpus in enumerate(corpora):
        shards = corpus.shards
        if pipelines > 1 and len(shards) >= pipelines:
            shards = shards[pipeline::pipelines]
            sharding.append(f"{len(shards)} of its {len(corpus.shards)} files")
        elif pipelines > 1:
            counters.strides[number] = pipelines
            sharding.append(f"1 line in {pipelines} (fewer files than input pipelines)")
        lines = _corpus_lines(shards, counters.start[number], seed)
        if counters.strides[number] > 1:
            lines = lines.shard(pipelines, pipeline)
        encode = _encoder(
            source_tokenizer, target_tokenizer, data_config, counters.counts[number],
            corpus.is_tsv, corpus.source_prefix, corpus.target_prefix,
        )  # fmt: skip
        examples = (
            lines.batch(STREAM_TOKENIZE_BATCH)
            .map(encode, num_parallel_calls=tf.data.AUTOTUNE)
            .unbatch()
            .map(_as_dense)  # unbatched rows of ragged tensors come as rank-1 ragged specs
        )
        streams.append(examples)
    if len(streams) == 1:
        return streams[0], sharding
    weights = [corpus.weight for corpus in corpora]
    mixed = tf.data.Dataset.sample_from_datasets(
        streams, weights=[w / sum(weights) for w in weights], seed=seed
    )
    return mixed, sharding


def make_training_stream(
    corpora, source_tokenizer, target_tokenizer, data_config, batching, counters,
    shuffle_buffer, seed, input_context=None, micro_batches_per_update=1,
):  # fmt: skip
    """Endless shuffled training batches (`batch_by_length`'s `batching` options, per
    replica), grouped by `micro_batches_per_update` (`pipeline.core.micro_batches`) when above
    1, and how each corpus is sharded across input pipelines."""
    examples, sharding = stream_training_examples(
        corpora, source_tokenizer, target_tokenizer, data_config, counters, seed, input_context
    )
    # A buffer larger than the corpus would only mix passes: the corpus' size shuffles fully.
    lines = sum(corpus.lines for corpus in corpora)
    examples = examples.shuffle(min(shuffle_buffer, lines), seed=seed)
    batches = batch_by_length(examples, **batching)
    if micro_batches_per_update > 1:
        batches = micro_batches.group(batches, micro_batches_per_update)
    return batches.prefetch(tf.data.AUTOTUNE), sharding


def estimate_steps_per_pass(corpora, source_sample, target_sample, tokenizers, data_config,
                            batching, batches_per_step):  # fmt: skip
    """Steps in one pass over the training corpora, estimated from sampled sentences: the
    pairs kept and the batches their lengths need, so progress bars mean what they say. A
    step takes `batches_per_step` batches (replicas x micro-batches of an update).

    Training data with no usable pair in the sample is a `UserError`: the endless stream
    would otherwise search it for ever.
    """
    count = len(source_sample)  # the samples are aligned pairs
    rng = np.random.default_rng(0)
    chosen = rng.choice(count, size=min(count, ESTIMATE_SAMPLE), replace=False)
    lengths = [
        tokenizer.tokenize(tf.constant([sample[i] for i in chosen])).row_lengths().numpy()
        for tokenizer, sample in zip(tokenizers, (source_sample, target_sample))
    ]
    empty, too_long = _kept(*lengths, data_config)
    kept = ~empty & ~too_long
    if not kept.any():
        raise UserError(
            f"none of {len(chosen):,} sampled training pairs is usable: each is empty or longer "
            f"than data.max_source_length ({data_config['max_source_length']}) or "
            f"data.max_target_length ({data_config['max_target_length']}, </s> included)"
        )
    boundaries, sizes = _bucket_batch_sizes(**batching)
    example_lengths = np.maximum(lengths[0], lengths[1] + 1)[kept]
    batch_sizes = np.asarray(sizes)[np.searchsorted(boundaries, example_lengths, side="right")]
    batches_per_line = float(np.sum(1.0 / batch_sizes)) / len(chosen)
    lines = sum(corpus.lines - corpus.bad_lines for corpus in corpora)
    return max(1, math.ceil(lines * batches_per_line / batches_per_step))
