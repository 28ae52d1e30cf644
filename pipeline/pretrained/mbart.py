"""mBART-50 checkpoints (`model_type: mbart`) in the Hugging Face layout, as transformers'
`MBartForConditionalGeneration` and `MBart50Tokenizer` define them, into the toolkit's
Transformer: the many-to-many, one-to-many and many-to-one translation models of Tang et al.
(2020), "Multilingual Translation with Extensible Multilingual Pretraining and Finetuning".

mBART (Liu et al., 2020) is a pre-norm Transformer with a final layer norm on each stack, a
layer norm of the embeddings (`layernorm_embedding`), learned positions (fairseq's, from row
2), embeddings scaled by sqrt(d_model) where `scale_embedding` says so, one tied vocabulary
and a bias on the logits (`final_logits_bias`). MBart50Tokenizer follows fairseq's
many-to-many conventions as NLLB's does (see `m2m100`): a source `[language code, pieces,
</s>]`, decoding from `</s>` with the target's code forced first; the SentencePiece model's
ids shifted by one, the 52 language codes (`de_DE`, `en_XX`) and `<mask>` after them. The
first mBART's tokenizer (MBartTokenizer: the code after the source, decoding from the
target's code) is refused. No TensorFlow here.
"""

import re

from pipeline.core.errors import UserError
from pipeline.pretrained import bart_layers, m2m100

MODEL_TYPE = "mbart"
TOKENIZER = "MBart50Tokenizer"
# A language code of mBART-50's: `de_DE`, `en_XX`.
LANGUAGE_TOKENS = (re.compile(r"([a-z]{2}_[A-Z]{2})"),)
EMBEDDING_WEIGHTS = {
    **{f"{keras}_positions/embeddings": (f"model.{side}.embed_positions.weight",
                                         "learned_positions")
       for keras, side in (("source", "encoder"), ("target", "decoder"))},
    **{f"{keras}_embedding_norm/{kind}": (f"model.{side}.layernorm_embedding.{part}", "plain")
       for keras, side in (("source", "encoder"), ("target", "decoder"))
       for kind, part in (("gamma", "weight"), ("beta", "bias"))},
}  # fmt: skip


def model_settings(config):
    """The toolkit's `model` keys for an mBART config.json."""
    return {
        **bart_layers.dimension_settings(config),
        "positions": "learned",
        "normalize_first": True,
        "embedding_norm": True,
        "share_embeddings": True,
        "tie_embeddings": bool(config.get("tie_word_embeddings", True)),
        "output_bias": True,
        "source_eos": True,
    }


def convert(checkpoint):
    """The `Imported` model of an mBART-50 checkpoint directory."""
    tokenizer = checkpoint.json("tokenizer_config.json", required=False).get("tokenizer_class")
    if tokenizer and not tokenizer.startswith(TOKENIZER):
        raise UserError(
            f"{checkpoint.directory}: tokenizer {tokenizer} is not supported: mBART "
            f"checkpoints import with mBART-50's conventions ({TOKENIZER})"
        )
    return m2m100.many_to_many(
        checkpoint, MODEL_TYPE, model_settings(checkpoint.config),
        {**m2m100.FINAL_NORMS, **EMBEDDING_WEIGHTS}, LANGUAGE_TOKENS,
        strip_translation_spaces=True,
    )  # fmt: skip
