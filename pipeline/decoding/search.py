"""Decoding search over the model's step function, as graph-friendly TensorFlow loops.

Search depends only on the `EncoderDecoderModel` decoding contract (`encode`,
`initial_decoder_state`, `decode_step`, and the `pad_id`/`bos_id`/`eos_id`/`target_vocab_size`
attributes), never on a model's internals. Loops run over fixed-shape buffers (`[batch, beam,
width]`), reorder beams with `tf.gather(..., batch_dims=1)`, stop early once every hypothesis
has finished (beam search also drops each finished source from the batch), and avoid
TensorArrays and integer one-hot ops, so that the same code converts to ONNX. Beam size,
number of hypotheses, penalties and lengths may be tensors: changing them needs no retracing.

A source's translation never depends on the other sources of its batch: each has its own
length limit (`decode_length_limits`), is finished at it as if it had emitted </s>, and
sampling draws each sentence's tokens from a seed of its own. Only the width of the output
buffers (the longest limit of the batch) depends on the batch; the rows past a hypothesis'
end are padding.
"""

from typing import Any, NamedTuple

import tensorflow as tf
from keras import ops

NEG_INF = -1e9  # a finite "impossible" score: -inf would turn into NaN in sums and products


def _write_column(buffer, index, values, axis):
    """`buffer` with position `index` of its `axis` set to `values`: a scatter of one column
    (not a pass over the whole buffer), so that the fixed-shape output buffers of a loop
    convert to an ONNX `Loop` with no TensorArray.

    Args (`axis` >= 1: the leading axes give each written slice its row):
        buffer: `[d_0, ..., d_axis, ..., d_n]`.
        index: scalar int, the position along `axis`.
        values: the buffer's shape without `axis`: `[d_0, ..., d_n]` minus `d_axis`.
    """
    index = ops.cast(index, "int32")
    # One index tuple (row..., index) per leading position; each writes a trailing slice.
    leading = ops.shape(values)[:axis]
    rows = ops.meshgrid(*[ops.arange(size, dtype="int32") for size in leading], indexing="ij")
    position = ops.full(leading, index, dtype="int32")
    indices = ops.stack([*rows, position], axis=-1)
    return ops.scatter_update(buffer, indices, values)


def source_lengths(source_ids, pad_id):
    """int32 `[batch]`: the tokens of each right-padded source."""
    return tf.reduce_sum(tf.cast(tf.not_equal(source_ids, pad_id), tf.int32), axis=1)


def decode_length_limits(source_ids, pad_id, ratio, offset, cap, max_length=0):
    """int32 `[batch]`: the most tokens (</s> included) each source's translation may have.

    `ceil(ratio * source length) + offset`, or `max_length` for every source where it is
    positive; within [1, cap] either way.
    """
    lengths = tf.cast(source_lengths(source_ids, pad_id), tf.float32)
    automatic = tf.cast(tf.math.ceil(ratio * lengths), tf.int32) + offset
    limits = tf.where(tf.convert_to_tensor(max_length) > 0, max_length, automatic)
    return tf.clip_by_value(limits, 1, cap)


def _limits_width_and_prefix(max_lengths, batch, target_prefix, pad_id):
    """Each source's limit (`max_lengths` may be one for all), raised where needed to hold its
    prefix and </s>; the output buffers' width (the longest limit, 1 for an empty batch so that
    buffers still have a valid shape); and `target_prefix` (int32 `[rows, len]`, right-padded)
    as int32 `[batch, width]`: cut or padded to the batch's rows (a missing row is an empty
    prefix) and to `width` columns, so that step t reads column t. None stays None."""
    limits = tf.broadcast_to(tf.cast(max_lengths, tf.int32), [batch])
    if target_prefix is None:
        return limits, tf.reduce_max(tf.concat([limits, [1]], axis=0)), None
    prefix = tf.convert_to_tensor(target_prefix, tf.int32)[:batch]
    prefix = tf.pad(prefix, [[0, batch - tf.shape(prefix)[0]], [0, 0]], constant_values=pad_id)
    lengths = tf.reduce_sum(tf.cast(tf.not_equal(prefix, pad_id), tf.int32), axis=1)
    limits = tf.maximum(limits, lengths + 1)
    width = tf.reduce_max(tf.concat([limits, [1]], axis=0))
    columns = tf.shape(prefix)[1]
    prefix = tf.pad(prefix, [[0, 0], [0, tf.maximum(width - columns, 0)]], constant_values=pad_id)
    return limits, width, prefix[:, :width]


def _suppress_eos(log_probs, eos_id, t, min_length):
    """Forbids </s> before `min_length` tokens."""
    if isinstance(min_length, int) and min_length == 0:
        return log_probs  # nothing to forbid: spare a pass over [batch, vocab] at each step
    is_eos = tf.equal(tf.range(tf.shape(log_probs)[-1]), eos_id)
    # A [vocab] bias, broadcast in one addition (a select would be a pass over [batch, vocab]).
    return log_probs + tf.where(tf.logical_and(is_eos, t < min_length), NEG_INF, 0.0)


class NgramBlocking(NamedTuple):
    """`no_repeat_ngram_size` and what follows from it, computed once, outside the loops
    (every node of a loop's body costs at each step in ONNX Runtime)."""

    # int32 []: an n-gram's start lags the next token by this much (n - 1; huge for n = 0, so
    # that no n-gram is ever complete)
    lag: tf.Tensor
    context: tf.Tensor  # int32 []: max(n - 1, 1), the tokens compared before the next one
    offsets: tf.Tensor  # int32 [context]: 0, 1, ..., context - 1
    # bool [context]: the offsets that match whatever they compare: for n = 1 the one offset
    # there is (ONNX Runtime mishandles reductions over an empty axis)
    wildcard: tf.Tensor


def ngram_blocking(size):
    """None for a Python 0 (no work at all); else the `NgramBlocking` of `size` (an int, or
    an int32 scalar tensor: a runtime input of the exports, applied at every step without a
    branch, since a conditional or a loop nested in the search loops makes ONNX Runtime fail
    with "Loop subgraph input has unknown shape")."""
    if isinstance(size, int) and size == 0:
        return None
    size = tf.convert_to_tensor(size, tf.int32)
    context = tf.maximum(size - 1, 1)
    offsets = tf.range(context)
    lag = tf.where(size > 0, size - 1, tf.int32.max // 2)
    return NgramBlocking(lag, context, offsets, offsets >= size - 1)


def _repeated_ngram_followers(ids, t, blocking):
    """For each n-gram complete before position t: whether the hypothesis' latest n - 1 tokens
    repeat its first n - 1, and the token that followed them there (the one a repeat bans).

    Args:
        ids: int32 `[rows, width]`: each row's `t` tokens so far, then padding.
        t: scalar int32, the tokens written so far.
        blocking: an `NgramBlocking`.

    Returns `repeats` bool `[rows, starts]` and `following` int32 `[rows, starts]`, where
    `starts` is the number of earlier n-grams (0 while t < n, or for n = 0).
    """
    # Every index below is within [0, t).
    starts = tf.range(tf.maximum(t - blocking.lag, 0))
    earlier = tf.gather(ids, tf.expand_dims(starts, 1) + blocking.offsets, axis=1)
    latest = tf.gather(ids, tf.maximum(t - blocking.context + blocking.offsets, 0), axis=1)
    same = tf.logical_or(tf.equal(earlier, tf.expand_dims(latest, 1)), blocking.wildcard)
    return tf.reduce_all(same, axis=2), tf.gather(ids, starts + blocking.lag, axis=1)


def _block_repeated_ngrams(log_probs, ids, t, blocking):
    """Forbids each token that would complete an n-gram its hypothesis already holds, as
    fairseq's and CTranslate2's `no_repeat_ngram_size` do: its log-probability becomes
    NEG_INF, the others' stay the model's. For the greedy and sampling searches, which run in
    TensorFlow only; beam search, which ONNX runs too, uses `_best_unblocked` (ONNX Runtime's
    scatter copies all of `log_probs`).

    Args:
        log_probs: float32 `[rows, vocab]`, the next token's.
        ids, t, blocking: as `_repeated_ngram_followers`' (blocking None: nothing forbidden).
    """
    if blocking is None:
        return log_probs
    repeats, following = _repeated_ngram_followers(ids, t, blocking)
    banned = tf.where(repeats)  # int64 [banned, 2]: (row, start)
    banned = tf.stack([banned[:, 0], tf.cast(tf.gather_nd(following, banned), tf.int64)], 1)
    # Every update is NEG_INF, so a token banned twice is no conflict.
    return tf.tensor_scatter_nd_update(log_probs, banned, tf.fill(tf.shape(banned)[:1], NEG_INF))


def _best_unblocked(log_probs, ids, t, blocking, count):
    """Each row's `count` likeliest tokens that complete no repeated n-gram (see
    `_block_repeated_ngrams`; blocked ones, where fewer remain, at NEG_INF), best first:
    `(log_probs, tokens)`, `[rows, count]` each.

    A row bans at most one token per earlier n-gram, so its best `count` unblocked tokens are
    among its best `count + starts`: those are ranked, and the banned ones among them marked by
    comparison. Beam search's steps thus never copy `[rows, vocab]` (ONNX Runtime's scatter
    does, at every step, whether or not blocking is asked).
    """
    if blocking is None:
        return tf.math.top_k(log_probs, k=count)
    vocab = tf.shape(log_probs)[1]
    wider = tf.minimum(count + tf.maximum(t - blocking.lag, 0), vocab)
    best, tokens = tf.math.top_k(log_probs, k=wider)
    repeats, following = _repeated_ngram_followers(ids, t, blocking)
    # A never-matching column: ONNX Runtime mishandles reductions over an empty axis.
    rows = tf.shape(ids)[:1]
    repeats = tf.concat([repeats, tf.zeros(tf.concat([rows, [1]], 0), tf.bool)], 1)
    following = tf.concat([following, tf.fill(tf.concat([rows, [1]], 0), -1)], 1)
    matches = tf.equal(tokens[:, :, None], following[:, None, :])
    banned = tf.reduce_any(tf.logical_and(matches, repeats[:, None, :]), axis=2)
    best, order = tf.math.top_k(tf.where(banned, NEG_INF, best), k=count)
    return best, tf.gather(tokens, order, batch_dims=1)


def _forced_log_prob(model, log_probs, forced, t):
    """The log-probability a forced token (int32 `[rows]`) adds at step `t`: the model's (a
    blocked n-gram included), NEG_INF / 4 at least so that its hypothesis is extended; but 0
    for the language token a `target_language_first` model's target starts with, as
    transformers scores its forced first token."""
    log_prob = tf.maximum(tf.gather(log_probs, forced, batch_dims=1), NEG_INF / 4)
    if model.target_language_first:
        log_prob = tf.where(tf.equal(t, 0), 0.0, log_prob)
    return log_prob


def _force(beam_log_probs, beam_tokens, per_row, forced_log_prob, forced, pad_id):
    """Makes the forced token the only candidate of the rows that have one, after the per-row
    top-k (`beam_log_probs`, `beam_tokens`: `[rows, per_row]`), so that forcing costs no pass
    over the log-probabilities: the row's first candidate becomes it, scoring
    `forced_log_prob`, the others impossible."""
    forcing = tf.expand_dims(tf.not_equal(forced, pad_id), 1)
    only_first = tf.where(tf.equal(tf.range(per_row), 0), 0.0, NEG_INF)
    beam_log_probs = tf.where(
        forcing, tf.expand_dims(forced_log_prob, 1) + only_first, beam_log_probs
    )
    return beam_log_probs, tf.where(forcing, tf.expand_dims(forced, 1), beam_tokens)


def _sequential_search(
    model, source_ids, max_lengths, choose, min_length=0, no_repeat=0, target_prefix=None,
    force_eos=False,
):  # fmt: skip
    """Picks one token per step with `choose(log_probs, t)`, or the sentence's prefix
    token while it has one; a source is finished at </s> or at its limit (where, with
    `force_eos`, its last token is </s>, scored 0)."""
    batch = tf.shape(source_ids)[0]
    limits, width, prefix = _limits_width_and_prefix(
        max_lengths, batch, target_prefix, model.pad_id
    )
    blocking = ngram_blocking(no_repeat)
    encoded = model.encode(source_ids)
    state = model.initial_decoder_state(encoded)
    src_len = tf.shape(source_ids)[1]
    # One column a step, written at the loop's counter and stacked after it: an ONNX Loop's
    # scan outputs, which cost no node a step (a scatter into a full-width buffer costs
    # many). The n-gram blocking reads the tokens so far from a buffer of its own.
    columns = tf.TensorArray(tf.int32, size=0, dynamic_size=True, element_shape=[None])
    attention_columns = tf.TensorArray(
        tf.float32, size=0, dynamic_size=True, element_shape=[None, None]
    )
    history = () if blocking is None else tf.fill([batch, width], model.pad_id)
    finished = tf.zeros([batch], tf.bool)
    scores = tf.zeros([batch], tf.float32)
    tokens = tf.fill([batch], tf.constant(model.bos_id, tf.int32))

    def not_done(t, tokens, state, columns, attention_columns, history, finished, scores):
        # Every source is finished at its limit, within `width`: no step count to compare. "Not
        # all finished" as a minimum: fewer exported nodes a step than `reduce_any` of the
        # negation.
        return tf.equal(tf.reduce_min(tf.cast(finished, tf.int32)), 0)

    def step(t, tokens, state, columns, attention_columns, history, finished, scores):
        logits, state, weights = model.decode_step(tokens, state, encoded, t)
        logits = _suppress_eos(tf.cast(logits, tf.float32), model.eos_id, t, min_length)
        model_log_probs = tf.nn.log_softmax(logits)
        chosen = choose(_block_repeated_ngrams(model_log_probs, history, t, blocking), t)
        chosen_log_prob = tf.gather(model_log_probs, chosen, batch_dims=1)
        if prefix is not None:  # a forced token scores as in beam search
            forced = tf.gather(prefix, t, axis=1)
            forcing = tf.not_equal(forced, model.pad_id)
            chosen = tf.where(forcing, forced, chosen)
            chosen_log_prob = tf.where(
                forcing, _forced_log_prob(model, model_log_probs, forced, t), chosen_log_prob
            )
        if force_eos:
            last = t + 1 >= limits
            chosen = tf.where(last, model.eos_id, chosen)
            chosen_log_prob = tf.where(last, 0.0, chosen_log_prob)
        tokens = tf.where(finished, model.pad_id, chosen)
        scores += tf.where(finished, 0.0, chosen_log_prob)
        columns = columns.write(t, tokens)
        if blocking is not None:
            history = _write_column(history, t, tokens, axis=1)
        if weights is None:
            weights = tf.zeros([batch, src_len], tf.float32)
        weights = tf.where(tf.expand_dims(finished, 1), 0.0, tf.cast(weights, tf.float32))
        attention_columns = attention_columns.write(t, weights)
        next_t = t + 1  # once: an exported loop would compute each `t + 1` apart
        at_limit = next_t >= limits
        finished = tf.logical_or(finished, tf.logical_or(tf.equal(tokens, model.eos_id), at_limit))
        return next_t, tokens, state, columns, attention_columns, history, finished, scores

    loop_vars = (
        tf.constant(0),
        tokens,
        state,
        columns,
        attention_columns,
        history,
        finished,
        scores,
    )
    shapes = tf.nest.map_structure(
        lambda x: x.shape if isinstance(x, tf.Tensor) else tf.TensorShape(None), loop_vars
    )
    shapes = (*shapes[:2], _any_shape(state), *shapes[3:])  # the state may grow
    steps, _, _, columns, attention_columns, _, _, scores = tf.while_loop(
        not_done, step, loop_vars, shape_invariants=shapes
    )
    # [steps, batch, ...] to [batch, width, ...], padded (a reshape gives no steps a shape).
    ids = tf.transpose(tf.reshape(columns.stack(), [steps, batch]))
    ids = tf.pad(ids, [[0, 0], [0, width - steps]], constant_values=model.pad_id)
    attention = tf.reshape(attention_columns.stack(), [steps, batch, src_len])
    attention = tf.pad(tf.transpose(attention, [1, 0, 2]), [[0, 0], [0, width - steps], [0, 0]])
    lengths = tf.reduce_sum(tf.cast(tf.not_equal(ids, model.pad_id), tf.int32), axis=1)
    return ids, lengths, scores, attention


def greedy_search(
    model, source_ids, max_lengths, min_length=0, no_repeat_ngram_size=0, target_prefix=None,
    force_eos=False,
):  # fmt: skip
    """The most probable token at each step, until </s> or the source's limit.

    Args:
        model: a model honouring the decoding contract (see `layers.EncoderDecoderModel`).
        source_ids: int32 `[batch, src_len]`, right-padded.
        max_lengths: int `[batch]` (see `decode_length_limits`) or one int for every source:
            the most tokens each output may have (</s> included).
        min_length: </s> is forbidden before this many tokens.
        no_repeat_ngram_size: no n-gram of this size appears twice in an output (0: off).
        target_prefix: int32 `[batch, len]`, right-padded, or None: each output starts with
            its row's tokens (scored as the model scores them); a limit too short for its
            prefix is raised to hold it and </s>.
        force_eos: an output that reaches its limit ends with </s>, at log-probability 0.

    Returns (`width` is the largest limit):
        ids: int32 `[batch, width]`, each row ending with </s> then padding (or cut at its
            limit); lengths: int32 `[batch]`, tokens up to and including </s>;
        scores: float32 `[batch]`, the sum of the chosen tokens' log-probabilities;
        attention: float32 `[batch, width, src_len]` (zeros for a model without it).
    """

    def argmax(log_probs, t):
        return tf.argmax(log_probs, axis=-1, output_type=tf.int32)

    return _sequential_search(
        model, source_ids, max_lengths, argmax, min_length, no_repeat_ngram_size, target_prefix,
        force_eos,
    )  # fmt: skip


def _filter_logits(logits, top_k, top_p):
    """Keeps the `top_k` most probable tokens (0: all) within cumulative probability `top_p`."""
    vocab = tf.shape(logits)[-1]
    k = tf.where(top_k > 0, tf.minimum(top_k, vocab), vocab)
    sorted_logits = tf.sort(logits, axis=-1, direction="DESCENDING")
    kth_largest = tf.gather(sorted_logits, tf.fill([tf.shape(logits)[0]], k - 1), batch_dims=1)
    cumulative = tf.cumsum(tf.nn.softmax(sorted_logits), axis=-1, exclusive=True)
    # The nucleus: tokens whose more-probable predecessors hold less than top_p (at least one).
    in_nucleus = tf.logical_or(cumulative < top_p, tf.equal(tf.range(vocab), 0))
    smallest_kept = tf.reduce_min(tf.where(in_nucleus, sorted_logits, sorted_logits[:, :1]), -1)
    threshold = tf.maximum(kth_largest, smallest_kept)
    return tf.where(logits < threshold[:, None], NEG_INF, logits)


def sentence_seeds(source_ids, pad_id, seed):
    """int64 `[batch, 2]`: a random seed for each source, from `seed` and the source's ids
    (padding aside), so that a sentence's sample does not depend on where it sits in a batch,
    nor on its batch-mates."""
    pieces = tf.RaggedTensor.from_tensor(source_ids, padding=pad_id)
    text = tf.strings.reduce_join(tf.strings.as_string(pieces), axis=1, separator=" ")
    keys = tf.strings.to_hash_bucket_fast(text, 2**31 - 1)
    seed = tf.cast(tf.convert_to_tensor(seed), tf.int64)
    return tf.map_fn(
        lambda key: tf.random.experimental.stateless_fold_in(seed, key),
        keys,
        fn_output_signature=tf.TensorSpec([2], tf.int64),
    )


def sampling_search(
    model, source_ids, max_lengths, temperature=1.0, top_k=0, top_p=1.0, seed=(0, 0),
    min_length=0, no_repeat_ngram_size=0, target_prefix=None, force_eos=False,
):  # fmt: skip
    """Draws each token from the model's distribution, sharpened or flattened by `temperature`
    and restricted to the `top_k` tokens and the `top_p` nucleus. A sentence's draws come from
    its own seed (`sentence_seeds`): the same `seed` and sentence give the same output, alone
    or in any batch. Returns what `greedy_search` returns; scores are the untempered
    log-probabilities."""
    seeds = sentence_seeds(source_ids, model.pad_id, seed)

    def draw(log_probs, t):
        filtered = _filter_logits(log_probs / temperature, top_k, top_p)

        def draw_one(row_and_seed):
            row, row_seed = row_and_seed
            step_seed = tf.random.experimental.stateless_fold_in(row_seed, t)
            return tf.random.stateless_categorical(row[None], 1, step_seed, dtype=tf.int32)[0, 0]

        return tf.map_fn(draw_one, (filtered, seeds), fn_output_signature=tf.int32)

    return _sequential_search(
        model, source_ids, max_lengths, draw, min_length, no_repeat_ngram_size, target_prefix,
        force_eos,
    )  # fmt: skip


def blank_empty_sources(source_ids, pad_id, ids, lengths, scores, attention):
    """n-best outputs (`[batch, n, ...]`) with nothing for the sources that are all padding:
    an empty input translates to an empty output (ids all `pad_id`, length 0, score 0)."""
    empty = tf.reduce_all(tf.equal(source_ids, pad_id), axis=1)

    def blank(x, value):
        where = tf.reshape(empty, [-1] + [1] * (len(x.shape) - 1))
        return tf.where(where, tf.cast(value, x.dtype), x)

    return blank(ids, pad_id), blank(lengths, 0), blank(scores, 0), blank(attention, 0)


def length_penalty(lengths, alpha, kind="gnmt"):
    """The divisor of a hypothesis' log-probability: |Y|^alpha ("average") or the GNMT
    ((5 + |Y|) / 6)^alpha (Wu et al., 2016). alpha = 0 leaves scores unnormalised."""
    lengths = tf.cast(lengths, tf.float32)
    if kind == "average":
        return tf.pow(lengths, alpha)
    if kind == "gnmt":
        return tf.pow((5.0 + lengths) / 6.0, alpha)
    raise ValueError(f"length penalty must be 'average' or 'gnmt', got {kind!r}")


def coverage_penalty(coverage, source_mask, beta):
    """GNMT's beta * sum_i log(min(sum_j a_ij, 1)) over the real source positions i."""
    covered = tf.math.log(tf.clip_by_value(coverage, 1e-10, 1.0))
    return beta * tf.reduce_sum(tf.where(source_mask, covered, 0.0), axis=-1)


# Beam search. Below, n is the number of sources still searched (the batch at the start:
# finished sources leave), k the beam size, width the longest limit of the batch.


class Ranking(NamedTuple):
    """How finished hypotheses are scored, log P(Y|X) / length_penalty(|Y|) + coverage, and
    when a source's search stops (`_is_done`)."""

    alpha: Any  # float32 []: the length penalty's exponent
    penalty: str  # "gnmt" or "average" (see `length_penalty`)
    beta: Any  # float32 []: the coverage penalty's weight
    stopping: str = "k_finished"  # one of search_options.BEAM_STOPPING
    capped: str = "fill"  # one of search_options.CAPPED_HYPOTHESES (see `_n_best`)

    def score(self, log_probs, length, coverage, source_mask):
        normalised = log_probs / length_penalty(length, self.alpha, self.penalty)
        return normalised + coverage_penalty(coverage, source_mask, self.beta)


class Sources(NamedTuple):
    """The sources still searched, one row each; constant between two departures."""

    index: tf.Tensor  # int32 [n]: the source's row in the caller's batch
    limit: tf.Tensor  # int32 [n]: the most tokens its hypotheses may have
    mask: tf.Tensor  # bool [n, 1, src_len]: its real (non-padding) positions
    # int32 [n, k, width]: the tokens each of its hypotheses starts with, then padding; or ()
    # for none (an empty nest: loops carry it, where they cannot carry None).
    prefix: Any
    encoded: Any  # the model's encoding: a nest of [n, ...] tensors, shared by the k beams


class Alive(NamedTuple):
    """Each source's k best hypotheses that have not ended, all t tokens long."""

    ids: tf.Tensor  # int32 [n, k, width]: the tokens so far, then pad_id
    log_probs: tf.Tensor  # float32 [n, k]: log P(y_1..y_t | X); NEG_INF: an empty place
    attention: tf.Tensor  # float32 [n, k, width, src_len]: each step's weights so far
    coverage: tf.Tensor  # float32 [n, k, src_len]: the weights summed over the steps


class Finished(NamedTuple):
    """Each source's k best hypotheses that ended with </s>, best first."""

    ids: tf.Tensor  # int32 [n, k, width]: </s> included, then pad_id
    scores: tf.Tensor  # float32 [n, k]: the ranking score; NEG_INF: an empty place
    attention: tf.Tensor  # float32 [n, k, width, src_len]


class BeamState(NamedTuple):
    """What a step changes."""

    t: tf.Tensor  # int32 []: the tokens each alive hypothesis has
    tokens: tf.Tensor  # int32 [n * k]: the last token of each alive hypothesis (source-major)
    decoder: Any  # the model's decoder state: a nest of [n * k, ...] tensors
    alive: Alive
    finished: Finished


class Candidates(NamedTuple):
    """The 2k best one-token extensions of each source's alive hypotheses, best first."""

    ids: tf.Tensor  # int32 [n, 2k, width]: with the new token at position t
    log_probs: tf.Tensor  # float32 [n, 2k]: log P(y_1..y_t+1 | X)
    tokens: tf.Tensor  # int32 [n, 2k]: the new token
    origin: tf.Tensor  # int32 [n, 2k]: the alive hypothesis (beam) it extends
    coverage: tf.Tensor  # float32 [n, 2k, src_len]: its origin's, this step included
    ends: tf.Tensor  # bool [n, 2k]: the new token is </s> (and the candidate real)


class NBest(NamedTuple):
    """The search's result for each source of the caller's batch, best first."""

    ids: tf.Tensor  # int32 [batch, n_best, width]
    scores: tf.Tensor  # float32 [batch, n_best]: the ranking score
    attention: tf.Tensor  # float32 [batch, n_best, width, src_len]


def _gather_rows(tree, rows):
    return tf.nest.map_structure(lambda x: tf.gather(x, rows), tree)


def _hypothesis_rows(sources, beam_size):
    """The `[n * k]` rows (of `tokens` and `decoder`) of the hypotheses of `sources`."""
    return tf.reshape(sources[:, None] * beam_size + tf.range(beam_size)[None, :], [-1])


def _initial_state(model, source_ids, limits, width, beam_size, prefix):
    """Every source in the batch, each with one alive hypothesis (<s>) and nothing finished."""
    batch, src_len = tf.shape(source_ids)[0], tf.shape(source_ids)[1]
    pad = tf.constant(model.pad_id, tf.int32)
    encoded = model.encode(source_ids)
    sources = Sources(
        index=tf.range(batch),
        limit=limits,
        mask=tf.not_equal(source_ids, model.pad_id)[:, None, :],
        prefix=() if prefix is None else tf.tile(prefix[:, None, :], [1, beam_size, 1]),
        encoded=encoded,
    )
    # Each hypothesis has its own copy of the decoder state: a gather, as a repeat converts to
    # an ONNX Reshape that misreads an empty axis (a cache of no positions) as "keep this one".
    decoder = _gather_rows(
        model.initial_decoder_state(encoded), tf.repeat(tf.range(batch), beam_size)
    )
    # Only the first beam is live at the start, or the k beams would be k copies.
    first_beam = tf.equal(tf.range(beam_size), 0)
    alive = Alive(
        ids=tf.fill([batch, beam_size, width], pad),
        log_probs=tf.tile(tf.where(first_beam, 0.0, NEG_INF)[None], [batch, 1]),
        attention=tf.zeros([batch, beam_size, width, src_len]),
        coverage=tf.zeros([batch, beam_size, src_len]),
    )
    finished = Finished(
        ids=tf.fill([batch, beam_size, width], pad),
        scores=tf.fill([batch, beam_size], NEG_INF),
        attention=tf.zeros([batch, beam_size, width, src_len]),
    )
    tokens = tf.fill([batch * beam_size], tf.constant(model.bos_id, tf.int32))
    return BeamState(tf.constant(0), tokens, decoder, alive, finished), sources


def _force_eos_at_limit(beam_log_probs, beam_tokens, per_row, sources, t, beam_size, eos_id):
    """Makes </s>, at log-probability 0, the only candidate of the hypotheses whose next token
    is the last their source's limit allows (as transformers' forced_eos_token_id does); a
    pass over the `[n * k, per_row]` candidates, not over the vocabulary."""
    n = tf.shape(sources.limit)[0]
    last = tf.broadcast_to(tf.expand_dims(t + 1 >= sources.limit, 1), [n, beam_size])
    last = tf.reshape(last, [-1, 1])
    only_first = tf.where(tf.equal(tf.range(per_row), 0), 0.0, NEG_INF)
    return (
        tf.where(last, only_first[None, :], beam_log_probs),
        tf.where(last, eos_id, beam_tokens),
    )


def _expand(model, state, sources, beam_size, min_length, blocking, force_eos):
    """Runs the decoder one step and ranks the extensions of every alive hypothesis.

    Returns the 2k best candidates of each source, the alive hypotheses with this step's
    attention written in (a candidate's attention is its origin's: it is gathered only for
    the hypotheses kept, never materialised for all 2k), and the decoder's new state.
    """
    n = tf.shape(sources.index)[0]
    t, alive = state.t, state.alive
    logits, decoder, weights = model.decode_step(state.tokens, state.decoder, sources.encoded, t)
    logits = _suppress_eos(tf.cast(logits, tf.float32), model.eos_id, t, min_length)
    # One LogSoftmax kernel in ONNX Runtime (a logsumexp is five passes over [rows, vocab]).
    step_log_probs = tf.nn.log_softmax(logits)
    # A source's best 2k candidates are among each beam's 2k likeliest tokens: rank those
    # alone rather than [n, k * vocab] totals.
    per_beam = tf.minimum(2 * beam_size, model.target_vocab_size)
    beam_log_probs, beam_tokens = _best_unblocked(
        step_log_probs, tf.reshape(alive.ids, [n * beam_size, -1]), t, blocking, per_beam
    )
    if isinstance(sources.prefix, tf.Tensor):
        forced = tf.reshape(tf.gather(sources.prefix, t, axis=2), [-1])
        forced_log_prob = _forced_log_prob(model, step_log_probs, forced, t)
        beam_log_probs, beam_tokens = _force(
            beam_log_probs, beam_tokens, per_beam, forced_log_prob, forced, model.pad_id
        )
    if force_eos:
        beam_log_probs, beam_tokens = _force_eos_at_limit(
            beam_log_probs, beam_tokens, per_beam, sources, t, beam_size, model.eos_id
        )
    beam_log_probs = tf.reshape(beam_log_probs, [n, beam_size, per_beam])
    totals = tf.reshape(alive.log_probs[:, :, None] + beam_log_probs, [n, -1])
    log_probs, best = tf.math.top_k(totals, k=2 * beam_size)
    origin = best // per_beam
    tokens = tf.gather(tf.reshape(beam_tokens, [n, -1]), best, batch_dims=1)
    ids = _write_column(tf.gather(alive.ids, origin, batch_dims=1), t, tokens, axis=2)
    if weights is not None:
        step_weights = tf.reshape(tf.cast(weights, tf.float32), [n, beam_size, -1])
        alive = alive._replace(
            attention=_write_column(alive.attention, t, step_weights, axis=2),
            coverage=alive.coverage + step_weights,
        )
    ends = tf.logical_and(tf.equal(tokens, model.eos_id), log_probs > NEG_INF / 2)
    coverage = tf.gather(alive.coverage, origin, batch_dims=1)
    return Candidates(ids, log_probs, tokens, origin, coverage, ends), alive, decoder


def _save_finished(finished, candidates, alive, t, sources, beam_size, ranking):
    """Adds the candidates among the best k that end with </s> to the finished hypotheses,
    scored for ranking, and keeps the best k: a finished hypothesis is saved, not expanded
    (as in Tensor2Tensor's beam search)."""
    in_top_k = tf.range(2 * beam_size) < beam_size
    scores = ranking.score(candidates.log_probs, t + 1, candidates.coverage, sources.mask)
    new = tf.where(tf.logical_and(candidates.ends, in_top_k), scores, NEG_INF)
    scores, best = tf.math.top_k(tf.concat([finished.scores, new], axis=1), k=beam_size)
    # Place k + j of the pool is candidate j, whose attention is alive row origin[j]'s.
    candidate = tf.maximum(best - beam_size, 0)
    attention_rows = tf.where(
        best < beam_size, best, beam_size + tf.gather(candidates.origin, candidate, batch_dims=1)
    )
    return Finished(
        ids=tf.gather(tf.concat([finished.ids, candidates.ids], 1), best, batch_dims=1),
        scores=scores,
        attention=tf.gather(
            tf.concat([finished.attention, alive.attention], 1), attention_rows, batch_dims=1
        ),
    )


def _keep_alive(candidates, alive, decoder, beam_size):
    """The k best candidates that do not end, with their tokens and reordered decoder state."""
    log_probs, keep = tf.math.top_k(
        tf.where(candidates.ends, NEG_INF, candidates.log_probs), k=beam_size
    )
    parents = tf.gather(candidates.origin, keep, batch_dims=1)
    alive = Alive(
        ids=tf.gather(candidates.ids, keep, batch_dims=1),
        log_probs=log_probs,
        attention=tf.gather(alive.attention, parents, batch_dims=1),
        coverage=tf.gather(candidates.coverage, keep, batch_dims=1),
    )
    n = tf.shape(parents)[0]
    decoder = _gather_rows(decoder, tf.reshape(parents + tf.range(n)[:, None] * beam_size, [-1]))
    tokens = tf.reshape(tf.gather(candidates.tokens, keep, batch_dims=1), [-1])
    return alive, tokens, decoder


def _step(model, state, sources, beam_size, min_length, blocking, ranking, force_eos):
    candidates, alive, decoder = _expand(
        model, state, sources, beam_size, min_length, blocking, force_eos
    )
    finished = _save_finished(
        state.finished, candidates, alive, state.t, sources, beam_size, ranking
    )
    alive, tokens, decoder = _keep_alive(candidates, alive, decoder, beam_size)
    return BeamState(state.t + 1, tokens, decoder, alive, finished)


def _is_done(state, sources, ranking):
    """bool `[n]`: the source's hypotheses are at its limit (where alive hypotheses stand in
    for missing finished ones, as if they had ended), or it has k finished hypotheses and, by
    `ranking.stopping`: nothing more (k_finished); its best alive hypothesis, scored at its
    length so far, ranks no higher than the worst finished one (no_improvement); or that,
    scored at the source's limit where the length penalty rewards length (never). The last
    two are transformers' `early_stopping` false and "never"."""
    has_k = tf.reduce_all(state.finished.scores > NEG_INF / 2, axis=1)
    at_limit = state.t >= sources.limit
    if ranking.stopping == "k_finished":
        return tf.logical_or(has_k, at_limit)
    length = tf.fill(tf.shape(sources.limit), tf.maximum(state.t, 1))
    if ranking.stopping == "never":
        length = tf.where(ranking.alpha > 0, sources.limit, length)
    best_alive = ranking.score(
        state.alive.log_probs[:, 0], length, state.alive.coverage[:, 0], sources.mask[:, 0]
    )
    cannot_improve = best_alive <= tf.reduce_min(state.finished.scores, axis=1)
    return tf.logical_or(tf.logical_and(has_k, cannot_improve), at_limit)


def _n_best(state, sources, n_best, ranking, rows):
    """The `n_best` best hypotheses of the sources `rows` (int32 `[m]`): the finished ones;
    for a source cut at its limit, its alive ones too, each scored as if it ended there (at
    length t), by `ranking.capped`: "fill", the places still empty after the finished ones;
    "rank", ranked with them by score, as transformers' beam search finishes every beam that
    reaches max_length. Ranked over every source of the batch and then gathered: no
    reduction runs over an empty batch (ONNX Runtime gets some of those wrong)."""
    alive, finished = state.alive, state.finished
    alive_scores = ranking.score(alive.log_probs, state.t, alive.coverage, sources.mask)
    if ranking.capped == "rank":
        at_limit = (state.t >= sources.limit)[:, None]
        pool = tf.concat([finished.scores, tf.where(at_limit, alive_scores, NEG_INF)], 1)
        scores, pool_index = tf.math.top_k(pool, k=n_best)
    else:
        beam_size = tf.shape(finished.scores)[1]
        alive_scores, alive_order = tf.math.top_k(alive_scores, k=beam_size)
        n_finished = tf.reduce_sum(
            tf.cast(finished.scores > NEG_INF / 2, tf.int32), axis=1, keepdims=True
        )
        place = tf.range(n_best)[None, :]
        pool_index = tf.where(place < n_finished, place, beam_size + place - n_finished)
        scores = tf.gather(tf.concat([finished.scores, alive_scores], 1), pool_index, batch_dims=1)
        # The alive rows in score order, where the finished ones' places point past them.
        pool_index = tf.where(
            pool_index < beam_size,
            pool_index,
            beam_size + tf.gather(alive_order, tf.maximum(pool_index - beam_size, 0), batch_dims=1),
        )
    pool_index = tf.gather(pool_index, rows)

    def pick(finished_values, alive_values):
        pool = tf.concat([tf.gather(finished_values, rows), tf.gather(alive_values, rows)], 1)
        return tf.gather(pool, pool_index, batch_dims=1)

    return NBest(
        ids=pick(finished.ids, alive.ids),
        scores=tf.gather(scores, rows),
        attention=pick(finished.attention, alive.attention),
    )


def _record(results, index, n_best):
    """`results` with the rows `index` (the caller's, int32 `[m]`) set to `n_best`."""
    at = index[:, None]
    return NBest(*(tf.tensor_scatter_nd_update(r, at, v) for r, v in zip(results, n_best)))


def _retire(state, sources, results, n_best, ranking, beam_size):
    """Records the n-best of the sources that are done and drops their rows from the batch,
    so that later steps spend nothing on them. Called with at least one source not done:
    the batch never empties (ONNX Runtime mishandles some reductions of empty tensors)."""
    done = _is_done(state, sources, ranking)
    leaving = tf.cast(tf.where(done)[:, 0], tf.int32)
    staying = tf.cast(tf.where(tf.logical_not(done))[:, 0], tf.int32)
    departing = _n_best(state, sources, n_best, ranking, leaving)
    results = _record(results, tf.gather(sources.index, leaving), departing)
    rows = _hypothesis_rows(staying, beam_size)
    state = state._replace(
        tokens=tf.gather(state.tokens, rows),
        decoder=_gather_rows(state.decoder, rows),
        alive=_gather_rows(state.alive, staying),
        finished=_gather_rows(state.finished, staying),
    )
    return state, _gather_rows(sources, staying), results


def _any_shape(tree):
    return tf.nest.map_structure(lambda x: tf.TensorShape([None] * x.shape.rank), tree)


def beam_search(model, source_ids, max_lengths, beam_size=5, n_best=1, alpha=0.0,
                penalty="gnmt", beta=0.0, min_length=0, no_repeat_ngram_size=0,
                target_prefix=None, stopping="k_finished", force_eos=False,
                capped="fill"):  # fmt: skip
    """Batched beam search with length normalisation and coverage penalty (Wu et al., 2016,
    "Google's Neural Machine Translation System", section 7), keeping finished and alive
    hypotheses apart as in Tensor2Tensor (Vaswani et al., 2018).

    At each step every alive hypothesis is extended by every token; of the best 2k candidates,
    those among the top k that end in </s> are finished (saved, and not expanded), and the
    best k that do not end stay alive. A source is done once it has k finished hypotheses or
    its hypotheses reach its limit, where its best alive ones fill the places still empty
    (or, with `capped="rank"`, rank with the finished ones); its results are set aside and
    its rows leave the batch. Hypotheses are ranked by log P(Y|X) / length_penalty(|Y|) +
    coverage_penalty, and the best `n_best` returned.

    Steps run in an inner loop until some source is done, and an outer loop retires the done
    sources: no per-step branch, and a batch that shrinks as its sources finish.

    Args:
        model: a model honouring the decoding contract (see `layers.EncoderDecoderModel`).
        source_ids: int32 `[batch, src_len]`, right-padded.
        max_lengths: int `[batch]` (see `decode_length_limits`) or one int for every source:
            the most tokens per hypothesis (</s> included).
        beam_size: k, hypotheses kept alive per sentence. 1 gives the greedy output.
        n_best: hypotheses returned per sentence (at most `beam_size`).
        alpha, penalty: the length penalty (see `length_penalty`).
        beta: the weight of the coverage penalty (0 for none).
        min_length: </s> is forbidden before this many tokens.
        no_repeat_ngram_size: no n-gram of this size appears twice in an output (0: off).
        target_prefix: int32 `[batch, len]`, right-padded, or None: each output starts with
            its row's tokens (scored as the model scores them); a limit too short for its
            prefix is raised to hold it and </s>.
        stopping, force_eos: when a source is done before its limit (`_is_done`); </s> ends
            a hypothesis at its limit, at log-probability 0.
        capped: how the hypotheses a source's limit cuts join its finished ones (`_n_best`).

    Returns (`width` is the largest limit):
        ids: int32 `[batch, n_best, width]`, best first; lengths: int32 `[batch, n_best]`
        (</s> included); scores: float32 `[batch, n_best]` (the ranking score);
        attention: float32 `[batch, n_best, width, src_len]`.
    """
    source_ids = tf.convert_to_tensor(source_ids, tf.int32)
    beam_size = tf.convert_to_tensor(beam_size, tf.int32)
    n_best = tf.minimum(tf.convert_to_tensor(n_best, tf.int32), beam_size)
    alpha, beta = (tf.convert_to_tensor(x, tf.float32) for x in (alpha, beta))
    ranking = Ranking(alpha, penalty, beta, stopping, capped)
    batch, src_len = tf.shape(source_ids)[0], tf.shape(source_ids)[1]
    limits, width, prefix = _limits_width_and_prefix(
        max_lengths, batch, target_prefix, model.pad_id
    )
    blocking = ngram_blocking(no_repeat_ngram_size)
    state, sources = _initial_state(model, source_ids, limits, width, beam_size, prefix)
    results = NBest(
        ids=tf.fill([batch, n_best, width], tf.constant(model.pad_id, tf.int32)),
        scores=tf.zeros([batch, n_best]),
        attention=tf.zeros([batch, n_best, width, src_len]),
    )

    def decode_until_one_is_done(state, sources, results):
        state, sources, results = _retire(state, sources, results, n_best, ranking, beam_size)
        # The sources are constants of the inner loop: its ONNX Loop carries only the state.
        state = tf.while_loop(
            lambda state: tf.logical_not(tf.reduce_any(_is_done(state, sources, ranking))),
            lambda state: (
                _step(model, state, sources, beam_size, min_length, blocking, ranking, force_eos),
            ),
            (state,),
            shape_invariants=(_any_shape(state),),
        )[0]
        return state, sources, results

    # Beam and batch sizes may be constants or tensors, and sources leave the batch: every
    # dimension may vary but the encoding's feature sizes (which its consumers may need).
    state_shapes, source_shapes, result_shapes = _any_shape((state, sources, results))
    source_shapes = source_shapes._replace(
        encoded=tf.nest.map_structure(
            lambda x: tf.TensorShape([None] + x.shape[1:]), sources.encoded
        )
    )
    state, sources, results = tf.while_loop(
        lambda state, sources, _: tf.logical_not(tf.reduce_all(_is_done(state, sources, ranking))),
        decode_until_one_is_done,
        (state, sources, results),
        shape_invariants=(state_shapes, source_shapes, result_shapes),
    )
    # The sources still in the batch are done too.
    remaining = _n_best(state, sources, n_best, ranking, tf.range(tf.shape(sources.index)[0]))
    results = _record(results, sources.index, remaining)
    lengths = tf.reduce_sum(tf.cast(tf.not_equal(results.ids, model.pad_id), tf.int32), axis=2)
    return results.ids, lengths, results.scores, results.attention


def search(model, source_ids, options, target_prefix=None):
    """The one entry point of every caller: each source's length limit, then the search that
    `options` (`search_options.SearchOptions`) asks for, then nothing for the empty
    sources. A beam size given as a tensor (a graph input) takes the beam search, which covers
    1; sampling and the greedy search need Python options.

    Returns the n-best outputs of `beam_search` (`[batch, n, ...]`; n is 1 for the greedy and
    sampling searches)."""
    o = options
    if model.target_language_first and target_prefix is None:
        raise ValueError("this model's targets start with their language's token: give it as "
                         "the target prefix")  # fmt: skip
    limits = decode_length_limits(
        source_ids, model.pad_id, o.max_length_ratio, o.max_length_offset, o.max_length_cap,
        o.max_length,
    )  # fmt: skip
    if o.sampling_temperature is not None:
        best = sampling_search(
            model, source_ids, limits, o.sampling_temperature, o.sampling_topk, o.sampling_topp,
            seed=(o.seed, 0), min_length=o.min_length,
            no_repeat_ngram_size=o.no_repeat_ngram_size, target_prefix=target_prefix,
            force_eos=o.force_eos_at_limit,
        )  # fmt: skip
    elif isinstance(o.beam_size, int) and o.beam_size == 1 and o.n_best == 1:
        best = greedy_search(
            model, source_ids, limits, o.min_length, o.no_repeat_ngram_size, target_prefix,
            o.force_eos_at_limit,
        )  # fmt: skip
    else:
        best = None
        outputs = beam_search(
            model, source_ids, limits, o.beam_size, o.n_best, o.length_penalty,
            o.length_penalty_type, o.coverage_penalty, o.min_length, o.no_repeat_ngram_size,
            target_prefix, o.beam_stopping, o.force_eos_at_limit, o.capped_hypotheses,
        )  # fmt: skip
    if best is not None:
        outputs = [x[:, None] for x in best]  # one hypothesis per sentence
    if model.target_language_first:
        outputs = _without_language_token(*outputs, model.pad_id)
    return blank_empty_sources(source_ids, model.pad_id, *outputs)


def _without_language_token(ids, lengths, scores, attention, pad_id):
    """The outputs less their first column: the target language token that a
    `target_language_first` model's hypotheses start with (counted in their lengths while they
    were ranked, as transformers counts its forced first token)."""
    ids, attention = ids[:, :, 1:], attention[:, :, 1:]
    lengths = tf.reduce_sum(tf.cast(tf.not_equal(ids, pad_id), tf.int32), axis=2)
    return ids, lengths, scores, attention
