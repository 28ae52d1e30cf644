"""The Transformer as a CTranslate2 model: a C++ runtime for CPUs and GPUs, with int8 weights.

`OUT/ctranslate2/` holds `model.bin` and `config.json` (CTranslate2's `TransformerSpec`), the
vocabularies as JSON token lists in id order, and the SentencePiece models to tokenise with:

    translator = ctranslate2.Translator("OUT/ctranslate2")
    processor = sentencepiece.SentencePieceProcessor(model_file="OUT/ctranslate2/source.model")
    results = translator.translate_batch(
        processor.encode(sentences, out_type=str), beam_size=5, max_input_length=250)

Sources take no <s>, and </s> only where the model appends one (`model.source_eos`, which
CTranslate2's `add_source_eos` does too); decoding starts from <s> at position 0. An imported
M2M100 or NLLB model is given its source language's token before the source and its target
language's token as `target_prefix`, which starts each hypothesis. The
weights are copied as they are, and where CTranslate2's formulas differ from ours the model
carries ours: its position table is ours, written out (CTranslate2's own sinusoids are
concatenated, not interleaved, with other frequencies and start at position 1).

The search is CTranslate2's: it cuts inputs at `max_input_length` (ours at
decode.max_source_length, 250 above), forbids </s> as the first token unless
`min_decoding_length=0`, and divides scores by |Y|^length_penalty (our `length_penalty_type:
average`; it has no GNMT penalty, our default), |Y| counting </s> only with
`return_end_token=True`. Greedy search, and beam search without a length penalty, give our
tokens and scores (tests/test_ctranslate2.py).
"""

import keras
import numpy as np
import sentencepiece

from layers.keras_internals import encoder_sublayers
from pipeline.core.errors import UserError
from pipeline.data.tokenizer import BOS_ID, EOS_ID, UNK_ID

try:
    from ctranslate2.specs import TransformerSpec, common_spec
    from ctranslate2.specs import transformer_spec as ct2_transformer
except ImportError as error:
    raise UserError(
        f"the ctranslate2 export format needs CTranslate2 ({error}): pip install ctranslate2"
    ) from None

# Ours -> CTranslate2's, for the FFN (its GELU is the exact, erf one; SWISH is x * sigmoid(x)).
ACTIVATIONS = {
    "relu": common_spec.Activation.RELU,
    "gelu": common_spec.Activation.GELU,
    "silu": common_spec.Activation.SWISH,
}
# Rows of a sinusoidal table: CTranslate2's default max_input_length, so that no input it
# leaves uncut runs past the table (CTranslate2 refuses positions beyond it).
SINUSOIDAL_POSITIONS = 1024


def _numpy(variable):
    return np.asarray(keras.ops.convert_to_numpy(variable), np.float32)


def _set_linear(spec, layers, input_axes=1):
    """`spec` as the Keras (Einsum)Dense `layers` side by side (CTranslate2's fused
    projections): weights `[outputs, inputs]`, a kernel's first `input_axes` being inputs."""
    weights, biases = [], []
    for layer in layers:
        kernel = _numpy(layer.kernel)
        inputs = int(np.prod(kernel.shape[:input_axes]))
        weights.append(kernel.reshape(inputs, -1).T)
        biases.append(_numpy(layer.bias).reshape(-1))
    spec.weight = np.concatenate(weights)
    spec.bias = np.concatenate(biases)


def _set_layer_norm(spec, norm):
    spec.gamma = _numpy(norm.gamma)
    spec.beta = _numpy(norm.beta)


def _set_position_table(spec, layer, rows, dim):
    """Our encoding of positions 0..rows-1, from the layer itself (sinusoidal or learned)."""
    spec.encodings = _numpy(layer(np.zeros((1, rows, dim), np.float32)))[0]


def _set_encoder_layer(spec, layer):
    """A keras-hub `TransformerEncoder`."""
    parts = encoder_sublayers(layer)
    attention = parts.self_attention
    projections = (attention.query_dense, attention.key_dense, attention.value_dense)
    _set_linear(spec.self_attention.linear[0], projections)
    _set_linear(spec.self_attention.linear[1], [attention.output_dense], input_axes=2)
    _set_layer_norm(spec.self_attention.layer_norm, parts.self_attention_norm)
    _set_linear(spec.ffn.linear_0, [parts.feedforward_intermediate])
    _set_linear(spec.ffn.linear_1, [parts.feedforward_output])
    _set_layer_norm(spec.ffn.layer_norm, parts.feedforward_norm)


def _set_decoder_layer(spec, layer):
    """A `TransformerDecoderLayer`."""
    own, cross = layer.self_attention, layer.cross_attention
    projections = (own.query_projection, own.key_projection, own.value_projection)
    _set_linear(spec.self_attention.linear[0], projections)
    _set_linear(spec.self_attention.linear[1], [own.output_projection])
    _set_linear(spec.attention.linear[0], [cross.query_projection])
    _set_linear(spec.attention.linear[1], [cross.key_projection, cross.value_projection])
    _set_linear(spec.attention.linear[2], [cross.output_projection])
    _set_linear(spec.ffn.linear_0, [layer.intermediate])
    _set_linear(spec.ffn.linear_1, [layer.feedforward_output])
    for sublayer, norm in zip((spec.self_attention, spec.attention, spec.ffn), layer.norms):
        _set_layer_norm(sublayer.layer_norm, norm)


def _one(values, what):
    """The single value that CTranslate2 keeps for all the layers."""
    if len(values) != 1:
        raise ValueError(f"CTranslate2 takes one {what} for all layers, got {sorted(values)}")
    return values.pop()


def transformer_spec(model, source_tokens, target_tokens):
    """A `TransformerSpec` with the weights of `model` (a `layers.Transformer`) and the
    vocabularies' tokens in id order (their special tokens at our special ids)."""
    every_layer = (*model.encoder_layers, *model.decoder_layers)
    activation = _one(
        {keras.activations.serialize(keras.activations.get(x.activation)) for x in every_layer},
        "feed-forward activation",
    )
    if activation not in ACTIVATIONS:
        raise ValueError(f"CTranslate2 conversion takes {', '.join(ACTIVATIONS)}: {activation}")
    final_norms = [n for n in (model.encoder_norm, model.decoder_norm) if n is not None]
    epsilon = _one(
        {x.layer_norm_epsilon for x in every_layer} | {n.epsilon for n in final_norms},
        "layer normalisation epsilon",
    )
    encoder_spec = ct2_transformer.TransformerEncoderSpec(
        model.num_encoder_layers,
        model.num_heads,
        pre_norm=model.normalize_first,
        activation=ACTIVATIONS[activation],
        layernorm_embedding=model.embedding_norm,
    )
    decoder_spec = ct2_transformer.TransformerDecoderSpec(
        model.num_decoder_layers,
        model.decoder_num_heads,
        pre_norm=model.normalize_first,
        activation=ACTIVATIONS[activation],
        layernorm_embedding=model.embedding_norm,
        # The alignments of our search: the last layer's cross-attention, averaged over heads.
        alignment_layer=-1,
        alignment_heads=0,
    )
    spec = TransformerSpec(encoder_spec, decoder_spec)
    spec.config.layer_norm_epsilon = epsilon
    spec.config.add_source_eos = model.source_eos
    spec.config.unk_token = target_tokens[UNK_ID]
    spec.config.bos_token = spec.config.decoder_start_token = target_tokens[BOS_ID]
    spec.config.eos_token = target_tokens[EOS_ID]
    spec.register_source_vocabulary(source_tokens)
    spec.register_target_vocabulary(target_tokens)

    encoder, decoder = spec.encoder, spec.decoder
    encoder.embeddings[0].weight = _numpy(model.source_embedding.embeddings)
    decoder.embeddings.weight = _numpy(model.target_embedding.embeddings)
    # By sqrt(model_dim), as ours, or not at all.
    encoder.scale_embeddings = decoder.scale_embeddings = model.scale_embeddings
    # A table of its own length covers what the model covers; a computed one, what CTranslate2
    # leaves uncut.
    rows = model.max_positions if model.positions != "sinusoidal" else SINUSOIDAL_POSITIONS
    _set_position_table(encoder.position_encodings, model.source_positions, rows, model.model_dim)
    _set_position_table(decoder.position_encodings, model.target_positions, rows, model.model_dim)
    if model.embedding_norm:
        _set_layer_norm(encoder.layernorm_embedding, model.source_embedding_norm)
        _set_layer_norm(decoder.layernorm_embedding, model.target_embedding_norm)
    for layer_spec, layer in zip(encoder.layer, model.encoder_layers):
        _set_encoder_layer(layer_spec, layer)
    for layer_spec, layer in zip(decoder.layer, model.decoder_layers):
        _set_decoder_layer(layer_spec, layer)
    if model.normalize_first:
        _set_layer_norm(encoder.layer_norm, model.encoder_norm)
        _set_layer_norm(decoder.layer_norm, model.decoder_norm)
    decoder.projection.weight = (
        decoder.embeddings.weight
        if model.tie_embeddings
        else _numpy(model.target_embedding.reverse_embeddings).T
    )
    bias = model.logit_bias()  # the suppressed ids' too: never chosen, no mass
    if bias is not None:
        decoder.projection.bias = _numpy(bias)
    return spec


def _tokens(path):
    """A SentencePiece model's pieces in id order."""
    processor = sentencepiece.SentencePieceProcessor(model_file=str(path))
    return [processor.id_to_piece(i) for i in range(processor.get_piece_size())]


def write_ctranslate2(model, directory, vocabulary_paths, quantization=None):
    """Converts `model` (a `layers.Transformer`) into `directory`, with the (source, target)
    SentencePiece models of `vocabulary_paths`; `quantization`: a CTranslate2 weight type
    (int8, float16, ...) or None for float32."""
    spec = transformer_spec(model, *map(_tokens, vocabulary_paths))
    for path in dict.fromkeys(vocabulary_paths):  # a shared vocabulary is copied once
        spec.register_file(str(path))
    spec.validate()
    spec.optimize(quantization=quantization)
    spec.save(str(directory))
