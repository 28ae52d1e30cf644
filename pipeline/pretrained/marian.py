"""Marian checkpoints (`model_type: marian`: the OPUS-MT models) in the Hugging Face layout, as
transformers' `MarianMTModel` and `MarianTokenizer` define them, into the toolkit's Transformer.

Marian (Junczys-Dowmunt et al., 2018) is a post-norm Transformer with the configured
activation, embeddings scaled by sqrt(d_model), sinusoids with the sines first, an output
bias (`final_logits_bias`), and `</s>` (id 0) after every source; it starts decoding from
`<pad>` (the last id) and never outputs it. Its tokenizer segments with `source.spm` /
`target.spm` and maps pieces to ids through `vocab.json` (and `target_vocab.json` where the
sides have vocabularies of their own). No TensorFlow here.
"""

import re

from pipeline.core.errors import UnusableFileError, UserError
from pipeline.pretrained import bart_layers, vocabulary
from pipeline.pretrained.checkpoint import GENERATION_CONFIG_FILE
from pipeline.pretrained.generation import generate_settings
from pipeline.pretrained.imported import Imported

MODEL_TYPE = "marian"
LANGUAGE_TAG = re.compile(r">>(\w+)<<")  # a multi-target model's target language token
# Options transformers' Marian code reads that the Keras model has no counterpart for: each
# named, with the value the model assumes.
UNSUPPORTED = {
    "normalize_before": False,  # pre-norm layers
    "normalize_embedding": False,  # a layer norm on the embeddings
    "add_final_layer_norm": False,
    "static_position_embeddings": True,  # learned positions otherwise
    "add_bias_logits": False,
}


def model_settings(config):
    """The toolkit's `model` keys for a Marian config.json, refusing what the Keras model
    cannot represent."""
    for key, assumed in UNSUPPORTED.items():
        if key in config and bool(config[key]) != assumed:
            raise UserError(f"config.json: {key}: {config[key]!r} is not supported (the "
                            f"Keras Transformer assumes {assumed})")  # fmt: skip
    return {
        **bart_layers.dimension_settings(config),
        "positions": "sinusoidal_halves",
        "normalize_first": False,
        "share_embeddings": bool(config.get("share_encoder_decoder_embeddings", True)),
        "tie_embeddings": bool(config.get("tie_word_embeddings", True)),
        "output_bias": True,
        "source_eos": True,
    }


def _table(checkpoint, name):
    table = checkpoint.json(name)
    if not all(isinstance(row, int) for row in table.values()):
        raise UnusableFileError(checkpoint.directory / name, "expected {piece: id}")
    return table


def _special_rows(config, table, name):
    """(unk, eos, start) rows of `table`, as config.json and the tokenizer have them."""
    eos = bart_layers.config_value(config, "eos_token_id")
    start = config.get("decoder_start_token_id", config.get("pad_token_id"))
    unk = table.get("<unk>")
    if unk is None or start is None:
        raise UserError(f"{name}: has no <unk> entry, or config.json no pad_token_id")
    return unk, eos, start


def tags(table):
    """{language code: token} of a multi-target model's `>>code<<` tokens ({} for none)."""
    return {match[1]: piece for piece in table if (match := LANGUAGE_TAG.fullmatch(piece))}


def convert(checkpoint):
    """The `Imported` model of a Marian checkpoint directory (`checkpoint.Checkpoint`)."""
    config = checkpoint.config
    settings = model_settings(config)
    tokenizer = checkpoint.json("tokenizer_config.json", required=False)
    source_spm, target_spm = checkpoint.bytes("source.spm"), checkpoint.bytes("target.spm")
    separate = not settings["share_embeddings"] or (checkpoint.directory / "target_vocab.json"
                                                     ).is_file()  # fmt: skip
    source_table = _table(checkpoint, "vocab.json")
    target_table = _table(checkpoint, "target_vocab.json") if separate else source_table
    language_tags = tags(source_table)
    if separate:
        source_space = vocabulary.id_space(
            source_table, *_special_rows(config, source_table, "vocab.json"),
            vocabulary.producible_pieces(source_spm),
        )  # fmt: skip
        target_space = vocabulary.id_space(
            target_table, *_special_rows(config, target_table, "target_vocab.json"),
            vocabulary.producible_pieces(target_spm),
        )  # fmt: skip
    else:
        source_space = target_space = vocabulary.id_space(
            source_table, *_special_rows(config, source_table, "vocab.json"),
            vocabulary.producible_pieces(source_spm) + vocabulary.producible_pieces(target_spm),
        )  # fmt: skip
    # A tag is one symbol, with the word boundary before it: "▁>>fra<<" is what
    # segmenting ">>fra<< text" must give for the tag's id to come first and alone.
    spellings = {token: "\u2581" + token for token in language_tags.values()}
    weights = checkpoint.weights()
    arrays = bart_layers.arrays(weights, settings, source_space, target_space, "Marian")
    generation = checkpoint.json(GENERATION_CONFIG_FILE, required=False)
    return Imported(
        family=MODEL_TYPE,
        model=settings,
        suppressed_ids=target_space.suppressed,
        source_model=vocabulary.side_model(source_space, source_spm, spellings),
        target_model=vocabulary.side_model(target_space, target_spm),
        weights=arrays,
        search=generate_settings(config, generation),
        languages={
            "source": tokenizer.get("source_lang"),
            "target": tokenizer.get("target_lang"),
            "tags": language_tags,
        },  # fmt: skip
        unproducible=_unproducible(
            {**source_table, **target_table}, (source_spm, target_spm), language_tags
        ),
        strip_translation_spaces=True,  # MarianTokenizer.decode strips
    )


def _unproducible(table, spm_protos, language_tags):
    """Tokens of the tables that neither side's SentencePiece model produces (tags and the
    special tokens aside): no text is ever segmented into them."""
    producible = {piece for proto in spm_protos for piece in vocabulary.producible_pieces(proto)}
    ignored = producible | set(language_tags.values()) | {"</s>", "<unk>", "<pad>", "<s>"}
    return [piece for piece in table if piece not in ignored]
