"""M2M100 and NLLB-200 checkpoints (`model_type: m2m_100`) in the Hugging Face layout, as
transformers' `M2M100ForConditionalGeneration`, `M2M100Tokenizer` and `NllbTokenizer` define
them, into the toolkit's Transformer.

M2M100 (Fan et al., 2021) and NLLB (NLLB Team, 2022) are pre-norm Transformers with a final
layer norm on each stack, embeddings scaled by sqrt(d_model) (`scale_embedding`), fairseq's
sinusoids (sines first, positions from 2) and one tied vocabulary. Every source is
`[source language token, pieces, </s>]`; decoding starts from `</s>` with the target language
token forced first, which the output leaves out. The vocabulary is a SentencePiece model
(`sentencepiece.bpe.model`) read through fairseq's ids: M2M100 maps pieces through
`vocab.json`, NLLB shifts SentencePiece's ids by one; the language tokens follow (`__de__`,
`deu_Latn`), their ids in the tokenizer's files. No TensorFlow here.
"""

import re

from pipeline.core.errors import UnusableFileError, UserError
from pipeline.pretrained import bart_layers, vocabulary
from pipeline.pretrained.checkpoint import GENERATION_CONFIG_FILE
from pipeline.pretrained.generation import generate_settings
from pipeline.pretrained.imported import Imported

MODEL_TYPE = "m2m_100"
SPM_FILE = "sentencepiece.bpe.model"
TOKENIZER_FILE = "tokenizer.json"
# fairseq's dictionary starts with these, whatever the SentencePiece model's own ids.
FAIRSEQ_SPECIALS = {"<s>": 0, "<pad>": 1, "</s>": 2, "<unk>": 3}
# A language token, and the code it stands for: M2M100's `__de__`, NLLB's `deu_Latn`.
LANGUAGE_TOKENS = (re.compile(r"__([a-z]{2,3})__"), re.compile(r"([a-z]{3}_[A-Z][a-z]{3})"))
# M2M100Tokenizer's language lists (fairseq's), by tokenizer_config.json's `language_codes`:
# their tokens (`__de__`) follow vocab.json's entries in this order. Checkpoints saved by
# transformers 4 list the tokens too (`additional_special_tokens`); transformers 5 names the list.
M2M100_LANGUAGES = {
    "m2m100": (
        "af am ar ast az ba be bg bn br bs ca ceb cs cy da de el en es et fa ff fi fr fy ga gd "
        "gl gu ha he hi hr ht hu hy id ig ilo is it ja jv ka kk km kn ko lb lg ln lo lt lv mg "
        "mk ml mn mr ms my ne nl no ns oc or pa pl ps pt ro ru sd si sk sl so sq sr ss su sv sw "
        "ta th tl tn tr uk ur uz vi wo xh yi yo zh zu"
    ).split(),
    "wmt21": "en ha is ja cs ru zh de".split(),
}
UNSUPPORTED = {  # options of m2m-derived configs the Keras model has no counterpart for
    "layernorm_embedding": False,
    "num_experts": None,  # NLLB-MoE
}
# Encoder and decoder end with a layer norm of their own (pre-norm layers).
FINAL_NORMS = {
    f"{side}_norm/{kind}": (f"model.{side}.layer_norm.{part}", "plain")
    for side in ("encoder", "decoder")
    for kind, part in (("gamma", "weight"), ("beta", "bias"))
}


def model_settings(config):
    """The toolkit's `model` keys for an M2M100 config.json, refusing what the Keras model
    cannot represent."""
    for key, assumed in UNSUPPORTED.items():
        if config.get(key, assumed) != assumed:
            raise UserError(f"config.json: {key}: {config[key]!r} is not supported (the "
                            f"Keras Transformer assumes {assumed})")  # fmt: skip
    return {
        **bart_layers.dimension_settings(config),
        "positions": "sinusoidal_fairseq",
        "normalize_first": True,
        "share_embeddings": True,
        "tie_embeddings": bool(config.get("tie_word_embeddings", True)),
        "output_bias": False,
        "source_eos": True,
    }


def language_code(token, patterns=LANGUAGE_TOKENS):
    """The language code a language token stands for (by the family's `patterns`), or None."""
    for pattern in patterns:
        if match := pattern.fullmatch(token):
            return match[1]
    return None


def _added_tokens(checkpoint):
    """{token: id} the tokenizer adds to its SentencePiece vocabulary: tokenizer.json's
    `added_tokens`, or tokenizer_config.json's `added_tokens_decoder`."""
    found = {}
    if (checkpoint.directory / TOKENIZER_FILE).is_file():
        for entry in checkpoint.json(TOKENIZER_FILE).get("added_tokens", []):
            found[entry["content"]] = int(entry["id"])
    decoder = checkpoint.json("tokenizer_config.json", required=False).get(
        "added_tokens_decoder", {})  # fmt: skip
    for row, entry in decoder.items():
        found.setdefault(entry["content"], int(row))
    return found


def _is_m2m100(checkpoint):
    """Whether the checkpoint is M2M100's (its pieces' rows in vocab.json), not NLLB's."""
    return (checkpoint.directory / "vocab.json").is_file()


def table(checkpoint, spm_proto):
    """{token: embedding row} of the checkpoint's vocabulary, language tokens included."""
    added = _added_tokens(checkpoint)
    if _is_m2m100(checkpoint):  # pieces through vocab.json
        rows = checkpoint.json("vocab.json")
        if not all(isinstance(row, int) for row in rows.values()):
            raise UnusableFileError(checkpoint.directory / "vocab.json", "expected {piece: id}")
        tokenizer = checkpoint.json("tokenizer_config.json", required=False)
        listed = [t for t in tokenizer.get("additional_special_tokens") or [] if language_code(t)]
        if not listed:
            codes = M2M100_LANGUAGES.get(tokenizer.get("language_codes", "m2m100"), [])
            listed = [f"__{code}__" for code in codes]
        # M2M100Tokenizer numbers its language tokens after vocab.json, in its list's order.
        languages = {token: len(rows) + i for i, token in enumerate(listed)}
        return {**rows, **languages, **{t: r for t, r in added.items() if language_code(t)}}
    # NLLB: fairseq's specials, then SentencePiece's pieces one id further.
    rows = dict(FAIRSEQ_SPECIALS)
    for index, piece in enumerate(vocabulary.all_pieces(spm_proto)):
        if index >= len(FAIRSEQ_SPECIALS) - 1:  # past SentencePiece's <unk>, <s>, </s>
            rows.setdefault(piece, index + 1)
    return {**rows, **added}


def convert(checkpoint):
    """The `Imported` model of an M2M100 or NLLB checkpoint directory."""
    return many_to_many(
        checkpoint, MODEL_TYPE, model_settings(checkpoint.config), FINAL_NORMS, LANGUAGE_TOKENS,
        # M2M100Tokenizer's decoding strips a translation's edge spaces, NllbTokenizer's keeps them.
        strip_translation_spaces=_is_m2m100(checkpoint),
    )  # fmt: skip


def many_to_many(checkpoint, family, settings, extra_weights, language_tokens,
                 strip_translation_spaces):  # fmt: skip
    """The `Imported` model of a checkpoint of fairseq's many-to-many conventions (a source
    `[language token, pieces, </s>]`, decoding from `</s>` with the target's language token
    forced first): `settings`, its `model` keys; `extra_weights`, its weights outside the
    layers (`bart_layers.arrays`); `language_tokens`, the patterns of its language tokens."""
    config = checkpoint.config
    spm_proto = checkpoint.bytes(SPM_FILE)
    rows = table(checkpoint, spm_proto)
    tags = {code: token for token in rows if (code := language_code(token, language_tokens))}
    if not tags:
        raise UnusableFileError(checkpoint.directory, "no language tokens in the tokenizer's "
                                f"files ({TOKENIZER_FILE}, tokenizer_config.json)")  # fmt: skip
    size = bart_layers.config_value(config, "vocab_size")
    highest = max(rows.values())
    if highest >= size:
        raise UserError(f"{checkpoint.directory}: the tokenizer's ids reach {highest}, beyond "
                        f"config.json's vocab_size {size}")  # fmt: skip
    eos = bart_layers.config_value(config, "eos_token_id")
    start = bart_layers.config_value(config, "decoder_start_token_id", eos)
    space = vocabulary.id_space(rows, rows["<unk>"], eos, start,
                                vocabulary.producible_pieces(spm_proto), size)  # fmt: skip
    weights = checkpoint.weights()
    generation = checkpoint.json(GENERATION_CONFIG_FILE, required=False)
    spellings = {token: "\u2581" + token for token in tags.values()}
    return Imported(
        family=family,
        model=settings,
        suppressed_ids=space.suppressed,
        source_model=vocabulary.side_model(space, spm_proto, spellings),
        target_model=vocabulary.side_model(space, spm_proto, spellings),
        weights=bart_layers.arrays(weights, settings, space, space, family, extra_weights),
        search=generate_settings(config, generation),
        languages={"source_tags": tags, "target_tokens": tags},
        unproducible=[],
        strip_translation_spaces=strip_translation_spaces,
    )
