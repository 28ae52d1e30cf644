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

import numpy as np

from pipeline.core.errors import UnusableFileError, UserError
from pipeline.pretrained import vocabulary
from pipeline.pretrained.imported import Imported, RowBlocks, parameter_names, weight_rules

MODEL_TYPE = "marian"
ACTIVATIONS = {"relu": "relu", "swish": "silu", "silu": "silu", "gelu": "gelu"}
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

# The checkpoint's name of each weight of a layer: {Keras path below the layer: (checkpoint
# name below the layer, how the array is laid out)}. Linear weights are [out, in] there and
# [in, out] in Keras; keras-hub's attention splits heads in its kernels.
ENCODER_LAYER = {
    **{f"self_attention_layer/{keras}/{kind}": (f"self_attn.{name}.{part}", layout)
       for keras, name in (("query", "q_proj"), ("key", "k_proj"), ("value", "v_proj"))
       for kind, part, layout in (("kernel", "weight", "heads_in"), ("bias", "bias", "heads"))},
    "self_attention_layer/attention_output/kernel": ("self_attn.out_proj.weight", "heads_out"),
    "self_attention_layer/attention_output/bias": ("self_attn.out_proj.bias", "plain"),
    "self_attention_layer_norm/gamma": ("self_attn_layer_norm.weight", "plain"),
    "self_attention_layer_norm/beta": ("self_attn_layer_norm.bias", "plain"),
    "feedforward_intermediate_dense/kernel": ("fc1.weight", "transposed"),
    "feedforward_intermediate_dense/bias": ("fc1.bias", "plain"),
    "feedforward_output_dense/kernel": ("fc2.weight", "transposed"),
    "feedforward_output_dense/bias": ("fc2.bias", "plain"),
    "feedforward_layer_norm/gamma": ("final_layer_norm.weight", "plain"),
    "feedforward_layer_norm/beta": ("final_layer_norm.bias", "plain"),
}  # fmt: skip
DECODER_LAYER = {
    **{f"{block}/{keras}/{kind}": (f"{attention}.{name}.{part}", layout)
       for block, attention in (("self_attention", "self_attn"),
                                ("cross_attention", "encoder_attn"))
       for keras, name in (("query", "q_proj"), ("key", "k_proj"), ("value", "v_proj"),
                           ("output", "out_proj"))
       for kind, part, layout in (("kernel", "weight", "transposed"), ("bias", "bias", "plain"))},
    **{f"norm_{i}/{kind}": (f"{norm}.{part}", "plain")
       for i, norm in enumerate(("self_attn_layer_norm", "encoder_attn_layer_norm",
                                 "final_layer_norm"))
       for kind, part in (("gamma", "weight"), ("beta", "bias"))},
    "intermediate/kernel": ("fc1.weight", "transposed"),
    "intermediate/bias": ("fc1.bias", "plain"),
    "feedforward_output/kernel": ("fc2.weight", "transposed"),
    "feedforward_output/bias": ("fc2.bias", "plain"),
}  # fmt: skip
# Where each embedding table is, in the order looked for: transformers 5 writes a shared table
# once (`model.shared`); transformers 4 also wrote each side's copy and a tied `lm_head`.
SOURCE_EMBEDDING = ("model.encoder.embed_tokens.weight", "model.shared.weight")
TARGET_EMBEDDING = ("model.decoder.embed_tokens.weight", "model.shared.weight")
OUTPUT_EMBEDDING = ("lm_head.weight",)
# Weights read for what they are not: the fixed sinusoids, which the Keras model computes.
IGNORED = re.compile(r"model\.(en|de)coder\.embed_positions\.weight")


def _config_value(config, key, default=None):
    value = config.get(key, default)
    if value is None:
        raise UnusableFileError("config.json", f"has no {key}")
    return value


def model_settings(config):
    """The toolkit's `model` keys for a Marian config.json, refusing what the Keras model
    cannot represent."""
    for key, assumed in UNSUPPORTED.items():
        if key in config and bool(config[key]) != assumed:
            raise UserError(f"config.json: {key}: {config[key]!r} is not supported (the "
                            f"Keras Transformer assumes {assumed})")  # fmt: skip
    activation = config.get("activation_function", "gelu")
    if activation not in ACTIVATIONS:
        raise UserError(f"config.json: activation_function {activation!r} is not supported "
                        f"(supported: {', '.join(ACTIVATIONS)})")  # fmt: skip
    d_model = _config_value(config, "d_model")
    encoder_heads = _config_value(config, "encoder_attention_heads")
    decoder_heads = _config_value(config, "decoder_attention_heads")
    for key, heads in (("encoder_attention_heads", encoder_heads),
                       ("decoder_attention_heads", decoder_heads)):  # fmt: skip
        if d_model % heads:
            raise UserError(f"config.json: d_model ({d_model}) is not divisible by {key} "
                            f"({heads})")  # fmt: skip
    return {
        "type": "transformer",
        "model_dim": d_model,
        "num_heads": encoder_heads,
        "decoder_num_heads": decoder_heads,
        "ffn_dim": _config_value(config, "encoder_ffn_dim"),
        "decoder_ffn_dim": _config_value(config, "decoder_ffn_dim"),
        "encoder_layers": _config_value(config, "encoder_layers"),
        "decoder_layers": _config_value(config, "decoder_layers"),
        "dropout": float(config.get("dropout", 0.1)),
        "attention_dropout": float(config.get("attention_dropout", 0.0)),
        "ffn_dropout": float(config.get("activation_dropout", 0.0)),
        "activation": ACTIVATIONS[activation],
        "positions": "sinusoidal_halves",
        "max_positions": _config_value(config, "max_position_embeddings"),
        "scale_embeddings": bool(config.get("scale_embedding", False)),
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
    eos = _config_value(config, "eos_token_id")
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
    arrays = _arrays(weights, settings, source_space, target_space)
    generation = checkpoint.json("generation_config.json", required=False)
    return Imported(
        family=MODEL_TYPE,
        model=settings,
        suppressed_ids=target_space.suppressed,
        source_model=vocabulary.side_model(source_space, source_spm, spellings),
        target_model=vocabulary.side_model(target_space, target_spm),
        weights=arrays,
        search=search_settings(config, generation),
        languages={
            "source": tokenizer.get("source_lang"),
            "target": tokenizer.get("target_lang"),
            "tags": language_tags,
        },  # fmt: skip
        unproducible=_unproducible(
            {**source_table, **target_table}, (source_spm, target_spm), language_tags
        ),
    )


def _unproducible(table, spm_protos, language_tags):
    """Tokens of the tables that neither side's SentencePiece model produces (tags and the
    special tokens aside): no text is ever segmented into them."""
    producible = {piece for proto in spm_protos for piece in vocabulary.producible_pieces(proto)}
    ignored = producible | set(language_tags.values()) | {"</s>", "<unk>", "<pad>", "<s>"}
    return [piece for piece in table if piece not in ignored]


def search_settings(config, generation):
    """The `decode` keys that make the toolkit's search what `generate()` does with this
    checkpoint's generation config (and config.json's defaults under it)."""
    merged = {**config, **generation}
    max_length = int(merged.get("max_length") or 20) - 1  # the start token counts there
    early_stopping = merged.get("early_stopping", False)
    bad_words = merged.get("bad_words_ids") or []
    start = merged.get("decoder_start_token_id", merged.get("pad_token_id"))
    if any(words != [start] for words in bad_words):
        raise UserError(f"generation_config.json: bad_words_ids {bad_words} (only the start "
                        "token [[pad]] is supported)")  # fmt: skip
    return {
        "beam_size": int(merged.get("num_beams") or 1),
        "length_penalty": float(merged.get("length_penalty", 1.0)),
        "length_penalty_type": "average",
        "beam_stopping": {True: "k_finished", False: "no_improvement", "never": "never"}[
            early_stopping
        ],
        "force_eos_at_limit": merged.get("forced_eos_token_id") is not None,
        "min_length": max(int(merged.get("min_length") or 0) - 1, 0),
        "no_repeat_ngram_size": int(merged.get("no_repeat_ngram_size") or 0),
        "max_length_ratio": 0.0,
        "max_length_offset": max_length,
        "max_length_cap": max_length,
        "renormalized": bool(merged.get("renormalize_logits", False)),
    }


def _arrays(weights, settings, source_space, target_space):
    """{Keras weight path below the model: (a function reading its array, the checkpoint name
    it comes from)} for every weight of the Keras model: `imported.set_weights` reads each
    when it assigns it, so that the import holds one checkpoint tensor at a time."""
    found = _find(weights, TARGET_EMBEDDING, "the target embedding")
    arrays = {"target_embedding/embeddings": (lambda: _gather(target_space, weights, found),
                                              found)}  # fmt: skip
    if not settings["share_embeddings"]:
        source = _find(weights, SOURCE_EMBEDDING, "the source embedding")
        arrays["source_embedding/embeddings"] = (
            lambda: _gather(source_space, weights, source), source)  # fmt: skip
    if not settings["tie_embeddings"]:
        output = _find(weights, OUTPUT_EMBEDDING, "the output layer (untied)")
        arrays["target_embedding/reverse_embeddings"] = (
            lambda: _gather(target_space, weights, output, transposed=True), output)  # fmt: skip

    def output_bias():
        rows = max(target_space.rows.max() + 1, 1)
        bias = weights["final_logits_bias"] if "final_logits_bias" in weights else np.zeros(
            (1, rows), np.float32)  # fmt: skip
        return target_space.gather(bias.reshape(-1))

    arrays["output_bias"] = (output_bias, "final_logits_bias")
    rules = weight_rules(settings, ENCODER_LAYER, DECODER_LAYER)
    for keras_path, (name, layout, heads) in rules.items():
        if name not in weights:
            raise UserError(f"model weights: {name} is missing")
        arrays[keras_path] = (
            lambda name=name, layout=layout, heads=heads: _laid_out(weights[name], layout, heads),
            name,
        )  # fmt: skip
    used = set(parameter_names(rules)) | {"final_logits_bias", *SOURCE_EMBEDDING,
                                          *TARGET_EMBEDDING, *OUTPUT_EMBEDDING}  # fmt: skip
    unknown = sorted(n for n in weights if n not in used and not IGNORED.fullmatch(n))
    if unknown:
        raise UserError(
            f"model weights: {unknown[0]} has no place in a Marian model"
            + (f" (and {len(unknown) - 1} more)" if unknown[1:] else "")
        )
    return arrays


def _gather(space, weights, name, transposed=False):
    """The embedding table `name` reordered to `space`'s ids, as `RowBlocks`."""
    shape = weights.shape(name)
    if len(shape) != 2 or shape[0] <= space.rows.max():
        raise UserError(f"model weights: {name} has shape {list(shape)}, too few rows "
                        f"for the vocabulary's {space.rows.max() + 1} ids")  # fmt: skip
    blocks = space.blocks(lambda rows: weights.rows(name, rows))
    return RowBlocks((space.size, shape[1]), blocks, transposed)


def _find(weights, names, what):
    for name in names:
        if name in weights:
            return name
    raise UserError(f"model weights: no {what} ({' or '.join(names)})")


def _laid_out(array, layout, heads):
    if layout == "plain":
        return array
    if layout == "transposed":
        return array.T
    if layout == "heads":
        return array.reshape(heads, -1)
    if layout == "heads_in":  # [heads * depth, in] -> [in, heads, depth]
        return array.T.reshape(array.shape[1], heads, -1)
    if layout == "heads_out":  # [out, heads * depth] -> [heads, depth, out]
        return array.T.reshape(heads, -1, array.shape[0])
    raise ValueError(f"unknown layout {layout!r}")
