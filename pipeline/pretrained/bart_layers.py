"""What the checkpoint families transformers derives from BART (Lewis et al., 2020) share: the
names of their layers' weights, the dimensions their config.json gives, and the reading of
their weights into the Keras Transformer's variables. Marian and M2M100 (NLLB) differ in the
layers' order (post- or pre-norm), positions, vocabulary and special tokens, which their own
modules declare. No TensorFlow here."""

import re

import numpy as np

from pipeline.core.errors import UnusableFileError, UserError
from pipeline.pretrained.imported import RowBlocks, parameter_names, weight_rules

ACTIVATIONS = {"relu": "relu", "swish": "silu", "silu": "silu", "gelu": "gelu"}

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
IGNORED = re.compile(r"model\.(en|de)coder\.embed_positions\.weights?")
# fairseq's learned positions (mBART's) start at this row of their table: position p is row
# p + 2, the rows below never read.
LEARNED_POSITION_OFFSET = 2


def config_value(config, key, default=None):
    value = config.get(key, default)
    if value is None:
        raise UnusableFileError("config.json", f"has no {key}")
    return value


def dimension_settings(config):
    """The toolkit's `model` keys that a BART-family config.json gives alike: dimensions,
    depths, heads, dropouts and the activation; what the Keras model cannot represent is a
    `UserError` naming the key."""
    activation = config.get("activation_function", "gelu")
    if activation not in ACTIVATIONS:
        raise UserError(f"config.json: activation_function {activation!r} is not supported "
                        f"(supported: {', '.join(ACTIVATIONS)})")  # fmt: skip
    d_model = config_value(config, "d_model")
    encoder_heads = config_value(config, "encoder_attention_heads")
    decoder_heads = config_value(config, "decoder_attention_heads")
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
        "ffn_dim": config_value(config, "encoder_ffn_dim"),
        "decoder_ffn_dim": config_value(config, "decoder_ffn_dim"),
        "encoder_layers": config_value(config, "encoder_layers"),
        "decoder_layers": config_value(config, "decoder_layers"),
        "dropout": float(config.get("dropout", 0.1)),
        "attention_dropout": float(config.get("attention_dropout", 0.0)),
        "ffn_dropout": float(config.get("activation_dropout", 0.0)),
        "activation": ACTIVATIONS[activation],
        "max_positions": config_value(config, "max_position_embeddings"),
        "scale_embeddings": bool(config.get("scale_embedding", False)),
    }


def arrays(weights, settings, source_space, target_space, family, extra=None):
    """{Keras weight path below the model: (a function reading its array, the checkpoint name
    it comes from)} for every weight of the Keras model: `imported.set_weights` reads each
    when it assigns it, so that the import holds one checkpoint tensor at a time. `extra`:
    {Keras path: (checkpoint name, layout)} of the family's weights outside the layers;
    `family` names it in errors."""
    found = _find(weights, TARGET_EMBEDDING, "the target embedding")
    read = {"target_embedding/embeddings": (lambda: _gather(target_space, weights, found),
                                            found)}  # fmt: skip
    if not settings["share_embeddings"]:
        source = _find(weights, SOURCE_EMBEDDING, "the source embedding")
        read["source_embedding/embeddings"] = (
            lambda: _gather(source_space, weights, source), source)  # fmt: skip
    if not settings["tie_embeddings"]:
        output = _find(weights, OUTPUT_EMBEDDING, "the output layer (untied)")
        read["target_embedding/reverse_embeddings"] = (
            lambda: _gather(target_space, weights, output, transposed=True), output)  # fmt: skip
    if settings["output_bias"]:

        def output_bias():
            rows = max(target_space.rows.max() + 1, 1)
            bias = weights["final_logits_bias"] if "final_logits_bias" in weights else np.zeros(
                (1, rows), np.float32)  # fmt: skip
            return target_space.gather(bias.reshape(-1))

        read["output_bias"] = (output_bias, "final_logits_bias")
    rules = weight_rules(settings, ENCODER_LAYER, DECODER_LAYER)
    rules.update({path: (name, layout, None) for path, (name, layout) in (extra or {}).items()})
    for keras_path, (name, layout, heads) in rules.items():
        if name not in weights:
            raise UserError(f"model weights: {name} is missing")
        read[keras_path] = (
            lambda name=name, layout=layout, heads=heads: _laid_out(weights[name], layout, heads),
            name,
        )  # fmt: skip
    used = set(parameter_names(rules)) | {"final_logits_bias", *SOURCE_EMBEDDING,
                                          *TARGET_EMBEDDING, *OUTPUT_EMBEDDING}  # fmt: skip
    unknown = sorted(n for n in weights if n not in used and not IGNORED.fullmatch(n))
    if unknown:
        raise UserError(
            f"model weights: {unknown[0]} has no place in a {family} model"
            + (f" (and {len(unknown) - 1} more)" if unknown[1:] else "")
        )
    return read


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
    if layout == "learned_positions":  # [offset + positions, width] -> [positions, width]
        return array[LEARNED_POSITION_OFFSET:]
    if layout == "heads":
        return array.reshape(heads, -1)
    if layout == "heads_in":  # [heads * depth, in] -> [in, heads, depth]
        return array.T.reshape(array.shape[1], heads, -1)
    if layout == "heads_out":  # [out, heads * depth] -> [heads, depth, out]
        return array.T.reshape(heads, -1, array.shape[0])
    raise ValueError(f"unknown layout {layout!r}")
