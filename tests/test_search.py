"""Search: greedy, sampling and beam search, on hand-built step functions and a real model."""

import itertools
import math

import numpy as np
import pytest
import tensorflow as tf

import layers
from helpers import reversal_data
from pipeline.decoding.search import (
    _best_unblocked,
    _block_repeated_ngrams,
    beam_search,
    decode_length_limits,
    greedy_search,
    length_penalty,
    ngram_blocking,
    sampling_search,
)

PAD, UNK, BOS, EOS = 0, 1, 2, 3


class TableModel:
    """A stand-in for RecurrentSeq2Seq whose next-token distribution depends only on the previous
    token: `table[previous]` are probabilities over the vocabulary. Its attention at step t
    looks at source position t (clipped), so coverage is predictable."""

    pad_id, bos_id, eos_id = PAD, BOS, EOS
    target_language_first = False

    def __init__(self, table):
        table = np.asarray(table, np.float64)
        self.target_vocab_size = table.shape[1]
        with np.errstate(divide="ignore"):
            self.log_table = tf.constant(np.where(table > 0, np.log(table), -1e9), tf.float32)

    def encode(self, source_ids):
        return {"source_length": tf.shape(source_ids)[1] + tf.zeros_like(source_ids[:, 0])}

    def initial_decoder_state(self, encoded):
        return {"unused": tf.zeros_like(encoded["source_length"])}

    def decode_step(self, tokens, state, encoded, step):
        source_length = tf.reduce_max(encoded["source_length"])
        position = tf.minimum(step, source_length - 1)
        weights = tf.cast(tf.equal(tf.range(source_length), position), tf.float32)
        weights = tf.tile(weights[None], [tf.shape(tokens)[0], 1])
        return tf.gather(self.log_table, tokens), state, weights


def table(rows, vocab=6):
    """Probabilities from {previous: {next: p}}; unlisted rows and tokens get nothing."""
    probs = np.zeros((vocab, vocab))
    for previous, nexts in rows.items():
        for token, p in nexts.items():
            probs[previous, token] = p
    probs[[PAD, UNK, EOS], EOS] = 1.0
    return probs


A, B, C = 4, 5, 6
GREEDY_TRAP = table(
    {
        BOS: {A: 0.5, B: 0.4, EOS: 0.1},
        A: {A: 0.3, B: 0.3, EOS: 0.4},
        B: {EOS: 0.9, A: 0.05, B: 0.05},
    }
)
SOURCE = np.array([[7, 8, 9]], np.int32)


def test_beam_search_finds_what_greedy_misses():
    model = TableModel(GREEDY_TRAP)
    ids, lengths, scores, _ = greedy_search(model, SOURCE, max_lengths=5)
    assert ids.numpy()[0, :2].tolist() == [A, EOS] and lengths.numpy()[0] == 2
    assert scores.numpy()[0] == pytest.approx(math.log(0.5 * 0.4), abs=1e-6)
    ids, lengths, scores, _ = beam_search(model, SOURCE, max_lengths=5, beam_size=2, n_best=2)
    assert ids.numpy()[0, 0, :2].tolist() == [B, EOS]
    assert scores.numpy()[0, 0] == pytest.approx(math.log(0.4 * 0.9), abs=1e-6)
    assert ids.numpy()[0, 1, :2].tolist() == [A, EOS]
    assert scores.numpy()[0, 1] == pytest.approx(math.log(0.5 * 0.4), abs=1e-6)
    np.testing.assert_array_equal(lengths.numpy()[0], [2, 2])


def brute_force(probs, max_length, alpha, penalty):
    """Every sequence ending in </s> within max_length, ranked like beam search ranks them."""
    reachable = [t for t in range(probs.shape[1]) if t != EOS and probs[:, t].any()]
    ranked = []
    for length in range(1, max_length + 1):
        for body in itertools.product(reachable, repeat=length - 1):
            sequence = (*body, EOS)
            previous, log_p = BOS, 0.0
            for token in sequence:
                log_p += math.log(max(probs[previous, token], 1e-30))
                previous = token
            lp = length**alpha if penalty == "average" else ((5 + length) / 6) ** alpha
            ranked.append((log_p / lp, sequence))
    return sorted(ranked, reverse=True)


@pytest.mark.parametrize("alpha,penalty", [(0.0, "gnmt"), (1.0, "average"), (0.6, "gnmt")])
def test_scores_and_ranking_match_exhaustive_enumeration(rng, alpha, penalty):
    # Tokens after <s>: <unk>, A and </s>; with n_best = every complete sequence up to
    # max_length and a beam wide enough to keep every candidate (24 at the last step), beam
    # search must return all of them, ranked and scored exactly.
    probs = rng.dirichlet(np.ones(5) * 0.5, size=5)
    probs[:, [PAD, BOS]] = 0.0
    probs /= probs.sum(1, keepdims=True)
    expected = brute_force(probs, 4, alpha, penalty)
    assert len(expected) == 15
    ids, lengths, scores, _ = beam_search(
        TableModel(probs),
        SOURCE,
        max_lengths=4,
        beam_size=32,
        n_best=15,
        alpha=alpha,
        penalty=penalty,
    )
    for rank, (score, sequence) in enumerate(expected):
        assert scores.numpy()[0, rank] == pytest.approx(score, abs=1e-4)
        assert tuple(ids.numpy()[0, rank, : lengths.numpy()[0, rank]]) == sequence


@pytest.mark.parametrize("capped", ["fill", "rank"])
def test_a_hypothesis_cut_at_the_limit_fills_a_place_or_ranks_by_its_score(capped):
    """At the limit of two tokens, "A A" is cut while still open, more probable (0.54) than
    "</s>" (0.4) and "A </s>" (0.06), which ended: "fill" returns the ended ones first, as
    the toolkit's own models do; "rank" ranks them all by score, as transformers'
    generate() finishes every beam at max_length."""
    model = TableModel(table({BOS: {A: 0.6, EOS: 0.4}, A: {A: 0.9, EOS: 0.1}}))
    ids, lengths, scores, _ = beam_search(
        model, SOURCE, max_lengths=2, beam_size=2, n_best=2, alpha=0.0, capped=capped
    )
    best = [ids.numpy()[0, n, : lengths.numpy()[0, n]].tolist() for n in range(2)]
    expected = {"fill": ([[EOS], [A, EOS]], [0.4, 0.06]), "rank": ([[A, A], [EOS]], [0.54, 0.4])}
    assert best == expected[capped][0]
    np.testing.assert_allclose(scores.numpy()[0], np.log(expected[capped][1]), atol=1e-5)


def test_length_penalty_changes_the_choice():
    # "C </s>" has the best log-probability; "A ... A </s>" the best per token.
    probs = table({BOS: {A: 0.7, C: 0.3}, A: {A: 0.8, EOS: 0.2}, C: {EOS: 0.5, C: 0.5}}, vocab=7)
    model = TableModel(probs)
    ids, lengths, scores, _ = beam_search(model, SOURCE, max_lengths=6, beam_size=3, alpha=0.0)
    assert ids.numpy()[0, 0, :2].tolist() == [C, EOS]
    assert scores.numpy()[0, 0] == pytest.approx(math.log(0.3 * 0.5), abs=1e-5)
    ids, lengths, scores, _ = beam_search(
        model, SOURCE, max_lengths=6, beam_size=3, alpha=1.0, penalty="average"
    )
    # Three saved hypotheses end the search: C </s>, A </s> and A A </s>; the last wins.
    assert ids.numpy()[0, 0].tolist() == [A, A, EOS, PAD, PAD, PAD]
    expected = (math.log(0.7) + math.log(0.8) + math.log(0.2)) / 3
    assert scores.numpy()[0, 0] == pytest.approx(expected, abs=1e-5)


def test_min_length_suppresses_early_end():
    model = TableModel(GREEDY_TRAP)
    for search in (
        lambda m: greedy_search(m, SOURCE, max_lengths=6, min_length=3)[0].numpy()[0],
        lambda m: beam_search(m, SOURCE, max_lengths=6, beam_size=2, min_length=3)[0].numpy()[0, 0],
    ):
        ids = search(model)
        end = list(ids).index(EOS)
        assert end >= 3


def banned_by_brute_force(row, t, size):
    """The tokens that would complete an n-gram already among `row[:t]`."""
    tokens = list(row[:t])
    if size == 0 or t < size:
        return set()
    suffix = tokens[t - size + 1 :]
    return {tokens[j + size - 1] for j in range(t - size + 1) if tokens[j : j + size - 1] == suffix}


@pytest.mark.parametrize("as_tensor", [False, True])
def test_no_repeat_ngram_blocking_forbids_exactly_the_repeating_tokens(rng, as_tensor):
    vocab, width = 6, 12
    for size in range(0, 5):
        ids = rng.integers(4, vocab, (20, width)).astype(np.int32)
        for t in range(0, width + 1):
            written = np.where(np.arange(width) < t, ids, PAD).astype(np.int32)
            blocked = _block_repeated_ngrams(
                tf.zeros([20, vocab]), tf.constant(written), tf.constant(t),
                ngram_blocking(tf.constant(size) if as_tensor else size),
            ).numpy()  # fmt: skip
            for row in range(20):
                expected = banned_by_brute_force(written[row], t, size)
                assert set(np.flatnonzero(blocked[row] < -1e8)) == expected, (size, t, row)


@pytest.mark.parametrize("size", [0, 1, 2, 3])
def test_beam_candidates_are_the_best_tokens_no_ngram_blocks(rng, size):
    """Beam search ranks a few candidates per hypothesis instead of blocking the whole
    vocabulary: they must be the best unblocked tokens, whatever the count and step."""
    vocab, width, rows = 9, 10, 16
    ids = rng.integers(4, vocab, (rows, width)).astype(np.int32)
    log_probs = np.log(rng.dirichlet(np.ones(vocab), rows)).astype(np.float32)
    blocking = ngram_blocking(tf.constant(size))
    for t in range(width + 1):
        written = np.where(np.arange(width) < t, ids, PAD).astype(np.int32)
        for count in (1, 4, vocab):
            best, tokens = _best_unblocked(
                tf.constant(log_probs), tf.constant(written), tf.constant(t), blocking, count
            )
            for row in range(rows):
                banned = banned_by_brute_force(written[row], t, size)
                allowed = [v for v in np.argsort(-log_probs[row]) if v not in banned]
                kept = [v for v, b in zip(tokens[row].numpy(), best[row].numpy()) if b > -1e8]
                assert kept == allowed[:count], (size, t, count, row)
                np.testing.assert_allclose(best[row, : len(kept)], log_probs[row, kept])


LOOP = table({BOS: {A: 0.6, B: 0.4}, A: {B: 0.98, EOS: 0.02}, B: {A: 0.97, C: 0.02, EOS: 0.01},
              C: {A: 0.5, EOS: 0.5}}, vocab=7)  # fmt: skip


def ngrams(sequence, size):
    return [tuple(sequence[i : i + size]) for i in range(len(sequence) - size + 1)]


@pytest.mark.parametrize("size", [2, 3])
@pytest.mark.parametrize("search", ["greedy", "beam", "sampling"])
def test_no_output_repeats_an_ngram_of_the_size_asked(size, search):
    model = TableModel(LOOP)
    sources = np.tile(SOURCE, [3, 1])

    def run(no_repeat):
        if search == "greedy":
            ids = greedy_search(model, sources, 12, no_repeat_ngram_size=no_repeat)[0]
        elif search == "beam":
            ids = beam_search(model, sources, 12, 3, 3, no_repeat_ngram_size=no_repeat)[0]
        else:
            ids = sampling_search(model, sources, 12, seed=(3, 0),
                                  no_repeat_ngram_size=no_repeat)[0]  # fmt: skip
        return [[t for t in row if t != PAD] for row in ids.numpy().reshape(-1, 12)]

    looping = run(0)
    assert any(len(set(ngrams(row, size))) < len(ngrams(row, size)) for row in looping)
    for row in run(size):
        assert len(set(ngrams(row, size))) == len(ngrams(row, size)), row


PREFIXES = np.array([[B, A, B], [PAD, PAD, PAD], [B, C, PAD]], np.int32)


def prefix_of(row):
    return [t for t in row if t != PAD]


def log_prob_of(probs, sequence):
    previous, total = BOS, 0.0
    for token in sequence:
        total += math.log(probs[previous, token])
        previous = token
    return total


@pytest.mark.parametrize("search", ["greedy", "beam", "sampling"])
def test_every_hypothesis_starts_with_its_prefix_and_is_scored_whole(search):
    model = TableModel(LOOP)
    sources = np.tile(SOURCE, [3, 1])

    def run(source_ids, prefix, limit):
        if search == "greedy":
            ids, lengths, scores, _ = greedy_search(model, source_ids, limit, target_prefix=prefix)
            return ids.numpy()[:, None], lengths.numpy()[:, None], scores.numpy()[:, None]
        if search == "sampling":
            ids, lengths, scores, _ = sampling_search(
                model, source_ids, limit, seed=(5, 0), target_prefix=prefix
            )
            return ids.numpy()[:, None], lengths.numpy()[:, None], scores.numpy()[:, None]
        ids, lengths, scores, _ = beam_search(
            model, source_ids, limit, beam_size=3, n_best=3, target_prefix=prefix
        )
        return ids.numpy(), lengths.numpy(), scores.numpy()

    ids, lengths, scores = run(sources, PREFIXES, 8)
    for row, prefix in enumerate(PREFIXES):
        expected = prefix_of(prefix)
        for n in range(ids.shape[1]):
            hypothesis = ids[row, n, : lengths[row, n]].tolist()
            assert hypothesis[: len(expected)] == expected, (row, hypothesis)
            if search != "beam":  # beam scores carry the length penalty
                assert scores[row, n] == pytest.approx(log_prob_of(LOOP, hypothesis), abs=1e-4)
        alone = run(sources[row : row + 1], PREFIXES[row : row + 1], 8)
        np.testing.assert_array_equal(alone[0][0], ids[row, :, : alone[0].shape[2]])
    # A token the model deems impossible (here C after <s>) is forced all the same.
    ids, lengths, _ = run(sources[:1], np.array([[C]], np.int32), 8)
    assert ids[0, 0, 0] == C
    # A limit too short for the prefix is raised to hold it and </s>.
    ids, lengths, _ = run(sources[:1], PREFIXES[:1], 2)
    assert ids[0, 0, :3].tolist() == [B, A, B] and lengths[0, 0] == 4


@pytest.mark.parametrize("search", ["greedy", "beam"])
def test_a_forced_prefix_repeating_an_ngram_is_kept_and_scored_by_the_model(search):
    model, prefix = TableModel(LOOP), np.array([[B, A, B, A]], np.int32)  # "B A" twice
    if search == "greedy":
        ids, lengths, scores, _ = greedy_search(
            model, SOURCE, 8, no_repeat_ngram_size=2, target_prefix=prefix
        )
        hypothesis, score = ids.numpy()[0, : lengths[0]].tolist(), scores.numpy()[0]
    else:
        ids, lengths, scores, _ = beam_search(
            model, SOURCE, 8, beam_size=3, no_repeat_ngram_size=2, target_prefix=prefix
        )
        hypothesis, score = ids.numpy()[0, 0, : lengths[0, 0]].tolist(), scores.numpy()[0, 0]
    assert hypothesis[:4] == [B, A, B, A]
    assert score == pytest.approx(log_prob_of(LOOP, hypothesis), abs=1e-4)


def test_max_length_cuts_and_alive_hypotheses_fill_in():
    loop = table({BOS: {A: 1.0}, A: {A: 1.0}})
    ids, lengths, scores, _ = beam_search(
        TableModel(loop), SOURCE, max_lengths=4, beam_size=2, n_best=2
    )
    assert ids.numpy()[0, 0].tolist() == [A, A, A, A] and lengths.numpy()[0, 0] == 4
    assert scores.numpy()[0, 0] == pytest.approx(0.0, abs=1e-6)


def test_coverage_penalty_is_added_exactly():
    model = TableModel(GREEDY_TRAP)
    _, _, plain, attention = beam_search(model, SOURCE, max_lengths=5, beam_size=2, beta=0.0)
    _, _, covered, _ = beam_search(model, SOURCE, max_lengths=5, beam_size=2, beta=0.5)
    # "B </s>" attends to source positions 0 then 1; position 2 gets nothing (log of 1e-10).
    assert attention.numpy()[0, 0, :2, :].tolist() == [[1, 0, 0], [0, 1, 0]]
    assert covered.numpy()[0, 0] == pytest.approx(
        plain.numpy()[0, 0] + 0.5 * math.log(1e-10), rel=1e-5
    )


class PerSourceTableModel(TableModel):
    """A `TableModel` with one table per source, chosen by the source's first id (0, 1, ...),
    so that the sources of a batch finish at different steps. Records the rows of each step."""

    def __init__(self, tables):
        super().__init__(tables[0])
        with np.errstate(divide="ignore"):
            self.log_tables = tf.constant(np.where(tables > 0, np.log(tables), -1e9), tf.float32)
        self.rows_per_step = []

    def encode(self, source_ids):
        return {**super().encode(source_ids), "table": source_ids[:, 0]}

    def decode_step(self, tokens, state, encoded, step):
        self.rows_per_step.append(int(tf.shape(tokens)[0]))
        _, _, weights = super().decode_step(tokens, state, encoded, step)
        beams = tf.shape(tokens)[0] // tf.shape(encoded["table"])[0]
        table = tf.repeat(encoded["table"], beams)
        return tf.gather_nd(self.log_tables, tf.stack([table, tokens], 1)), state, weights


def test_finished_sources_leave_the_batch_and_keep_their_results():
    tables = np.stack(
        [
            table({BOS: {A: 0.6, EOS: 0.4}, A: {EOS: 1.0}}),  # done after 2 steps
            table({BOS: {A: 0.6, B: 0.4}, A: {A: 0.5, EOS: 0.5}, B: {B: 0.9, EOS: 0.1}}),
            table({BOS: {A: 1.0}, A: {A: 1.0}}),  # never ends: cut at max_length
        ]
    )
    sources = np.array([[1, 8, 9], [0, 8, 9], [2, 8, 9]], np.int32)  # ids pick the tables
    model = PerSourceTableModel(tables)
    batch = beam_search(model, sources, max_lengths=6, beam_size=2, n_best=2, alpha=0.6)
    # Two hypotheses a source: 6 rows until source 1 is done, 4 after, 2 once only one is left.
    assert model.rows_per_step[:2] == [6, 6] and model.rows_per_step[-1] == 2
    assert 4 in model.rows_per_step
    for i in range(3):
        alone = beam_search(
            model, sources[i : i + 1], max_lengths=6, beam_size=2, n_best=2, alpha=0.6
        )
        for batch_values, alone_values in zip(batch, alone):
            np.testing.assert_allclose(batch_values.numpy()[i], alone_values.numpy()[0], rtol=1e-6)
    assert batch[1].numpy()[2, 0] == 6  # cut at max_length: filled in by an alive hypothesis


def test_length_penalty_formulas():
    assert float(length_penalty(4, 0.6, "gnmt")) == pytest.approx((9 / 6) ** 0.6)
    assert float(length_penalty(4, 0.5, "average")) == pytest.approx(2.0)
    with pytest.raises(ValueError):
        length_penalty(4, 0.5, "wrong")


@pytest.fixture(scope="module")
def trained_model():
    rng = np.random.default_rng(3)
    x, y = reversal_data(rng, 1500, 20)
    encoder = layers.RecurrentEncoder(20, 16, 16, bidirectional=True)
    decoder = layers.AttentionDecoder(
        20, 16, 32, attention=layers.BahdanauAttention(16), input_feeding=True
    )
    model = layers.RecurrentSeq2Seq(encoder, decoder)
    model.compile(optimizer="adam")
    model.fit(x, y, batch_size=64, epochs=2, verbose=0)
    return model, reversal_data(rng, 12, 20)[0]["source_ids"]


def test_beam_of_one_is_greedy(trained_model):
    model, source = trained_model
    greedy_ids, greedy_lengths, greedy_scores, greedy_attention = greedy_search(model, source, 10)
    ids, lengths, scores, attention = beam_search(model, source, 10, beam_size=1)
    np.testing.assert_array_equal(ids.numpy()[:, 0], greedy_ids.numpy())
    np.testing.assert_array_equal(lengths.numpy()[:, 0], greedy_lengths.numpy())
    np.testing.assert_allclose(scores.numpy()[:, 0], greedy_scores.numpy(), atol=1e-4)
    np.testing.assert_allclose(attention.numpy()[:, 0], greedy_attention.numpy(), atol=1e-5)


def test_a_sentence_decodes_the_same_alone_and_in_a_batch(trained_model):
    model, source = trained_model
    batch_ids = beam_search(model, source, 10, beam_size=3, n_best=2)[0].numpy()
    greedy_ids = greedy_search(model, source, 10)[0].numpy()
    for i in range(4):
        alone = source[i : i + 1, : (source[i] != PAD).sum()]
        np.testing.assert_array_equal(
            beam_search(model, alone, 10, beam_size=3, n_best=2)[0].numpy()[0], batch_ids[i]
        )
        np.testing.assert_array_equal(greedy_search(model, alone, 10)[0].numpy()[0], greedy_ids[i])


def test_beam_attention_is_a_distribution_until_the_end(trained_model):
    model, source = trained_model
    _, lengths, _, attention = beam_search(model, source, 10, beam_size=3, n_best=3)
    for i in range(len(source)):
        for rank in range(3):
            n = lengths.numpy()[i, rank]
            rows = attention.numpy()[i, rank]
            np.testing.assert_allclose(rows[:n].sum(-1), 1.0, atol=1e-5)
            assert np.all(rows[:n, (source[i] == PAD)] == 0)


def test_each_hypothesis_scores_and_attends_as_a_forced_pass_over_its_ids(trained_model):
    """Beams reorder at every step: each returned hypothesis must still carry its own
    log-probability and attention, as the model gives them when forced along its ids."""
    model, source = trained_model
    ids, lengths, scores, attention = beam_search(model, source, 10, beam_size=4, n_best=4)
    ids, lengths, scores, attention = (x.numpy() for x in (ids, lengths, scores, attention))
    for rank in range(4):
        target_input = np.concatenate(
            [np.full((len(source), 1), model.bos_id), ids[:, rank, :-1]], axis=1
        )
        logits, forced_attention = model.forward(
            {"source_ids": source, "target_input_ids": target_input}
        )
        log_probs = tf.nn.log_softmax(logits).numpy()
        for i in range(len(source)):
            n = lengths[i, rank]
            chosen = log_probs[i, np.arange(n), ids[i, rank, :n]]
            assert scores[i, rank] == pytest.approx(chosen.sum(), abs=1e-3)
            np.testing.assert_allclose(
                attention[i, rank, :n], forced_attention.numpy()[i, :n], atol=1e-5
            )


class NeverEnds:
    """A model that never ends: `model`'s steps with the </s> and padding logits pushed away."""

    def __init__(self, model):
        self.model = model

    def __getattr__(self, name):
        return getattr(self.model, name)

    def decode_step(self, tokens, state, encoded, step):
        logits, state, weights = self.model.decode_step(tokens, state, encoded, step)
        token = tf.range(tf.shape(logits)[-1])
        never = tf.logical_or(tf.equal(token, self.model.eos_id), tf.equal(token, PAD))
        return tf.where(never, -1e4, logits), state, weights


SEARCHES = {
    "greedy": lambda model, source, limits: greedy_search(model, source, limits),
    "sampling": lambda model, source, limits: sampling_search(model, source, limits, seed=(3, 1)),
    "beam": lambda model, source, limits: beam_search(model, source, limits, 4, n_best=3),
}


@pytest.mark.parametrize("search", SEARCHES)
def test_each_source_is_cut_at_its_own_limit_batched_or_alone(trained_model, search):
    model, source = trained_model
    model = NeverEnds(model)
    lengths = (source != PAD).sum(1)
    order = np.argsort(lengths)
    source = source[np.concatenate([order[:3], order[-3:]])]  # the shortest and longest
    limits = decode_length_limits(source, PAD, ratio=2.0, offset=1, cap=15).numpy()
    assert len(set(limits)) >= 3 and max(limits) == 15  # one is capped
    ids, out_lengths, _, _ = SEARCHES[search](model, source, limits)
    out_lengths = out_lengths.numpy().reshape(len(source), -1)
    np.testing.assert_array_equal(out_lengths, np.repeat(limits[:, None], out_lengths.shape[1], 1))
    for i, row in enumerate(source):
        alone = row[None, : (row != PAD).sum()]
        alone_ids, alone_lengths, _, _ = SEARCHES[search](model, alone, limits[i])
        assert np.all(alone_lengths.numpy() == limits[i])
        np.testing.assert_array_equal(
            alone_ids.numpy()[0], ids.numpy()[i][..., : alone_ids.shape[-1]]
        )


def trimmed(outputs, row, width, src_len):
    """One source's (ids, lengths, scores, attention) cut to `width` steps and `src_len`
    source positions; what lies beyond must be padding."""
    ids, lengths, scores, attention = (np.asarray(x)[row] for x in outputs)
    assert np.all(ids[..., width:] == PAD)
    assert not attention[..., width:, :].any() and not attention[..., src_len:].any()
    return ids[..., :width], lengths, scores, attention[..., :width, :src_len]


def assert_same_outputs(actual, expected):
    ids, lengths, scores, attention = actual
    np.testing.assert_array_equal(ids, expected[0])
    np.testing.assert_array_equal(lengths, expected[1])
    np.testing.assert_allclose(scores, expected[2], atol=1e-5)
    np.testing.assert_allclose(attention, expected[3], atol=1e-6)


@pytest.mark.parametrize("search", SEARCHES)
def test_outputs_do_not_depend_on_batch_mates_or_their_order(trained_model, search):
    model, source = trained_model
    limits = decode_length_limits(source, PAD, ratio=1.5, offset=2, cap=30).numpy()
    batched = SEARCHES[search](model, source, limits)
    shuffle = np.random.default_rng(0).permutation(len(source))
    shuffled = SEARCHES[search](model, source[shuffle], limits[shuffle])
    for i, row in enumerate(source):
        src_len = int((row != PAD).sum())
        alone = SEARCHES[search](model, row[None, :src_len], limits[i])
        expected = trimmed(alone, 0, alone[0].shape[-1], src_len)
        width = expected[0].shape[-1]
        assert_same_outputs(trimmed(batched, i, width, src_len), expected)
        at = int(np.flatnonzero(shuffle == i)[0])
        assert_same_outputs(trimmed(shuffled, at, width, src_len), expected)


def test_sampling_is_seeded_and_its_filters_work(trained_model):
    model, source = trained_model
    first = sampling_search(model, source, 10, temperature=1.5, seed=(4, 2))[0].numpy()
    again = sampling_search(model, source, 10, temperature=1.5, seed=(4, 2))[0].numpy()
    other = sampling_search(model, source, 10, temperature=1.5, seed=(5, 2))[0].numpy()
    np.testing.assert_array_equal(first, again)
    assert not np.array_equal(first, other)
    greedy = greedy_search(model, source, 10)[0].numpy()
    np.testing.assert_array_equal(
        sampling_search(model, source, 10, top_k=1, seed=(1, 1))[0].numpy(), greedy
    )
    np.testing.assert_array_equal(
        sampling_search(model, source, 10, top_p=1e-6, seed=(1, 1))[0].numpy(), greedy
    )


def test_top_p_keeps_the_nucleus():
    probs = table(
        {BOS: {A: 0.5, B: 0.3, C: 0.2}, A: {EOS: 1.0}, B: {EOS: 1.0}, C: {EOS: 1.0}}, vocab=7
    )
    # 200 different sentences: each has its own draws (one sentence repeated would not).
    source = np.concatenate(
        [np.arange(4, 204, dtype=np.int32)[:, None], np.repeat(SOURCE, 200, 0)], 1
    )
    first = sampling_search(TableModel(probs), source, 3, top_p=0.75, seed=(0, 1))[0].numpy()[:, 0]
    assert set(first) == {A, B}  # 0.5 + 0.3 reach 0.75; C is outside the nucleus
    first = sampling_search(TableModel(probs), source, 3, top_k=1, seed=(0, 1))[0].numpy()[:, 0]
    assert set(first) == {A}


def test_unknown_words_are_replaced_by_the_most_attended_source_piece():
    from pipeline.decoding.translation import replace_unknown

    attention = np.array([[0.9, 0.1, 0.0], [0.1, 0.2, 0.7], [0.3, 0.3, 0.4]])
    pieces = replace_unknown(
        [7, UNK, EOS], ["▁the", "<unk>", "</s>"], ["▁der", "▁Hund", "▁Xaver"], attention
    )
    assert pieces == ["▁the", "▁Xaver", "</s>"]
    assert replace_unknown([UNK], ["<unk>"], [], np.zeros((1, 0))) == ["<unk>"]
