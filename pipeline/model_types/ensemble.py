"""Several trained models of one vocabulary as one model on the decoding contract
(`layers.EncoderDecoderModel`'s `encode`, `initial_decoder_state`, `decode_step`, and
`forward` for scoring), so that search, scoring and the exports run an ensemble as they run
one model.

At each step the ensemble's log-probabilities are the weighted mean of its members' (as
Marian and Sockeye combine them; search's log-softmax then renormalises them, a weighted
geometric mean of the members' distributions). The encodings and search states are the
members' own, side by side in one nest, so members of any family and size combine; their
attention over the source is averaged over the members that have one.
"""

import tensorflow as tf

from pipeline.core.errors import UserError

# The decoding contract's constants, which every member must agree on, as on vocabulary sizes.
CONTRACT_CONSTANTS = ("pad_id", "bos_id", "eos_id", "target_language_first")


class Ensemble:
    """`members` (trained `layers.EncoderDecoderModel`s sharing the vocabularies) with
    `weights` (positive, one a member; default equal), normalised to sum to 1."""

    def __init__(self, members, weights=None):
        if not members:
            raise UserError("an ensemble needs at least one model")
        weights = [1.0] * len(members) if weights is None else [float(w) for w in weights]
        if len(weights) != len(members):
            raise UserError(f"{len(weights)} weights for {len(members)} models: give one a model")
        if min(weights) <= 0:
            raise UserError(f"ensemble weights must be above 0, got {weights}")
        self.members = list(members)
        self.weights = [w / sum(weights) for w in weights]
        first = self.members[0]
        for name in (*CONTRACT_CONSTANTS, "source_vocab_size", "target_vocab_size"):
            setattr(self, name, getattr(first, name))

    @property
    def variables(self):
        return [variable for member in self.members for variable in member.variables]

    def encode(self, source_ids):
        return {f"member_{i}": m.encode(source_ids) for i, m in enumerate(self.members)}

    def initial_decoder_state(self, encoded):
        return {
            f"member_{i}": m.initial_decoder_state(encoded[f"member_{i}"])
            for i, m in enumerate(self.members)
        }

    def decode_step(self, token_ids, state, encoded, step):
        """The weighted mean of the members' log-probabilities `[rows, vocab]`, their states,
        and their mean attention `[rows, src_len]` (None when no member attends)."""
        keys = [f"member_{i}" for i in range(len(self.members))]
        outputs = [member.decode_step(token_ids, state[key], encoded[key], step)
                   for key, member in zip(keys, self.members)]  # fmt: skip
        log_probs, attention = self._combined([(o[0], o[2]) for o in outputs])
        return log_probs, {key: o[1] for key, o in zip(keys, outputs)}, attention

    def forward(self, inputs, training=None):
        """Teacher-forced: the weighted mean log-probabilities `[batch, tgt_len, vocab]` and
        the mean attention `[batch, tgt_len, src_len]` (None when no member attends)."""
        return self._combined([m.forward(inputs, training=training) for m in self.members])

    def _combined(self, outputs):
        """The members' (logits, attention or None) as the weighted mean of their
        log-probabilities and the mean of the attention there is."""
        log_probs = tf.add_n([weight * tf.nn.log_softmax(tf.cast(logits, tf.float32))
                              for weight, (logits, _) in zip(self.weights, outputs)])  # fmt: skip
        attention = [tf.cast(a, tf.float32) for _, a in outputs if a is not None]
        return log_probs, (tf.add_n(attention) / len(attention) if attention else None)
