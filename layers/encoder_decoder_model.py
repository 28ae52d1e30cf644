"""What every encoder-decoder model shares: the training objective and the decoding contract."""

import keras
from keras import ops

from layers.recorded_arguments import RecordsArguments
from layers.special_tokens import BOS_ID, EOS_ID, PAD_ID
from layers.token_losses import Perplexity, TokenAccuracy, token_cross_entropy


class EncoderDecoderModel(RecordsArguments, keras.Model):
    """Base class of the sequence-to-sequence models (recurrent and Transformer).

    Inputs (a dict):
        source_ids: int `[batch, src_len]`, right-padded with `pad_id`.
        target_input_ids: int `[batch, tgt_len]`, `<s> y_1 ... y_n`, right-padded.
    Labels: int `[batch, tgt_len]`, `y_1 ... y_n </s>`, right-padded.
    Output: logits `[batch, tgt_len, target_vocab_size]`.

    Training minimises the cross-entropy averaged over the non-padding target tokens (with
    optional label smoothing) and reports `token_accuracy` and `perplexity`; on one device as
    it is, under `tf.distribute` as its twin in `pipeline.model_types.training_twins`.

    Decoding goes through the three methods of the decoding contract (`encode`,
    `initial_decoder_state`, `decode_step`), which every subclass implements and which search
    and export depend on (never the reverse), so any model that honours them plugs into them.
    Subclasses also give `source_vocab_size` and `target_vocab_size`.

    Args:
        label_smoothing: epsilon of label smoothing.
        pad_id, bos_id, eos_id: ids of the special target tokens.
        target_language_first: the first target token names the target language, as in
            M2M100 and NLLB (their `forced_bos_token_id`): search takes it from the target
            prefix a request gives, scores it 0, and leaves it out of the output.
    """

    def __init__(self, label_smoothing=0.0, pad_id=PAD_ID, bos_id=BOS_ID, eos_id=EOS_ID,
                 target_language_first=False, **kwargs):  # fmt: skip
        super().__init__(**kwargs)
        self.target_language_first = bool(target_language_first)
        if not 0.0 <= float(label_smoothing) < 1.0:
            raise ValueError(f"label_smoothing must be in [0, 1), got {label_smoothing}")
        self.label_smoothing = float(label_smoothing)
        self.pad_id, self.bos_id, self.eos_id = int(pad_id), int(bos_id), int(eos_id)
        self.token_accuracy = TokenAccuracy()
        self.perplexity = Perplexity()

    def token_loss(self, y, y_pred):
        """(sum of the batch's per-token losses, its number of target tokens), both float32
        scalars; updates `token_accuracy` and `perplexity`."""
        mask = ops.not_equal(y, self.pad_id)
        losses, nll = token_cross_entropy(y, y_pred, mask, self.label_smoothing,
                                          self.smoothing_spread())  # fmt: skip
        self.token_accuracy.update_state(y, y_pred, mask)
        self.perplexity.update_state(nll, mask)
        return ops.sum(losses), ops.sum(ops.cast(mask, "float32"))

    def smoothing_spread(self):
        """Label smoothing's distribution over the target ids, float32 `[target_vocab_size]`;
        None: uniform over every id."""
        return None

    def compute_loss(self, x=None, y=None, y_pred=None, sample_weight=None, training=True):
        # One device's objective. Under a tf.distribute strategy, train the twin that
        # `pipeline.model_types.training_twins` derives, which averages over every replica's tokens.
        loss_sum, tokens = self.token_loss(y, y_pred)
        loss = ops.divide_no_nan(loss_sum, tokens)
        if self.losses:
            loss = loss + ops.sum(self.losses)
        return loss

    # --- The decoding contract --------------------------------------------------------------

    def encode(self, source_ids):
        """int `[batch, src_len]` -> a dict of tensors with one row per source along their
        first axis: search drops the rows of the sources that are done."""
        raise NotImplementedError(f"{type(self).__name__} does not implement encode")

    def initial_decoder_state(self, encoded):
        """A nest of tensors, one row per source. Search may keep k hypotheses per source: it
        repeats each row k times (rows i*k ... i*k+k-1 belong to source i), and reorders and
        drops rows along the first axis."""
        raise NotImplementedError(f"{type(self).__name__} does not implement initial_decoder_state")

    def decode_step(self, token_ids, state, encoded, step):
        """One step: `token_ids` int `[rows]` (rows = batch, or batch * k grouped by source, as
        `state`'s), the untiled `encoded`, and `step` the number of tokens decoded before
        (a scalar, the same for every row) -> (logits `[rows, target_vocab_size]`, the new
        state, attention weights over the source `[rows, src_len]` or None for a model without
        attention). A state tensor may change shape beyond its first axis from step to step
        (the Transformer's self-attention caches grow by a position a step)."""
        raise NotImplementedError(f"{type(self).__name__} does not implement decode_step")

    @classmethod
    def from_config(cls, config):
        return cls(**config)
