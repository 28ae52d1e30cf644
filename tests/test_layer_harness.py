"""Every layer in `layers/` through the shared checks of `layer_harness`: one `LayerCase` per
layer configuration, one test per case and check that applies to it."""

import keras
import numpy as np
import pytest
import tensorflow as tf

import layers
from helpers import ATTENTION_FACTORIES, BOS, reversal_data
from layer_harness import CHECKS, LayerCase, Masking

VOCAB = 20
SOURCE_MASK = np.array([[1, 1, 1, 0, 0], [1, 1, 1, 1, 1], [1, 0, 0, 0, 0]], bool)
TARGET_MASK = np.array([[1, 1, 1, 1], [1, 1, 0, 0], [1, 1, 1, 0]], bool)  # right-padded


def noise_at(values, keep, rng):
    """`values` `[batch, time, ...]` with large noise wherever `keep` `[batch, time]` is False."""
    noise = 100 * rng.normal(size=values.shape)
    return np.where(keep[..., None], values, noise).astype(values.dtype)


def other_tokens_at(token_ids, keep, rng):
    """`token_ids` with other (non-padding) tokens wherever `keep` is False."""
    return np.where(keep, token_ids, rng.integers(4, VOCAB, size=token_ids.shape)).astype("int32")


def at_real(mask):
    """The invariant of a masking check: every output (but a missing one) at `mask`'s
    positions (its first two axes)."""
    return lambda inputs, outputs: [np.asarray(o)[mask] for o in outputs if o is not None]


def stack_steps(steps):
    """Per-step output tuples -> one tuple of outputs stacked along the time axis."""
    return tuple(np.stack(outputs, axis=1) for outputs in zip(*steps))


# Attention over an encoded source: a query of rank 3 or, one decoder step, of rank 2.


def attention_inputs(rng):
    return {
        "query": rng.normal(size=(3, 4, 8)).astype("float32"),
        "memory": rng.normal(size=(3, 5, 8)).astype("float32"),
        "memory_mask": SOURCE_MASK,
    }


def attention_forward(layer, inputs):
    return layer(inputs["query"], inputs["memory"], memory_mask=inputs["memory_mask"])


def attention_steps(layer, inputs):
    """A rank-2 query `[batch, dim]` per target position."""
    positions = range(inputs["query"].shape[1])
    return stack_steps(
        attention_forward(layer, {**inputs, "query": inputs["query"][:, t]}) for t in positions
    )


SOURCE_PADDING = Masking(
    perturb=lambda inputs, rng: {**inputs, "memory": noise_at(inputs["memory"], SOURCE_MASK, rng)},
    invariant=lambda inputs, outputs: outputs,
    weights=lambda outputs: outputs[1],
    source_mask=lambda inputs: inputs["memory_mask"],
)


def attention_case(name, make_layer):
    return LayerCase(
        name, make_layer, attention_inputs, attention_forward, SOURCE_PADDING, attention_steps
    )


# Recurrent encoder, bridge and decoder.


def extra_padding(token_ids):
    """Three more padding columns."""
    return np.pad(token_ids, [(0, 0), (0, 3)])


def source_inputs(rng):
    source_ids = rng.integers(4, VOCAB, size=SOURCE_MASK.shape) * SOURCE_MASK
    return {"source_ids": source_ids.astype("int32")}


def source_encoder_case(name, make_layer):
    return LayerCase(
        name,
        make_layer,
        source_inputs,
        lambda layer, inputs: layer(inputs["source_ids"]),
        masking=Masking(
            # Extra padding columns: outputs at real tokens, final states and mask unchanged.
            perturb=lambda inputs, rng: {"source_ids": extra_padding(inputs["source_ids"])},
            invariant=lambda inputs, outputs: [
                np.asarray(outputs[0])[:, :5][SOURCE_MASK],
                outputs[1],
                np.asarray(outputs[2])[:, :5],
            ],
        ),
        gradient_inputs=(),  # token ids
        skip={"steps": "an encoder reads the whole source; it has no step"},
    )


def encoder_case(name, **options):
    return source_encoder_case(
        f"encoder_{name}", lambda: layers.RecurrentEncoder(VOCAB, 4, 6, num_layers=2, **options)
    )


def bridge_inputs(rng):
    return {name: rng.normal(size=(3, 6)).astype("float32") for name in ("h0", "c0", "h1", "c1")}


def bridge_case(kind, target_state_sizes, skip_gradients=None):
    skip = {"masking": "states have no positions", "steps": "states have no positions"}
    if skip_gradients:
        skip["gradients"] = skip_gradients
    return LayerCase(
        f"bridge_{kind}",
        lambda: layers.StateBridge(kind, target_state_sizes),
        bridge_inputs,
        lambda layer, i: layer(((i["h0"], i["c0"]), (i["h1"], i["c1"]))),
        skip=skip,
    )


def decoder_inputs(rng):
    target_ids = rng.integers(4, VOCAB, size=TARGET_MASK.shape) * TARGET_MASK
    target_ids[:, 0] = BOS
    return {
        "target_ids": target_ids.astype("int32"),
        "memory": rng.normal(size=(3, 5, 12)).astype("float32"),
        "memory_mask": SOURCE_MASK,
    }


TARGET_AND_SOURCE_PADDING = Masking(
    perturb=lambda inputs, rng: {
        "target_ids": other_tokens_at(inputs["target_ids"], TARGET_MASK, rng),
        "memory": noise_at(inputs["memory"], SOURCE_MASK, rng),
        "memory_mask": SOURCE_MASK,
    },
    invariant=at_real(TARGET_MASK),
    weights=lambda outputs: outputs[1],
    source_mask=lambda inputs: inputs["memory_mask"],
)


def decoder_case(name, attention, gradient_inputs=None, **options):
    return LayerCase(
        f"decoder_{name}",
        lambda: layers.AttentionDecoder(VOCAB, 5, 8, attention=attention(), **options),
        decoder_inputs,
        lambda layer, i: layer(i["target_ids"], i["memory"], memory_mask=i["memory_mask"]),
        masking=TARGET_AND_SOURCE_PADDING,
        gradient_inputs=gradient_inputs,
        # One step carries the recurrent state: test_attention_decoder checks teacher forcing
        # against `step()` in every mode, from random initial states.
        skip={"steps": "test_attention_decoder::test_teacher_forcing_equals_step_by_step"},
    )


# Transformer decoder sublayers.


def sequence_inputs(rng):
    return {"x": rng.normal(size=(3, 4, 8)).astype("float32")}


def fused_forward(layer, inputs):
    """Training mode, the fused recurrence's; source-padded as the encoder's inputs are."""
    return layer(inputs["x"], mask=SOURCE_MASK[:, :4], training=True)


def fused_steps(layer, inputs):
    """Keras' cell one step at a time, the states kept at masked steps."""
    x, mask = inputs["x"], SOURCE_MASK[:, :4, None]
    states = [
        np.zeros((x.shape[0], layer.units), "float32") for _ in np.atleast_1d(layer.cell.state_size)
    ]
    outputs = []
    for t in range(x.shape[1]):
        _, new_states = layer.cell(x[:, t], states)
        states = [
            np.where(mask[:, t], np.asarray(new), old) for new, old in zip(new_states, states)
        ]
        outputs.append(states[0])
    return np.stack(outputs, axis=1), *states


def fused_case(name, fused_class):
    return LayerCase(
        name,
        lambda: fused_class(6, return_sequences=True, return_state=True),
        sequence_inputs,
        fused_forward,
        masking=Masking(
            perturb=lambda inputs, rng: {"x": noise_at(inputs["x"], SOURCE_MASK[:, :4], rng)},
            # The outputs at real steps and the final states.
            invariant=lambda inputs, outputs: [
                np.asarray(outputs[0])[SOURCE_MASK[:, :4]],
                *outputs[1:],
            ],
        ),
        steps=fused_steps,
    )


def causal_steps(layer, inputs):
    x = inputs["x"]
    cache = layer.initial_cache(x.shape[0])
    outputs = []
    for t in range(x.shape[1]):
        output, cache = layer.step(x[:, t], cache)
        outputs.append(output)
    return np.stack(outputs, axis=1)


ENCODER_MASK = SOURCE_MASK[:, :4]


def encoder_layer_forward(layer, inputs):
    """The outputs and the self-attention weights `[batch, heads, src_len, src_len]`."""
    return layer(inputs["x"], padding_mask=ENCODER_MASK, return_attention_scores=True)


def decoder_layer_inputs(rng):
    return {
        **sequence_inputs(rng),
        "memory": rng.normal(size=(3, 5, 8)).astype("float32"),
        "memory_mask": SOURCE_MASK,
    }


def decoder_layer_forward(layer, inputs):
    x, memory = inputs["x"], inputs["memory"]
    if not layer.built:  # `precompute` needs the cross-attention, made by `build`
        layer.build(tuple(x.shape), tuple(memory.shape))
    return layer(x, layer.precompute(memory), inputs["memory_mask"])


def decoder_layer_steps(layer, inputs):
    x, mask = inputs["x"], inputs["memory_mask"]
    cache = layer.initial_cache(x.shape[0])
    memory_cache = layer.precompute(inputs["memory"])
    steps = []
    for t in range(x.shape[1]):
        output, cache, weights = layer.step(x[:, t], cache, memory_cache, mask)
        steps.append((output, weights))
    return stack_steps(steps)


def decoder_layer_case(name, **options):
    return LayerCase(
        f"transformer_decoder_layer_{name}",
        lambda: layers.TransformerDecoderLayer(16, 2, **options),
        decoder_layer_inputs,
        decoder_layer_forward,
        masking=Masking(
            perturb=lambda inputs, rng: {
                **inputs,
                "x": noise_at(inputs["x"], TARGET_MASK, rng),
                "memory": noise_at(inputs["memory"], SOURCE_MASK, rng),
            },
            invariant=at_real(TARGET_MASK),
            weights=lambda outputs: outputs[1],
            source_mask=lambda inputs: inputs["memory_mask"],
        ),
        steps=decoder_layer_steps,
    )


# Whole encoder-decoder models: saving and gradients (and configs, for free).


def built(model):
    model.build({"source_ids": (None, None), "target_input_ids": (None, None)})
    return model


def recurrent_model():
    encoder = layers.RecurrentEncoder(VOCAB, 6, 4, bidirectional=True)
    decoder = layers.AttentionDecoder(VOCAB, 6, 8, attention=layers.BahdanauAttention(8))
    return built(layers.RecurrentSeq2Seq(encoder, decoder))


def recurrent_model_with_transformer_encoder():
    encoder = layers.SelfAttentionEncoder(VOCAB, 6, num_heads=2, ffn_dim=12)
    decoder = layers.AttentionDecoder(VOCAB, 6, 8, attention=layers.BahdanauAttention(8))
    return built(layers.RecurrentSeq2Seq(encoder, decoder))


def recurrent_model_with_convolutional_encoder():
    encoder = layers.ConvolutionalEncoder(VOCAB, 6, num_layers=2)
    decoder = layers.AttentionDecoder(VOCAB, 6, 8, attention=layers.BahdanauAttention(8))
    return built(layers.RecurrentSeq2Seq(encoder, decoder))


def transformer(**options):
    return lambda: built(
        layers.Transformer(VOCAB, VOCAB, model_dim=8, num_heads=2, ffn_dim=16,
                           encoder_layers=1, decoder_layers=1, dropout=0.0, **options)
    )  # fmt: skip


def model_masking_invariant(inputs, outputs):
    """Logits and attention at real target positions, over the source's first columns."""
    real_targets = inputs["target_input_ids"] != 0
    logits, weights = (np.asarray(o) for o in outputs)
    return [logits[real_targets], weights[:, :, : inputs["source_ids"].shape[1]][real_targets]]


def model_case(name, make_model):
    return LayerCase(
        name,
        make_model,
        lambda rng: reversal_data(rng, 3, VOCAB, max_len=5)[0],
        lambda model, inputs: model.forward(inputs),
        masking=Masking(
            perturb=lambda inputs, rng: {
                "source_ids": extra_padding(inputs["source_ids"]),
                "target_input_ids": other_tokens_at(
                    inputs["target_input_ids"], inputs["target_input_ids"] != 0, rng
                ),
            },
            invariant=model_masking_invariant,
            weights=lambda outputs: outputs[1],
            source_mask=lambda inputs: inputs["source_ids"] != 0,
        ),
        skip={
            "steps": "decode_step: test_seq2seq::test_decode_step_contract_matches_teacher_"
            "forcing, test_transformer::test_incremental_decoding_gives_the_full_pass_logits",
        },
    )


CASES = [
    *(attention_case(name, make) for name, make in ATTENTION_FACTORIES.items()),
    fused_case("fused_gru", layers.FusedGRU),
    fused_case("fused_lstm", layers.FusedLSTM),
    encoder_case("lstm"),
    encoder_case("lstm_bidirectional", bidirectional=True),
    encoder_case(
        "gru_bidirectional_sum_residual_reversed",
        cell_type="gru",
        bidirectional=True,
        merge_mode="sum",
        residual=True,
        reverse_source=True,
    ),
    source_encoder_case(
        "self_attention_encoder",
        lambda: layers.SelfAttentionEncoder(VOCAB, 8, num_layers=2, num_heads=2, ffn_dim=16),
    ),
    source_encoder_case(
        "convolutional_encoder",
        lambda: layers.ConvolutionalEncoder(VOCAB, 8, num_layers=2, kernel_size=3, dropout=0.1),
    ),
    bridge_case("dense", ((5,),)),
    bridge_case("copy", ((6, 6), (6, 6))),
    bridge_case("zero", ((4, 4),), skip_gradients="zeros whatever the encoder's states"),
    decoder_case(
        "multi_head_input_feeding",
        lambda: layers.MultiHeadCrossAttention(2, 4),
        num_layers=2,
        residual=True,
        attention_vector_size=6,
        dropout=0.1,
    ),
    decoder_case(
        "bahdanau_input_feeding", lambda: layers.BahdanauAttention(7), num_layers=2, residual=True
    ),
    decoder_case(
        "bahdanau_fused",
        lambda: layers.BahdanauAttention(7),
        num_layers=2,
        residual=True,
        input_feeding=False,
    ),
    # The fixed-vector decoder reads no memory: the source reaches it through its state.
    decoder_case(
        "no_attention",
        lambda: None,
        gradient_inputs=(),
        cell_type="simple_rnn",
        input_feeding=False,
    ),
    LayerCase(
        "causal_self_attention",
        lambda: layers.CausalSelfAttention(num_heads=2, key_dim=4),
        sequence_inputs,
        lambda layer, inputs: layer(inputs["x"]),
        # Targets are right-padded: later (padded) positions change no earlier output.
        masking=Masking(
            perturb=lambda inputs, rng: {"x": noise_at(inputs["x"], TARGET_MASK, rng)},
            invariant=lambda inputs, outputs: [np.asarray(outputs)[TARGET_MASK]],
        ),
        steps=causal_steps,
    ),
    LayerCase(
        "transformer_encoder_layer",
        lambda: layers.TransformerEncoderLayer(16, 2, attention_dropout=0.0, dropout=0.1),
        sequence_inputs,
        encoder_layer_forward,
        masking=Masking(
            perturb=lambda inputs, rng: {"x": noise_at(inputs["x"], ENCODER_MASK, rng)},
            invariant=lambda inputs, outputs: [np.asarray(outputs[0])[ENCODER_MASK]],
            weights=lambda outputs: outputs[1],
            source_mask=lambda inputs: ENCODER_MASK,
        ),
        skip={"steps": "an encoder layer reads the whole source at once"},
    ),
    LayerCase(
        "split_sine_positions",
        lambda: layers.SplitSinePositions(max_positions=6, layout="fairseq"),
        sequence_inputs,
        lambda layer, inputs: layer(inputs["x"]),
        # The encodings depend on positions alone: nothing at a padded position changes them.
        masking=Masking(
            perturb=lambda inputs, rng: {"x": noise_at(inputs["x"], TARGET_MASK, rng)},
            invariant=lambda inputs, outputs: [np.asarray(outputs)[TARGET_MASK]],
        ),
        steps=lambda layer, inputs: tf.concat(
            [layer(inputs["x"][:, t : t + 1], start_index=t) for t in range(inputs["x"].shape[1])],
            axis=1,
        ),
        skip={"gradients": "a fixed table: no weights, and no gradient to its inputs"},
    ),
    LayerCase(
        "sixteen_bit_dropout",
        lambda: layers.SixteenBitDropout(0.3, seed=1),
        sequence_inputs,
        # Inference (the identity): in training each call draws a new mask. The training
        # behaviour is tests/test_sixteen_bit_dropout.py's.
        lambda layer, inputs: layer(inputs["x"], training=False),
        masking=Masking(
            perturb=lambda inputs, rng: {"x": noise_at(inputs["x"], ENCODER_MASK, rng)},
            invariant=lambda inputs, outputs: [np.asarray(outputs)[ENCODER_MASK]],
        ),
        skip={"steps": "element-wise: it has no step"},
    ),
    decoder_layer_case("pre_norm"),
    decoder_layer_case("post_norm", normalize_first=False, attention_dropout=0.0, ffn_dropout=0.2),
    model_case("recurrent_seq2seq", recurrent_model),
    model_case("recurrent_seq2seq_transformer_encoder", recurrent_model_with_transformer_encoder),
    model_case(
        "recurrent_seq2seq_convolutional_encoder", recurrent_model_with_convolutional_encoder
    ),
    model_case("transformer", transformer()),
    model_case(
        "transformer_imported_options",
        transformer(
            positions="sinusoidal_halves",
            max_positions=12,
            tie_embeddings=False,
            normalize_first=False,
            activation="silu",
            output_bias=True,
            source_eos=True,
            scale_embeddings=False,
            decoder_num_heads=4,
            decoder_ffn_dim=12,
            suppressed_ids=[0, 2],
        ),  # fmt: skip
    ),
    model_case(
        "transformer_learned_untied_post_norm",
        transformer(
            positions="learned", max_positions=8, tie_embeddings=False, normalize_first=False
        ),
    ),
]


@pytest.mark.parametrize(
    "case,check",
    [pytest.param(c, check, id=f"{c.name}-{check}") for c in CASES for check in c.checks()],
)
def test_layer(case, check, rng, tmp_path):
    CHECKS[check](case, rng, tmp_path)


# Abstract bases, with no configuration of their own. (SamplingSchedule is no layer.)
ABSTRACT = {layers.SourceAttention, layers.EncoderDecoderModel}


def test_every_public_layer_has_a_case():
    public = {getattr(layers, name) for name in layers.__all__}
    public_layers = {c for c in public if issubclass(c, keras.layers.Layer)} - ABSTRACT
    covered = {type(case.make_layer()) for case in CASES}
    assert public_layers <= covered, sorted(c.__name__ for c in public_layers - covered)
