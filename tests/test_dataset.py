"""tf.data: in-memory splits (filtering, shifted targets, bucketing) and the training stream
(shards over input pipelines, weighted mixing, resuming at a position, bad lines, bounded
memory)."""

import gzip

import numpy as np
import pytest
import tensorflow as tf

from pipeline.core.errors import UserError
from pipeline.data.corpus import ParallelCorpus, scan_training_corpora
from pipeline.data.dataset import (
    StreamCounters,
    bucket_boundaries,
    encode_corpus,
    estimate_steps_per_pass,
    make_dataset,
    make_training_stream,
    stream_training_examples,
    with_known_length,
)
from pipeline.data.tokenizer import (
    BOS_ID,
    EOS_ID,
    Tokenizer,
    prepare_tokenizers,
    train_sentencepiece,
    training_tokenizers,
    vocabularies_to_build,
)

WORDS = (
    "der die das ein eine hund katze mann frau kind läuft springt sitzt im park auf dem gras"
).split()
DIGITS = "null eins zwei drei vier fünf sechs sieben acht neun".split()


@pytest.fixture(scope="module")
def vocabulary(tmp_path_factory):
    rng = np.random.default_rng(0)
    sentences = [" ".join(rng.choice(WORDS + DIGITS, size=rng.integers(2, 12))) for _ in range(800)]
    path = tmp_path_factory.mktemp("vocab") / "sp.model"
    train_sentencepiece(sentences, 80, "unigram", path)
    return path


@pytest.fixture
def tokenizer(vocabulary):
    # Per test: reseeding TensorFlow (conftest) clears the kernel cache holding its resource.
    return Tokenizer(vocabulary)


@pytest.fixture
def corpus():
    rng = np.random.default_rng(1)
    sources = [" ".join(rng.choice(WORDS, size=rng.integers(1, 15))) for _ in range(300)]
    targets = [" ".join(rng.choice(WORDS, size=rng.integers(1, 15))) for _ in range(300)]
    sources[5], targets[7] = "", "   "
    sources[9] = " ".join(["katze"] * 200)
    return ParallelCorpus(sources, targets, "memory")


DATA = {"max_source_length": 60, "max_target_length": 60, "skip_bad_lines": False}


def sentences(count, seed=2):
    rng = np.random.default_rng(seed)
    return [" ".join(rng.choice(WORDS, size=rng.integers(3, 10))) for _ in range(count)]


@pytest.mark.parametrize("model_type", ["unigram", "bpe"])
def test_subword_sampling_varies_the_pieces_not_the_text(tmp_path, model_type):
    path = tmp_path / "sp.model"
    train_sentencepiece(sentences(800, seed=0), 80, model_type, path)
    tokenizer = Tokenizer(path)
    lines = tf.constant(sentences(200))
    best = tokenizer.tokenize(lines).to_list()
    sampler = tokenizer.sampling(0.1, -1)  # 81% (unigram), 88% (BPE) cut anew; sd 0.02
    draws = [sampler.tokenize(lines).to_list() for _ in range(2)]
    assert tokenizer.tokenize(lines).to_list() == best  # the tokenizer itself still decides
    for draw in draws:
        # Every draw spells the same text; most sentences are cut differently.
        np.testing.assert_array_equal(
            sampler.detokenize(tf.ragged.constant(draw)).numpy(), lines.numpy()
        )
        assert np.mean([a != b for a, b in zip(draw, best)]) > 0.5
    assert draws[0] != draws[1]  # anew at every call, that is every pass


def test_unigram_sampling_draws_among_the_n_best(vocabulary):
    tokenizer = Tokenizer(vocabulary)
    lines = sentences(100)
    nbest = [tokenizer.processor.nbest_encode_as_ids(line, 3) for line in lines]
    draws = tokenizer.sampling(0.0, 3).tokenize(tf.constant(lines)).to_list()  # 0.0: uniform
    assert all(draw in candidates for draw, candidates in zip(draws, nbest))
    assert sum(draw != candidates[0] for draw, candidates in zip(draws, nbest)) > 30


def test_sampled_training_segmentation_and_its_longer_epochs(tmp_path, vocabulary):
    tokenizers = (Tokenizer(vocabulary), Tokenizer(vocabulary))
    data = {**shard_config(tmp_path, [300]), "subword_sampling_alpha": None}
    assert training_tokenizers(tokenizers, data) is tokenizers  # off by default
    sampling = {**data, "subword_sampling_alpha": 0.1, "subword_sampling_nbest": -1}
    samplers = training_tokenizers(tokenizers, sampling)
    corpora, sources, targets = scan_training_corpora(data, 300, log=lambda _: None)
    batching = {"batch_size": 8, "batch_tokens": 64, "bucket_width": 2, "max_length": 60}
    plain, sampled = (
        estimate_steps_per_pass(corpora, sources, targets, pair, data, batching, 1)
        for pair in (tokenizers, samplers)
    )
    # Sampled segmentations are longer, so a pass over the same pairs takes more batches.
    assert sampled > plain
    # Under sampling the stream still yields every pair once a pass, its text intact.
    stream, _ = stream_training_examples(
        corpora, *samplers, sampling, StreamCounters(corpora, [0]), seed=1
    )
    numbers = numbers_of(stream, tokenizers[0], 600)
    assert sorted(numbers) == sorted(2 * list(range(300)))


def test_vocabulary_files_and_special_ids(tokenizer):
    assert 4 < tokenizer.vocab_size <= 80  # a small corpus may support fewer pieces
    vocab = tokenizer.model_path.with_suffix(".vocab").read_text(encoding="utf-8").splitlines()
    assert [line.split("\t")[0] for line in vocab[:4]] == ["<pad>", "<unk>", "<s>", "</s>"]
    ids = tokenizer.tokenize(tf.constant(["der hund läuft im park"]))
    assert tokenizer.detokenize(ids).numpy()[0].decode() == "der hund läuft im park"
    unknown = tokenizer.tokenize(tf.constant(["xylophon"])).flat_values.numpy()
    assert 1 in unknown  # unseen characters map to <unk>


def test_encode_drops_empty_and_over_long_pairs(tokenizer, corpus):
    messages = []
    encoded = encode_corpus(corpus, tokenizer, tokenizer, DATA, "train", messages.append)
    assert 5 not in encoded.kept and 7 not in encoded.kept and 9 not in encoded.kept
    assert len(encoded) == 297
    assert "kept 297, dropped 2 empty and 1 over-long" in messages[0]
    assert encoded.target_tokens == int(encoded.target_ids.row_lengths().numpy().sum()) + 297


def test_targets_are_shifted_and_bucketed(tokenizer, corpus):
    encoded = encode_corpus(corpus, tokenizer, tokenizer, DATA, "train", lambda _: None)
    boundaries = bucket_boundaries(60, 5)
    seen = 0
    for inputs, labels in make_dataset(encoded, batch_size=16, bucket_width=5, max_length=60):
        source, target_in = inputs["source_ids"].numpy(), inputs["target_input_ids"].numpy()
        labels = labels.numpy()
        assert source.shape[0] == target_in.shape[0] == labels.shape[0] <= 16
        assert np.all(target_in[:, 0] == BOS_ID)
        lengths = (labels != 0).sum(1)
        assert np.all(labels[np.arange(len(labels)), lengths - 1] == EOS_ID)
        for row_in, row_out, n in zip(target_in, labels, lengths):
            np.testing.assert_array_equal(row_in[1:n], row_out[: n - 1])
        example_lengths = np.maximum((source != 0).sum(1), lengths)
        bucket = np.searchsorted(boundaries, example_lengths, side="right")
        assert len(set(bucket)) == 1, "a batch mixes length buckets"
        seen += len(labels)
    assert seen == len(encoded)
    assert int(with_known_length(make_dataset(encoded, 16)).cardinality()) > 0


def test_batching_by_tokens_bounds_the_padded_size(tokenizer, corpus):
    encoded = encode_corpus(corpus, tokenizer, tokenizer, DATA, "train", lambda _: None)
    for inputs, labels in make_dataset(
        encoded, batch_size=1, batch_tokens=120, bucket_width=5, max_length=60
    ):
        length = max(inputs["source_ids"].shape[1], labels.shape[1])
        assert labels.shape[0] * length <= 120 or labels.shape[0] == 1


# The training stream.


def number_words(number):
    return " ".join(DIGITS[int(d)] for d in str(number))


def write_shards(directory, first, counts, prefix="train"):
    """Aligned gzip shards of pairs `("<number>", "der <number>")`, numbered from `first`."""
    number = first
    for index, count in enumerate(counts):
        lines = [number_words(n) for n in range(number, number + count)]
        number += count
        for side, text in (("src", lines), ("tgt", [f"der {line}" for line in lines])):
            with gzip.open(directory / f"{prefix}-{index:02d}.{side}.gz", "wt") as handle:
                handle.write("".join(line + "\n" for line in text))


def data_config(**paths):
    return {
        **DATA, "train_corpora": None, "train_tsv": None, "train_source": None,
        "train_target": None, **paths,
    }  # fmt: skip


def numbers_of(examples, tokenizer, count):
    """The numbers of the first `count` examples of a stream, checking that source and target
    agree and that the target is shifted between decoder input and labels."""
    sources, targets = [], []
    for inputs, labels in examples.take(count):
        target_in, labels = inputs["target_input_ids"].numpy(), labels.numpy()
        assert target_in[0] == BOS_ID and labels[-1] == EOS_ID
        np.testing.assert_array_equal(target_in[1:], labels[:-1])
        sources.append(inputs["source_ids"].numpy())
        targets.append(labels[:-1])
    # One detokenisation of all rows: an eager call per row is most of the time otherwise.
    sources, targets = (
        [text.decode() for text in tokenizer.detokenize(tf.ragged.constant(rows)).numpy()]
        for rows in (sources, targets)
    )
    numbers = []
    for source, target in zip(sources, targets):
        assert target == f"der {source}"
        numbers.append(int("".join(str(DIGITS.index(w)) for w in source.split())))
    return numbers


def shard_config(tmp_path, counts):
    write_shards(tmp_path, 0, counts)
    return data_config(
        train_source=str(tmp_path / "train-*.src.gz"), train_target=str(tmp_path / "train-*.tgt.gz")
    )


@pytest.mark.parametrize("counts", [[90, 60, 120, 45, 75], [390]])
def test_two_input_pipelines_read_every_pair_once_per_pass(tmp_path, tokenizer, counts):
    """File-level sharding with enough files, line-level with fewer files than pipelines."""
    data = shard_config(tmp_path, counts)
    corpora, _, _ = scan_training_corpora(data, log=lambda _: None)
    read = []
    for pipeline in range(2):
        context = tf.distribute.InputContext(2, pipeline, 2)
        counters = StreamCounters(corpora, [0])
        pairs, sharding = stream_training_examples(
            corpora, tokenizer, tokenizer, data, counters, seed=3, input_context=context
        )
        mine = sum(corpora[0].shards[i].lines for i in range(pipeline, len(counts), 2))
        if len(counts) == 1:
            assert sharding == ["1 line in 2 (fewer files than input pipelines)"]
            mine = (counts[0] + 1 - pipeline) // 2
        else:
            assert sharding == [f"{(len(counts) + 1 - pipeline) // 2} of its 5 files"]
        # Two passes: each holds this pipeline's pairs once, in a new file order.
        numbers = numbers_of(pairs, tokenizer, 2 * mine)
        first, second = numbers[:mine], numbers[mine:]
        assert sorted(first) == sorted(second) and len(set(first)) == mine, pipeline
        read.extend(first)
    assert sorted(read) == list(range(sum(counts)))


def test_weighted_mixing_follows_the_weights(tmp_path, tokenizer):
    write_shards(tmp_path, 0, [200], prefix="a")
    with open(tmp_path / "b.tsv", "w") as handle:  # the TSV form, numbers from 1000
        handle.write(
            "".join(f"{number_words(n)}\tder {number_words(n)}\n" for n in range(1000, 1300))
        )
    data = data_config(train_corpora=[
        {"source": str(tmp_path / "a-*.src.gz"), "target": str(tmp_path / "a-*.tgt.gz"),
         "weight": 3},
        {"tsv": str(tmp_path / "b.tsv"), "weight": 1.0},
    ])  # fmt: skip
    corpora, _, _ = scan_training_corpora(data, log=lambda _: None)
    counters = StreamCounters(corpora, [0, 0])
    pairs, _ = stream_training_examples(corpora, tokenizer, tokenizer, data, counters, seed=5)
    numbers = numbers_of(pairs, tokenizer, 3000)
    share = np.mean(np.asarray(numbers) < 1000)
    # 3:1 weights: 0.75, with a binomial standard deviation of 0.008 over 3,000 draws.
    assert abs(share - 0.75) < 0.03, share


def test_a_stream_continues_at_its_position_without_reading_what_came_before(tmp_path, tokenizer):
    data = shard_config(tmp_path, [300, 200, 250])
    corpora, _, _ = scan_training_corpora(data, log=lambda _: None)
    total = corpora[0].lines
    whole, _ = stream_training_examples(
        corpora, tokenizer, tokenizer, data, StreamCounters(corpora, [0]), seed=9
    )
    reference = numbers_of(whole, tokenizer, 4 * total)
    start = 3 * total - 20  # 20 lines before the end of the third pass
    counters = StreamCounters(corpora, [start])
    resumed, _ = stream_training_examples(corpora, tokenizer, tokenizer, data, counters, seed=9)
    assert numbers_of(resumed, tokenizer, 100) == reference[start : start + 100]
    # Read from its position (the map reads a few batches ahead), not replayed from the start.
    assert counters.read()[0, 0] < 2 * total
    assert counters.positions()[0] == start + counters.read()[0, 0]


def test_bad_lines_are_skipped_and_counted_on_the_stream(tmp_path, tokenizer):
    write_shards(tmp_path, 0, [500])
    source = tmp_path / "train-00.src.gz"
    lines = gzip.open(source).read().split(b"\n")
    lines[250] = b"drei \xff\xfe vier"
    source.write_bytes(gzip.compress(b"\n".join(lines)))
    data = {**shard_config(tmp_path, []), "skip_bad_lines": True}
    data["train_source"], data["train_target"] = str(source), str(tmp_path / "train-00.tgt.gz")
    corpora, _, _ = scan_training_corpora(data, log=lambda _: None)
    assert corpora[0].bad_lines == 1
    counters = StreamCounters(corpora, [0])
    pairs, _ = stream_training_examples(corpora, tokenizer, tokenizer, data, counters, seed=1)
    numbers = numbers_of(pairs, tokenizer, 499)
    assert 250 not in numbers and len(set(numbers)) == 499
    assert counters.read()[0, 3] >= 1  # the bad line, counted as it went by


def stream_graph_constants(directory, tokenizer, lines):
    directory.mkdir()
    data = shard_config(directory, [lines])
    corpora, _, _ = scan_training_corpora(data, log=lambda _: None)
    batching = dict(batch_size=8, batch_tokens=None, bucket_width=5, max_length=60)
    dataset, _ = make_training_stream(
        corpora, tokenizer, tokenizer, data, batching, StreamCounters(corpora, [0]), 64, seed=1
    )
    graph = tf.compat.v1.GraphDef.FromString(dataset._as_serialized_graph().numpy())
    functions = [node for f in graph.library.function for node in f.node_def]
    return [
        node.attr["value"].tensor.ByteSize()
        for node in [*graph.node, *functions]
        if node.op == "Const"
    ], {node.op for node in graph.node}


def test_nothing_of_the_corpus_size_is_held(tmp_path, tokenizer):
    """The stream's graph holds file names, the tokenizer and small constants, whatever the
    corpus size: no line, token or index of it (no in-memory slices, no cache)."""
    small, ops = stream_graph_constants(tmp_path / "small", tokenizer, 200)
    large, _ = stream_graph_constants(tmp_path / "large", tokenizer, 20_000)
    assert sorted(small) == sorted(large)
    assert "CacheDatasetV2" not in ops
    tokenizer_bytes = tokenizer.model_path.stat().st_size
    assert max(size for size in large if size < tokenizer_bytes) < 1024


def test_an_existing_vocabulary_is_used_instead_of_building_one(tmp_path, vocabulary):
    data = {"source_vocabulary": str(vocabulary), "target_vocabulary": None,
            "shared_vocabulary": False, "target_vocab_size": 40,
            "subword_model": "unigram"}  # fmt: skip
    assert vocabularies_to_build(tmp_path, data) == ["target"]
    sample = [" ".join(WORDS[i : i + 4]).encode() for i in range(len(WORDS))] * 20
    source, target = prepare_tokenizers(tmp_path, data, {"target": sample}, lambda _: None)
    assert source.model_proto == vocabulary.read_bytes() and target.vocab_size <= 40
    assert (tmp_path / "vocab" / "source.vocab").is_file()
    other = tmp_path / "other.model"
    train_sentencepiece([s.decode() for s in sample], 30, "unigram", other)
    with pytest.raises(UserError, match="source.model differs from .*other.model"):
        prepare_tokenizers(tmp_path, {**data, "source_vocabulary": str(other)}, {}, print)
