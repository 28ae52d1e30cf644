"""Decoding search over the model's step function, as graph-friendly TensorFlow loops.

Search depends only on the `EncoderDecoderModel` decoding contract (`encode`,
`initial_decoder_state`, `decode_step`, and the `pad_id`/`bos_id`/`eos_id`/`target_vocab_size`
attributes), never on a model's internals. Loops run over fixed-shape buffers (`[batch, beam,
max_length]`), reorder beams with `tf.gather(..., batch_dims=1)`, stop early once every
hypothesis has finished (beam search also drops each finished source from the batch), and
avoid TensorArrays and integer one-hot ops, so that the same code converts to ONNX. Beam size,
number of hypotheses, penalties and lengths may be tensors: changing them needs no retracing.
"""

import tensorflow as tf

from layers.step_buffers import write_column

NEG_INF = -1e9  # a finite "impossible" score: -inf would turn into NaN in sums and products


def max_decode_length(source_lengths, ratio, offset, cap):
    """Longest output allowed for a batch: ratio * longest source + offset, within [1, cap].

    An empty batch gets 1, so that its output buffers still have a valid shape.
    """
    longest = tf.reduce_max(tf.concat([tf.reshape(source_lengths, [-1]), [0]], axis=0))
    limit = tf.cast(tf.math.ceil(ratio * tf.cast(longest, tf.float32)), tf.int32) + offset
    return tf.clip_by_value(limit, 1, cap)


def _suppress_eos(log_probs, eos_id, t, min_length):
    """Forbids </s> before `min_length` tokens."""
    if isinstance(min_length, int) and min_length == 0:
        return log_probs  # nothing to forbid: spare a pass over [batch, vocab] at each step
    is_eos = tf.equal(tf.range(tf.shape(log_probs)[-1]), eos_id)
    # A [vocab] bias, broadcast in one addition (a select would be a pass over [batch, vocab]).
    return log_probs + tf.where(tf.logical_and(is_eos, t < min_length), NEG_INF, 0.0)


def _sequential_search(model, source_ids, max_length, choose, min_length=0):
    """Picks one token per step with `choose(log_probs, logits, t)` until </s> or max_length."""
    batch = tf.shape(source_ids)[0]
    encoded = model.encode(source_ids)
    state = model.initial_decoder_state(encoded, max_length)
    ids = tf.fill([batch, max_length], tf.constant(model.pad_id, tf.int32))
    attention = tf.zeros([batch, max_length, tf.shape(source_ids)[1]], tf.float32)
    finished = tf.zeros([batch], tf.bool)
    scores = tf.zeros([batch], tf.float32)
    tokens = tf.fill([batch], tf.constant(model.bos_id, tf.int32))

    def not_done(t, tokens, state, ids, attention, finished, scores):
        return tf.logical_and(t < max_length, tf.logical_not(tf.reduce_all(finished)))

    def step(t, tokens, state, ids, attention, finished, scores):
        logits, state, weights = model.decode_step(tokens, state, encoded, t)
        logits = _suppress_eos(tf.cast(logits, tf.float32), model.eos_id, t, min_length)
        log_probs = tf.nn.log_softmax(logits)
        chosen = choose(log_probs, logits, t)
        tokens = tf.where(finished, model.pad_id, chosen)
        chosen_log_prob = tf.gather(log_probs, chosen, batch_dims=1)
        scores += tf.where(finished, 0.0, chosen_log_prob)
        ids = write_column(ids, t, tokens, axis=1)
        if weights is not None:
            weights = tf.where(finished[:, None], 0.0, tf.cast(weights, tf.float32))
            attention = write_column(attention, t, weights, axis=1)
        finished = tf.logical_or(finished, tf.equal(tokens, model.eos_id))
        return t + 1, tokens, state, ids, attention, finished, scores

    _, _, _, ids, attention, _, scores = tf.while_loop(
        not_done, step, (tf.constant(0), tokens, state, ids, attention, finished, scores)
    )
    lengths = tf.reduce_sum(tf.cast(tf.not_equal(ids, model.pad_id), tf.int32), axis=1)
    return ids, lengths, scores, attention


def greedy_search(model, source_ids, max_length, min_length=0):
    """The most probable token at each step, until </s> or `max_length` tokens.

    Args:
        model: a model honouring the decoding contract (see `layers.EncoderDecoderModel`).
        source_ids: int32 `[batch, src_len]`, right-padded.
        max_length: scalar int, the most tokens to produce (</s> included).
        min_length: </s> is forbidden before this many tokens.

    Returns:
        ids: int32 `[batch, max_length]`, each row ending with </s> then padding (or cut at
            `max_length`); lengths: int32 `[batch]`, tokens up to and including </s>;
        scores: float32 `[batch]`, the sum of the chosen tokens' log-probabilities;
        attention: float32 `[batch, max_length, src_len]` (zeros for a model without it).
    """

    def argmax(log_probs, logits, t):
        return tf.argmax(log_probs, axis=-1, output_type=tf.int32)

    return _sequential_search(model, source_ids, max_length, argmax, min_length)


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


def sampling_search(
    model, source_ids, max_length, temperature=1.0, top_k=0, top_p=1.0, seed=(0, 0), min_length=0
):
    """Draws each token from the model's distribution, sharpened or flattened by `temperature`
    and restricted to the `top_k` tokens and the `top_p` nucleus. The same `seed` gives the same
    output. Returns what `greedy_search` returns; scores are the untempered log-probabilities.
    """
    seed = tf.cast(tf.convert_to_tensor(seed), tf.int32)

    def draw(log_probs, logits, t):
        filtered = _filter_logits(logits / temperature, top_k, top_p)
        step_seed = seed + tf.stack([t, 0])
        sample = tf.random.stateless_categorical(filtered, 1, step_seed, dtype=tf.int32)
        return sample[:, 0]

    return _sequential_search(model, source_ids, max_length, draw, min_length)


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


def _hypothesis_rows(sources, beam_size):
    """The flat `[batch * k]` rows of the hypotheses of `sources` (int32 `[n]`), in order."""
    return tf.reshape(sources[:, None] * beam_size + tf.range(beam_size)[None, :], [-1])


def _gather_rows(tree, rows):
    return tf.nest.map_structure(lambda x: tf.gather(x, rows), tree)


def _best_hypotheses(alive, saved, t, n_best, alpha, penalty, beta, source_mask):
    """The `n_best` ranked hypotheses of each source: the saved ones, then, for a source cut at
    `t` = max_length with fewer than k saved, its best alive ones. Returns ids, scores and
    attention, best first."""
    beam_size = tf.shape(saved["scores"])[1]
    alive_final = alive["scores"] / length_penalty(t, alpha, penalty)
    alive_final += coverage_penalty(alive["coverage"], source_mask, beta)
    alive_final, alive_order = tf.math.top_k(alive_final, k=beam_size)
    n_saved = tf.reduce_sum(tf.cast(saved["scores"] > NEG_INF / 2, tf.int32), axis=1, keepdims=True)
    place = tf.range(n_best)[None, :]
    source = tf.where(place < n_saved, place, beam_size + place - n_saved)

    def pick(saved_values, alive_values):
        pool = tf.concat([saved_values, tf.gather(alive_values, alive_order, batch_dims=1)], 1)
        return tf.gather(pool, source, batch_dims=1)

    scores = tf.gather(tf.concat([saved["scores"], alive_final], 1), source, batch_dims=1)
    return pick(saved["ids"], alive["ids"]), scores, pick(saved["attention"], alive["attention"])


def _any_shape(tree):
    return tf.nest.map_structure(lambda x: tf.TensorShape([None] * x.shape.rank), tree)


def _finished(saved):
    """Whether each source has its k hypotheses saved: `[n]` from saved scores `[n, k]`."""
    return tf.reduce_all(saved["scores"] > NEG_INF / 2, axis=1)


def beam_search(
    model,
    source_ids,
    max_length,
    beam_size=5,
    n_best=1,
    alpha=0.0,
    penalty="gnmt",
    beta=0.0,
    min_length=0,
):
    """Batched beam search with length normalisation (the seeds' 004 algorithm).

    At each step every alive hypothesis is extended by every token; of the best 2k candidates,
    those among the top k that end in </s> are saved and not expanded, and the best k that do
    not end in </s> stay alive. A source is done once k hypotheses have been saved for it (the
    best k are kept): its results are set aside and its rows leave the batch, so that later
    steps spend nothing on it. Search stops when every source is done, or at `max_length`,
    where alive hypotheses fill any places still empty. Saved hypotheses are ranked by
    log P(Y|X) / length_penalty(|Y|) + coverage_penalty, and the best `n_best` returned.

    Args:
        model: a model honouring the decoding contract (see `layers.EncoderDecoderModel`).
        source_ids: int32 `[batch, src_len]`, right-padded.
        max_length: most tokens per hypothesis (</s> included).
        beam_size: k, hypotheses kept alive per sentence. 1 gives the greedy output.
        n_best: hypotheses returned per sentence (at most `beam_size`).
        alpha, penalty: the length penalty (see `length_penalty`).
        beta: the weight of the coverage penalty (0 for none).
        min_length: </s> is forbidden before this many tokens.

    Returns:
        ids: int32 `[batch, n_best, max_length]`, best first; lengths: int32 `[batch, n_best]`
        (</s> included); scores: float32 `[batch, n_best]` (the ranking score);
        attention: float32 `[batch, n_best, max_length, src_len]`.
    """
    source_ids = tf.convert_to_tensor(source_ids, tf.int32)
    beam_size = tf.convert_to_tensor(beam_size, tf.int32)
    n_best = tf.minimum(tf.convert_to_tensor(n_best, tf.int32), beam_size)
    alpha = tf.convert_to_tensor(alpha, tf.float32)
    beta = tf.convert_to_tensor(beta, tf.float32)
    batch, src_len = tf.shape(source_ids)[0], tf.shape(source_ids)[1]
    vocab = model.target_vocab_size
    pad = tf.constant(model.pad_id, tf.int32)

    encoded = model.encode(source_ids)
    # Hypotheses get their own copy of the state; the encoded source is shared by its beams.
    initial_state = model.initial_decoder_state(encoded, max_length)
    state = tf.nest.map_structure(lambda x: tf.repeat(x, beam_size, axis=0), initial_state)
    # Per source (one row each): the batch index of the source, its mask, and its encoding.
    sources = {
        "index": tf.range(batch),
        "mask": tf.not_equal(source_ids, model.pad_id)[:, None, :],
        "encoded": encoded,
    }
    # Only the first beam is live at the start, or the k beams would be k copies.
    first_beam = tf.equal(tf.range(beam_size), 0)
    alive = {
        "ids": tf.fill([batch, beam_size, max_length], pad),
        "scores": tf.tile(tf.where(first_beam, 0.0, NEG_INF)[None], [batch, 1]),
        "attention": tf.zeros([batch, beam_size, max_length, src_len]),
        "coverage": tf.zeros([batch, beam_size, src_len]),
    }
    saved = {
        "ids": tf.fill([batch, beam_size, max_length], pad),
        "scores": tf.fill([batch, beam_size], NEG_INF),
        "attention": tf.zeros([batch, beam_size, max_length, src_len]),
    }
    done = saved  # the saved hypotheses of the sources that left the batch, by batch index
    tokens = tf.fill([batch * beam_size], tf.constant(model.bos_id, tf.int32))

    def any_unfinished(t, tokens, state, sources, alive, saved, done):
        return tf.logical_and(t < max_length, tf.logical_not(tf.reduce_all(_finished(saved))))

    def step(t, tokens, state, alive, saved, sources):
        n = tf.shape(sources["index"])[0]
        logits, state, weights = model.decode_step(tokens, state, sources["encoded"], t)
        logits = _suppress_eos(tf.cast(logits, tf.float32), model.eos_id, t, min_length)
        # A sentence's best 2k candidates are among each beam's 2k likeliest tokens: rank those
        # alone, normalised as logit - logsumexp, rather than [batch, k * vocab] log-probs.
        per_beam = tf.minimum(2 * beam_size, vocab)
        beam_logits, beam_tokens = tf.math.top_k(logits, k=per_beam)
        beam_log_probs = beam_logits - tf.reduce_logsumexp(logits, axis=-1, keepdims=True)
        beam_log_probs = tf.reshape(beam_log_probs, [n, beam_size, per_beam])
        candidates = tf.reshape(alive["scores"][:, :, None] + beam_log_probs, [n, -1])
        top_scores, top_indices = tf.math.top_k(candidates, k=2 * beam_size)
        origin = top_indices // per_beam
        top_tokens = tf.gather(tf.reshape(beam_tokens, [n, -1]), top_indices, batch_dims=1)

        ids = write_column(tf.gather(alive["ids"], origin, batch_dims=1), t, top_tokens, axis=2)
        alive_attention, alive_coverage = alive["attention"], alive["coverage"]
        if weights is not None:
            # A candidate's attention is its origin's: written to the k alive rows, and
            # gathered only for the rows kept (never materialised for all 2k candidates).
            beam_weights = tf.reshape(tf.cast(weights, tf.float32), [n, beam_size, -1])
            alive_attention = write_column(alive_attention, t, beam_weights, axis=2)
            alive_coverage += beam_weights
        coverage = tf.gather(alive_coverage, origin, batch_dims=1)

        # Save the candidates among the top k that end the sentence.
        ends = tf.logical_and(tf.equal(top_tokens, model.eos_id), top_scores > NEG_INF / 2)
        in_top_k = tf.range(2 * beam_size) < beam_size
        normalized = top_scores / length_penalty(t + 1, alpha, penalty)
        normalized += coverage_penalty(coverage, sources["mask"], beta)
        new_saved = tf.where(tf.logical_and(ends, in_top_k), normalized, NEG_INF)
        saved_scores, best = tf.math.top_k(tf.concat([saved["scores"], new_saved], 1), beam_size)
        # Pool index k + j (candidate j) takes its attention from alive row origin[j].
        candidate = tf.maximum(best - beam_size, 0)
        attention_rows = tf.where(
            best < beam_size, best, beam_size + tf.gather(origin, candidate, batch_dims=1)
        )
        saved = {
            "ids": tf.gather(tf.concat([saved["ids"], ids], 1), best, batch_dims=1),
            "scores": saved_scores,
            "attention": tf.gather(
                tf.concat([saved["attention"], alive_attention], 1), attention_rows, batch_dims=1
            ),
        }

        # Keep the best k candidates that do not end.
        alive_scores, keep = tf.math.top_k(tf.where(ends, NEG_INF, top_scores), k=beam_size)
        parents = tf.gather(origin, keep, batch_dims=1)
        alive = {
            "ids": tf.gather(ids, keep, batch_dims=1),
            "scores": alive_scores,
            "attention": tf.gather(alive_attention, parents, batch_dims=1),
            "coverage": tf.gather(coverage, keep, batch_dims=1),
        }
        flat_parents = tf.reshape(parents + tf.range(n)[:, None] * beam_size, [-1])
        state = _gather_rows(state, flat_parents)
        tokens = tf.reshape(tf.gather(top_tokens, keep, batch_dims=1), [-1])

        return t + 1, tokens, state, alive, saved

    def retire_and_decode(t, tokens, state, sources, alive, saved, done):
        # Set aside the finished sources' results and drop their rows (at the first call none
        # has finished, and nothing leaves). The last sources never leave, so that the batch
        # is never empty (ONNX Runtime mishandles some reductions of empty tensors).
        finished = _finished(saved)
        leaving = tf.cast(tf.where(finished)[:, 0], tf.int32)
        staying = tf.cast(tf.where(tf.logical_not(finished))[:, 0], tf.int32)
        at = tf.gather(sources["index"], leaving)[:, None]
        done = tf.nest.map_structure(
            lambda d, s: tf.tensor_scatter_nd_update(d, at, tf.gather(s, leaving)), done, saved
        )
        rows = _hypothesis_rows(staying, beam_size)
        tokens, state = tf.gather(tokens, rows), _gather_rows(state, rows)
        sources, alive, saved = _gather_rows((sources, alive, saved), staying)

        # Steps until a source finishes, in a loop of its own: no per-step branch.
        def none_finished(t, tokens, state, alive, saved):
            return tf.logical_and(t < max_length, tf.logical_not(tf.reduce_any(_finished(saved))))

        t, tokens, state, alive, saved = tf.while_loop(
            none_finished,
            lambda *loop_vars: step(*loop_vars, sources),
            (t, tokens, state, alive, saved),
            shape_invariants=_any_shape((t, tokens, state, alive, saved)),
        )
        return t, tokens, state, sources, alive, saved, done

    loop_vars = (tf.constant(0), tokens, state, sources, alive, saved, done)
    # Beam and batch sizes may be constants or tensors, and sources leave the batch: let every
    # dimension vary but the encoding's feature sizes (which its consumers may need to know).
    invariants = _any_shape(loop_vars)
    invariants[3]["encoded"] = tf.nest.map_structure(
        lambda x: tf.TensorShape([None] + x.shape[1:]), encoded
    )
    t, _, _, sources, alive, saved, done = tf.while_loop(
        any_unfinished, retire_and_decode, loop_vars, shape_invariants=invariants
    )

    # Sources still in the batch are done too, or were cut at max_length.
    at = sources["index"][:, None]
    cut = _best_hypotheses(alive, saved, t, n_best, alpha, penalty, beta, sources["mask"])
    ids, scores, attention = (
        tf.tensor_scatter_nd_update(values[:, :n_best], at, cut_values)
        for values, cut_values in zip((done["ids"], done["scores"], done["attention"]), cut)
    )
    lengths = tf.reduce_sum(tf.cast(tf.not_equal(ids, model.pad_id), tf.int32), axis=2)
    return ids, lengths, scores, attention
