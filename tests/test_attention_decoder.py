"""AttentionDecoder: teacher forcing agrees with step-by-step decoding, in every mode, and the
hand-differentiated input-feeding loop with the generic one."""

import keras
import numpy as np
import pytest
import tensorflow as tf

import layers

TARGET = np.array([[2, 5, 6, 7], [2, 9, 0, 0], [2, 4, 4, 0]], np.int32)
MEMORY_MASK = np.array([[1, 1, 1, 0, 0], [1, 1, 1, 1, 1], [1, 0, 0, 0, 0]], bool)


@pytest.fixture
def memory(rng):
    return rng.normal(size=(3, 5, 12)).astype("float32")


def make_decoder(attention="luong", input_feeding=True, cell_type="lstm", num_layers=2, **kwargs):
    attention_layer = {
        "luong": lambda: layers.LuongAttention("general"),
        "bahdanau": lambda: layers.BahdanauAttention(7),
        "multi_head": lambda: layers.MultiHeadCrossAttention(2, 4),
        None: lambda: None,
    }[attention]()
    return layers.AttentionDecoder(
        vocab_size=15,
        embedding_dim=5,
        units=8,
        num_layers=num_layers,
        cell_type=cell_type,
        attention=attention_layer,
        input_feeding=input_feeding,
        residual=num_layers > 1,
        **kwargs,
    )


def step_by_step(decoder, memory, initial_state):
    cache = decoder.precompute(memory)
    state = initial_state
    all_logits, all_weights = [], []
    for t in range(TARGET.shape[1]):
        logits, state, weights = decoder.step(TARGET[:, t], state, cache, MEMORY_MASK)
        all_logits.append(logits)
        all_weights.append(weights)
    weights = None if all_weights[0] is None else np.stack(all_weights, 1)
    return np.stack(all_logits, 1), weights


@pytest.mark.parametrize(
    "attention,input_feeding,cell_type",
    [
        ("luong", True, "lstm"),
        ("luong", False, "lstm"),
        ("bahdanau", True, "gru"),
        ("bahdanau", False, "gru"),
        ("multi_head", False, "simple_rnn"),
        (None, False, "lstm"),
    ],
)
def test_teacher_forcing_equals_step_by_step(memory, attention, input_feeding, cell_type, rng):
    decoder = make_decoder(attention, input_feeding, cell_type)
    cells = tuple(
        tuple(rng.normal(size=(3, size)).astype("float32") for size in layer)
        for layer in decoder.state_sizes
    )
    state = decoder.initial_state(cells)
    logits, weights = decoder(TARGET, memory, memory_mask=MEMORY_MASK, initial_state=state)
    assert logits.shape == (3, 4, 15)
    step_logits, step_weights = step_by_step(decoder, memory, state)
    np.testing.assert_allclose(logits, step_logits, atol=1e-5)
    if attention is None:
        assert weights is None and step_weights is None
    else:
        assert weights.shape == (3, 4, 5)
        np.testing.assert_allclose(weights, step_weights, atol=1e-6)


def test_sampling_probability_zero_is_teacher_forcing(memory):
    decoder = make_decoder("bahdanau", input_feeding=False)
    fused, _ = decoder(TARGET, memory, memory_mask=MEMORY_MASK)
    looped, _ = decoder(TARGET, memory, memory_mask=MEMORY_MASK, sampling_probability=0.0)
    np.testing.assert_allclose(fused, looped, atol=1e-5)


def test_sampling_probability_one_feeds_model_samples(memory):
    decoder = make_decoder("luong", input_feeding=True)
    forced, _ = decoder(TARGET, memory, memory_mask=MEMORY_MASK)
    sampled, _ = decoder(TARGET, memory, memory_mask=MEMORY_MASK, sampling_probability=1.0)
    # The first step always reads <s>; later steps read sampled tokens instead of the targets.
    np.testing.assert_allclose(forced[:, 0], sampled[:, 0], atol=1e-5)
    assert not np.allclose(forced[:, 1:], sampled[:, 1:])


def test_input_feeding_widens_the_first_layer(memory):
    fed = make_decoder("luong", input_feeding=True, num_layers=1)
    plain = make_decoder("luong", input_feeding=False, num_layers=1)
    fed(TARGET, memory)
    plain(TARGET, memory)
    assert fed.recurrent_layers[0].cell.kernel.shape == (5 + 8, 32)
    assert plain.recurrent_layers[0].cell.kernel.shape == (5, 32)


def test_input_feeding_needs_attention():
    with pytest.raises(ValueError, match="input_feeding"):
        layers.AttentionDecoder(15, 5, 8, attention=None, input_feeding=True)


def test_its_defaults_build_a_decoder_input_feeding_where_it_attends():
    assert not layers.AttentionDecoder(15, 5, 8).input_feeding
    assert layers.AttentionDecoder(
        15, 5, 8, attention=layers.LuongAttention("general")
    ).input_feeding


def training_pass_and_gradients(decoder, memory, cells, sampling_probability=None):
    """Logits, weights and the gradients of every input and weight in a training pass (a
    sampling probability of 0 takes the generic step loop and changes nothing else)."""
    memory, cells = tf.constant(memory), tf.nest.map_structure(tf.constant, cells)
    with tf.GradientTape() as tape:
        tape.watch([memory, cells])
        logits, weights = decoder(
            TARGET, memory, memory_mask=MEMORY_MASK, initial_state=decoder.initial_state(cells),
            sampling_probability=sampling_probability, training=True,
        )  # fmt: skip
        # Weights that differ by position, so that no error cancels out; the attention
        # weights get a gradient of their own, as an alignment loss would give them.
        loss = tf.reduce_sum(tf.sin(logits)) + tf.reduce_sum(weights * tf.cos(tf.range(5.0)))
    gradients = tape.gradient(loss, [memory, cells, decoder.trainable_variables])
    return [logits, weights, *tf.nest.flatten(gradients)]


@pytest.mark.parametrize(
    "num_layers,score,scale", [(1, "general", True), (2, "general", False), (3, "dot", True)]
)
def test_the_hand_differentiated_input_feeding_loop_equals_the_generic_one(
    rng, num_layers, score, scale
):
    units = 12 if score == "dot" else 8  # dot: the decoder as wide as the memory
    decoder = layers.AttentionDecoder(
        15, 5, units, num_layers=num_layers, cell_type="lstm",
        attention=layers.LuongAttention(score, scale=scale), residual=num_layers > 1,
    )  # fmt: skip
    memory = rng.normal(size=(3, 5, 12)).astype("float32")
    cells = tuple(
        tuple(rng.normal(size=(3, size)).astype("float32") for size in layer)
        for layer in decoder.state_sizes
    )
    decoder(TARGET, memory, memory_mask=MEMORY_MASK, initial_state=decoder.initial_state(cells))
    if scale:
        decoder.attention.gain.assign(1.7)
    assert decoder._hand_differentiated_loop_applies()
    hand = training_pass_and_gradients(decoder, memory, cells)
    generic = training_pass_and_gradients(decoder, memory, cells, sampling_probability=0.0)
    assert len(hand) == 2 + 1 + 2 * num_layers + len(decoder.trainable_variables)
    for a, b in zip(hand, generic, strict=True):
        np.testing.assert_allclose(tf.convert_to_tensor(a), tf.convert_to_tensor(b), atol=2e-5)


def test_the_hand_differentiated_loop_drops_out_and_compiles(memory):
    decoder = make_decoder("luong", input_feeding=True, num_layers=2, dropout=0.5)
    decoder(TARGET, memory)
    assert decoder._hand_differentiated_loop_applies()

    @tf.function
    def compiled(memory):
        with tf.GradientTape() as tape:
            tape.watch(memory)
            logits, _ = decoder(TARGET, memory, memory_mask=MEMORY_MASK, training=True)
            loss = tf.reduce_sum(logits**2)
        return logits, tape.gradient(loss, [memory, decoder.trainable_variables])

    (first, gradients), (second, _) = compiled(memory), compiled(memory)
    assert all(np.isfinite(tf.convert_to_tensor(g)).all() for g in tf.nest.flatten(gradients))
    assert not np.allclose(first, second)  # fresh masks at each call
    inference, _ = decoder(TARGET, memory, memory_mask=MEMORY_MASK)
    stepped, _ = step_by_step(decoder, memory, decoder.zero_state(3))
    np.testing.assert_allclose(inference, stepped, atol=1e-5)


@pytest.mark.parametrize(
    "attention,cell_type,options",
    [("bahdanau", "lstm", {}), ("luong", "gru", {}), ("luong", "lstm", {"activation": "relu"})],
)
def test_other_input_feeding_decoders_take_the_generic_loop(memory, attention, cell_type, options):
    decoder = make_decoder(attention, input_feeding=True, cell_type=cell_type)
    decoder(TARGET, memory)
    for layer in decoder.recurrent_layers:
        for name, value in options.items():
            setattr(layer.cell, name, keras.activations.get(value))
    assert not decoder._hand_differentiated_loop_applies()


@pytest.mark.parametrize("policy", ["float32", "mixed_bfloat16"])
def test_a_steps_token_lookup_is_the_embedding_layers(policy):
    from layers.recurrent_layers import token_embedding, token_lookup

    keras.mixed_precision.set_global_policy(policy)
    try:
        embedding = token_embedding(12, 4)
        ids = tf.constant([3, 0, 11, 3])
        expected = embedding(ids)
        actual = token_lookup(embedding, ids)
    finally:
        keras.mixed_precision.set_global_policy("float32")
    assert actual.dtype == expected.dtype == embedding.compute_dtype
    np.testing.assert_array_equal(actual, expected)
