"""tf.data pipeline: filtering, shifted targets, bucketing, seeded shuffling, sharding."""

import numpy as np
import pytest
import tensorflow as tf

from pipeline.corpus import ParallelCorpus
from pipeline.dataset import bucket_boundaries, encode_corpus, make_dataset, with_known_length
from pipeline.tokenizer import BOS_ID, EOS_ID, Tokenizer, train_sentencepiece

WORDS = (
    "der die das ein eine hund katze mann frau kind läuft springt sitzt im park auf dem gras"
).split()


@pytest.fixture(scope="module")
def vocabulary(tmp_path_factory):
    rng = np.random.default_rng(0)
    sentences = [" ".join(rng.choice(WORDS, size=rng.integers(2, 12))) for _ in range(400)]
    path = tmp_path_factory.mktemp("vocab") / "sp.model"
    train_sentencepiece(sentences, 60, "unigram", path)
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


DATA = {"max_source_length": 60, "max_target_length": 60}


def test_vocabulary_files_and_special_ids(tokenizer):
    assert 4 < tokenizer.vocab_size <= 60  # a small corpus may support fewer pieces
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


def test_batching_by_tokens_bounds_the_padded_size(tokenizer, corpus):
    encoded = encode_corpus(corpus, tokenizer, tokenizer, DATA, "train", lambda _: None)
    for inputs, labels in make_dataset(
        encoded, batch_size=1, batch_tokens=120, bucket_width=5, max_length=60
    ):
        length = max(inputs["source_ids"].shape[1], labels.shape[1])
        assert labels.shape[0] * length <= 120 or labels.shape[0] == 1


def _first_sources(dataset):
    inputs, _ = next(iter(dataset))
    return inputs["source_ids"].numpy()


def test_shuffling_is_seeded(tokenizer, corpus):
    encoded = encode_corpus(corpus, tokenizer, tokenizer, DATA, "train", lambda _: None)

    def make(seed):
        return make_dataset(
            encoded, batch_size=300, bucket_width=100, max_length=60, shuffle_buffer=300, seed=seed
        )

    np.testing.assert_array_equal(_first_sources(make(7)), _first_sources(make(7)))
    assert not np.array_equal(_first_sources(make(7)), _first_sources(make(8)))


def test_each_input_pipeline_reads_its_own_shard(tokenizer, corpus):
    encoded = encode_corpus(corpus, tokenizer, tokenizer, DATA, "train", lambda _: None)
    rows = []
    for pipeline_id in range(2):
        context = tf.distribute.InputContext(
            num_input_pipelines=2, input_pipeline_id=pipeline_id, num_replicas_in_sync=2
        )
        dataset = make_dataset(
            encoded, batch_size=16, bucket_width=100, max_length=60, input_context=context
        )
        shard = [
            tuple(row[row != 0]) for inputs, _ in dataset for row in inputs["source_ids"].numpy()
        ]
        assert max(len(inputs["source_ids"]) for inputs, _ in dataset) == 16  # per replica
        rows.append(shard)
    assert len(rows[0]) + len(rows[1]) == len(encoded)
    assert abs(len(rows[0]) - len(rows[1])) <= 1


def test_the_declared_length_holds_for_every_shuffled_epoch(tokenizer, corpus):
    encoded = encode_corpus(corpus, tokenizer, tokenizer, DATA, "train", lambda _: None)
    dataset = with_known_length(
        make_dataset(
            encoded, batch_size=16, bucket_width=3, max_length=60, shuffle_buffer=300, seed=1
        )
    )
    declared = int(dataset.cardinality())
    assert declared > 0
    assert [sum(1 for _ in dataset) for _ in range(3)] == [declared] * 3
