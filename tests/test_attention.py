"""Attention layers: shapes, Keras masks, beams, the published score functions (Bahdanau et
al., 2015; Luong et al., 2015). Masking, both query ranks, serialisation and gradients:
test_layer_harness."""

import math

import keras
import numpy as np
import pytest

import layers
from helpers import ATTENTION_FACTORIES

DIM = 8
MASK = np.array([[1, 1, 1, 0, 0], [1, 1, 1, 1, 1], [1, 0, 0, 0, 0]], bool)


@pytest.fixture
def inputs(rng):
    memory = rng.normal(size=(3, 5, DIM)).astype("float32")
    step_query = rng.normal(size=(3, DIM)).astype("float32")
    all_queries = rng.normal(size=(3, 4, DIM)).astype("float32")
    return memory, step_query, all_queries


@pytest.fixture(params=sorted(ATTENTION_FACTORIES))
def attention(request):
    return ATTENTION_FACTORIES[request.param]()


def test_public_names():
    for name in [
        "BahdanauAttention",
        "LuongAttention",
        "ScaledDotProductAttention",
        "MultiHeadCrossAttention",
        "RecurrentEncoder",
        "AttentionDecoder",
        "RecurrentSeq2Seq",
    ]:
        assert hasattr(layers, name)


def test_shapes_for_both_query_ranks(attention, inputs):
    memory, step_query, all_queries = inputs
    context, weights = attention(step_query, memory, memory_mask=MASK)
    assert context.shape == (3, DIM) and weights.shape == (3, 5)
    context, weights = attention(all_queries, memory, memory_mask=MASK)
    assert context.shape == (3, 4, DIM) and weights.shape == (3, 4, 5)
    expected = attention.compute_output_shape((3, 4, DIM), (3, 5, DIM))
    assert (tuple(context.shape), tuple(weights.shape)) == expected


def test_keras_mask_on_memory_is_used(attention, inputs):
    memory, step_query, _ = inputs
    expected, _ = attention(step_query, memory, memory_mask=MASK)
    masked_memory = keras.layers.Masking()(np.where(MASK[..., None], memory, 0.0))
    context, weights = attention(step_query, masked_memory)
    np.testing.assert_allclose(context, expected, atol=1e-6)
    assert np.all(np.asarray(weights)[~MASK] == 0.0)


def test_a_step_with_k_queries_per_source_equals_repeating_the_memory(attention, inputs):
    """Beam search passes k hypotheses per source, grouped by source, with the untiled cache."""
    memory, _, all_queries = inputs
    attention(all_queries, memory, memory_mask=MASK)  # builds the layer
    k = all_queries.shape[1]
    grouped = all_queries.reshape(3 * k, DIM)  # rows i*k ... i*k+k-1 belong to source i
    context, weights = attention.attend(grouped, attention.precompute(memory), MASK)
    repeated = np.repeat(memory, k, axis=0)
    tiled_context, tiled_weights = attention.attend(
        grouped, attention.precompute(repeated), np.repeat(MASK, k, axis=0)
    )
    assert context.shape == (3 * k, DIM) and weights.shape == (3 * k, 5)
    np.testing.assert_allclose(context, tiled_context, atol=1e-5)
    np.testing.assert_allclose(weights, tiled_weights, atol=1e-6)


# The seeds' score functions, checked against numpy.


def _softmax(x):
    e = np.exp(x - x.max(-1, keepdims=True))
    return e / e.sum(-1, keepdims=True)


@pytest.mark.parametrize("depth_scaling", [True, False])
def test_luong_dot_is_softmax_of_inner_products(inputs, depth_scaling):
    memory, step_query, _ = inputs
    attention = layers.LuongAttention("dot", depth_scaling=depth_scaling)
    context, weights = attention(step_query, memory)
    scale = 1 / math.sqrt(DIM) if depth_scaling else 1.0
    expected = _softmax(scale * np.einsum("bd,bsd->bs", step_query, memory))
    np.testing.assert_allclose(weights, expected, atol=1e-6)
    np.testing.assert_allclose(context, np.einsum("bs,bsd->bd", expected, memory), atol=1e-5)


@pytest.mark.parametrize("depth_scaling", [True, False])
def test_luong_general_is_bilinear(inputs, depth_scaling):
    memory, step_query, _ = inputs
    attention = layers.LuongAttention("general", depth_scaling=depth_scaling)
    _, weights = attention(step_query, memory)
    w = attention.key_projection.kernel.numpy()  # maps memory to the query space
    scale = 1 / math.sqrt(DIM) if depth_scaling else 1.0
    expected = _softmax(scale * np.einsum("bq,bsm,mq->bs", step_query, memory, w))
    np.testing.assert_allclose(weights, expected, atol=1e-5)


def test_a_luong_layer_saved_before_depth_scaling_keeps_its_unscaled_score():
    config = layers.LuongAttention("general").get_config()
    assert config.pop("depth_scaling") is True
    assert layers.LuongAttention.from_config(config).depth_scaling is False


def test_bahdanau_is_additive(inputs):
    memory, step_query, _ = inputs
    attention = layers.BahdanauAttention(6)
    _, weights = attention(step_query, memory)
    wq = attention.query_projection.kernel.numpy()
    wk = attention.key_projection.kernel.numpy()
    v = attention.v.numpy()
    hidden = np.tanh((step_query @ wq)[:, None, :] + memory @ wk)
    np.testing.assert_allclose(weights, _softmax(hidden @ v), atol=1e-5)


def test_bahdanau_normalized_score_ignores_the_scale_of_v(inputs):
    memory, step_query, _ = inputs
    attention = layers.BahdanauAttention(6, normalize=True)
    _, weights = attention(step_query, memory)
    attention.v.assign(attention.v * 10.0)
    _, rescaled = attention(step_query, memory)
    np.testing.assert_allclose(weights, rescaled, atol=1e-6)
    np.testing.assert_allclose(float(attention.g.numpy()), math.sqrt(1 / 6), rtol=1e-6)


def test_scaled_dot_product_divides_by_sqrt_depth(inputs):
    memory, step_query, _ = inputs
    _, weights = layers.ScaledDotProductAttention()(step_query, memory)
    expected = _softmax(np.einsum("bd,bsd->bs", step_query, memory) / math.sqrt(DIM))
    np.testing.assert_allclose(weights, expected, atol=1e-6)


def test_multi_head_weights_average_the_heads(inputs):
    memory, step_query, _ = inputs
    attention = layers.MultiHeadCrossAttention(num_heads=2, key_dim=4, use_bias=False)
    _, weights = attention(step_query, memory, memory_mask=MASK)
    q = (step_query @ attention.query_projection.kernel.numpy()).reshape(3, 2, 4)
    k = (memory @ attention.key_projection.kernel.numpy()).reshape(3, 5, 2, 4)
    scores = np.einsum("bhd,bshd->bhs", q, k) / 2.0
    scores = np.where(MASK[:, None, :], scores, -np.inf)
    np.testing.assert_allclose(weights, _softmax(scores).mean(1), atol=1e-5)


def test_multi_head_without_value_projection_mixes_the_memorys_slices(inputs):
    """Head h's context is its weights' mix of the h-th slice of the memory's own features."""
    memory, step_query, _ = inputs
    attention = layers.MultiHeadCrossAttention(2, 4, use_bias=False, project_values=False)
    context, _ = attention(step_query, memory, memory_mask=MASK)
    q = (step_query @ attention.query_projection.kernel.numpy()).reshape(3, 2, 4)
    k = (memory @ attention.key_projection.kernel.numpy()).reshape(3, 5, 2, 4)
    scores = np.where(MASK[:, None, :], np.einsum("bhd,bshd->bhs", q, k) / 2.0, -np.inf)
    heads = np.einsum("bhs,bshd->bhd", _softmax(scores), memory.reshape(3, 5, 2, DIM // 2))
    expected = heads.reshape(3, DIM) @ attention.output_projection.kernel.numpy()
    np.testing.assert_allclose(context, expected, atol=1e-5)
    with pytest.raises(ValueError, match="divide by num_heads"):
        layers.MultiHeadCrossAttention(3, 4, project_values=False)(step_query, memory)


@pytest.mark.parametrize(
    "make",
    [
        lambda: layers.ScaledDotProductAttention(4, qk_norm=True),
        lambda: layers.MultiHeadCrossAttention(2, 4, use_bias=False, qk_norm=True),
    ],
    ids=["scaled_dot", "multi_head"],
)
def test_qk_norm_scores_are_normalised_projections(make, inputs):
    """score = LN(W_q q) . LN(W_k k) / sqrt(d): blind to the scale of queries and keys (up to
    LayerNorm's epsilon), each normalised projection of mean 0 and variance 1 (gains at 1)."""
    memory, step_query, _ = inputs
    attention = make()
    _, weights = attention(step_query, memory, memory_mask=MASK)
    # Far from LayerNorm's epsilon (1e-3 of the variance), the scale changes nothing.
    _, larger = attention(5.0 * step_query, 5.0 * memory, memory_mask=MASK)
    _, largest = attention(50.0 * step_query, 20.0 * memory, memory_mask=MASK)
    np.testing.assert_allclose(largest, larger, atol=1e-4)

    def normalised(x):  # per head (a trailing axis of 4)
        x = x.reshape(*x.shape[:-1], -1, 4)
        return (x - x.mean(-1, keepdims=True)) / np.sqrt(x.var(-1, keepdims=True) + 1e-3)

    q = normalised(step_query @ attention.query_projection.kernel.numpy())
    k = normalised(memory @ attention.key_projection.kernel.numpy())
    scores = np.einsum("bhd,bshd->bhs", q, k) / 2.0
    expected = _softmax(np.where(MASK[:, None, :], scores, -np.inf)).mean(1)
    np.testing.assert_allclose(weights, expected, atol=1e-5)


def test_luong_scale_multiplies_the_score(inputs):
    memory, step_query, _ = inputs
    attention = layers.LuongAttention("dot", scale=True)
    attention(step_query, memory)
    attention.gain.assign(3.0)
    _, weights = attention(step_query, memory)
    expected = _softmax(3.0 / math.sqrt(DIM) * np.einsum("bd,bsd->bs", step_query, memory))
    np.testing.assert_allclose(weights, expected, atol=1e-5)


def test_fully_masked_source_gives_zero_context(attention, inputs):
    memory, step_query, _ = inputs
    mask = MASK.copy()
    mask[2] = False
    context, weights = attention(step_query, memory, memory_mask=mask)
    assert np.all(np.asarray(weights)[2] == 0.0)
    if not isinstance(attention, layers.MultiHeadCrossAttention):  # its output layer has a bias
        assert np.all(np.asarray(context)[2] == 0.0)


def test_bad_arguments_are_refused(inputs):
    memory, _, _ = inputs
    with pytest.raises(ValueError, match="score"):
        layers.LuongAttention("cosine")
    with pytest.raises(ValueError, match="score='general'"):
        layers.LuongAttention("dot")(np.zeros((3, 4), "float32"), memory)
    with pytest.raises(ValueError, match="projection_dim"):
        layers.ScaledDotProductAttention()(np.zeros((3, 4), "float32"), memory)
    with pytest.raises(ValueError, match="qk_norm=True"):
        layers.ScaledDotProductAttention(qk_norm=True)


# Attention of the default recipe's model at initialisation, on the activations its own
# layers produce (a source of 20 tokens): every score starts close to uniform. Luong's dot and
# general scores, unscaled, started at 0.65 of the uniform entropy and went one-hot within
# 100 Adam steps, costing 11-15 BLEU (bench/RESULTS.md, "Attention scores").
RECIPE_ATTENTIONS = {
    "bahdanau": [],
    "bahdanau_normalized": ["model.attention_normalize=true"],
    "luong_dot": ["model.decoder_units=512"],
    "luong_general": [],
    "luong_concat": [],
    "scaled_dot": [],
    "multi_head": [],
}


@pytest.mark.parametrize("name", sorted(RECIPE_ATTENTIONS))
def test_the_default_models_attention_starts_spread_out(name):
    from pipeline.config import PROJECT_ROOT, load_config
    from pipeline.model_types.builder import build_model
    from pipeline.training.trainer import _initialise_uniformly

    overrides = [f"model.attention={name.removesuffix('_normalized')}", *RECIPE_ATTENTIONS[name]]
    config = load_config(PROJECT_ROOT / "configs" / "default.yaml", overrides)
    model = build_model(config, 4000, 4000)
    rng = np.random.default_rng(0)
    inputs = {
        "source_ids": rng.integers(4, 4000, size=(8, 20)).astype("int32"),
        "target_input_ids": rng.integers(4, 4000, size=(8, 12)).astype("int32"),
    }
    # Both starts: the layers' own initialisers, then the recipe's uniform draw over them.
    for start in ("the layers' initialisers", "train.init_uniform"):
        if start == "train.init_uniform":
            _initialise_uniformly(model, config["train"]["init_uniform"], config["train"]["seed"])
        _, weights = model.forward(inputs, training=False)
        weights = weights.numpy().astype("float64")
        entropy = -(weights * np.log(np.maximum(weights, 1e-30))).sum(-1) / math.log(20)
        # Scores of unit variance (the scaled dot product's design point, which QK-norm starts
        # at) give 0.87 of uniform over 20 positions; the unscaled Luong scores that went
        # one-hot, 0.65.
        assert entropy.mean() > 0.85, f"{name}, {start}: entropy {entropy.mean():.2f} of uniform"
