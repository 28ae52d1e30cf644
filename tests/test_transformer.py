"""The Transformer: its layers, incremental decoding with the cache, learning, the pipeline's
commands and export parity, on the same contract as the recurrent models."""

import json

import keras
import numpy as np
import onnx
import onnxruntime
import pytest
import tensorflow as tf

import layers
from export.onnx_rewrites import subgraphs
from helpers import (
    padded_ids,
    real_sentences,
    reversal_data,
    search_onnx,
    search_saved_model,
)
from pipeline.config import PROJECT_ROOT, load_config
from pipeline.core.errors import UserError
from pipeline.decoding.search import beam_search, greedy_search
from pipeline.decoding.translation import SearchOptions, Translator
from pipeline.model_types.training_twins import TrainingTransformer
from pipeline.workdir import load_trained

VOCAB = 20
DIM = 16


def make_transformer(**overrides):
    options = dict(model_dim=DIM, num_heads=2, ffn_dim=32, encoder_layers=2,
                   decoder_layers=2, dropout=0.0)  # fmt: skip
    options.update(overrides)
    model = layers.Transformer(VOCAB, VOCAB, **options)
    model.build({"source_ids": (None, None), "target_input_ids": (None, None)})
    return model


def test_causal_self_attention_reads_the_present_and_caches_only_the_positions_stepped(rng):
    """Causality and step-by-step decoding: test_layer_harness."""
    attention = layers.CausalSelfAttention(num_heads=2, key_dim=4)
    x = rng.normal(size=(2, 6, 8)).astype("float32")
    full = np.asarray(attention(x))
    changed_future = x.copy()
    changed_future[:, 3:] = rng.normal(size=(2, 3, 8))
    assert not np.allclose(np.asarray(attention(changed_future))[:, 3:], full[:, 3:])

    cache = attention.initial_cache(2)
    for t in range(6):  # one position at a time: the caches grow by one
        _, cache = attention.step(x[:, t], cache)
        assert cache[0].shape == (2, 2, 4, t + 1) and cache[1].shape == (2, 2, t + 1, 4)


@pytest.mark.parametrize(
    "overrides",
    [
        {},
        {
            "positions": "learned",
            "max_positions": 16,
            "tie_embeddings": False,
            "embedding_norm": True,
        },
        {"normalize_first": False},
    ],
)
def test_incremental_decoding_gives_the_full_pass_logits(rng, overrides):
    """The cache holds every earlier position's keys and values: decoding one token at a
    time gives the logits and cross-attention of a full forward pass over the prefix."""
    model = make_transformer(**overrides)
    x, _ = reversal_data(rng, 6, VOCAB)
    logits, weights = model.forward(x)
    encoded = model.encode(x["source_ids"])
    targets = x["target_input_ids"]
    state = model.initial_decoder_state(encoded)
    for t in range(targets.shape[1]):
        step_logits, state, step_weights = model.decode_step(targets[:, t], state, encoded, t)
        np.testing.assert_allclose(step_logits, logits[:, t], atol=1e-4)
        np.testing.assert_allclose(step_weights, weights[:, t], atol=1e-5)
    padding = x["source_ids"] == 0
    assert np.all(np.asarray(weights)[np.broadcast_to(padding[:, None], weights.shape)] == 0)


def test_embedding_norm_normalises_each_positions_embedding_on_both_sides(rng):
    ids = rng.integers(4, VOCAB, size=(3, 7))
    normed, plain = make_transformer(embedding_norm=True), make_transformer()
    for side in ("source", "target"):
        parts = [getattr(normed, f"{side}_{part}") for part in ("embedding", "positions",
                                                                 "embedding_norm")]  # fmt: skip
        x = np.asarray(normed._embed(*parts, ids))
        np.testing.assert_allclose(x.mean(-1), 0, atol=1e-5)
        np.testing.assert_allclose(x.std(-1), 1, atol=1e-2)  # gain 1 and shift 0 at first
    assert plain.source_embedding_norm is None
    y = np.asarray(plain._embed(plain.source_embedding, plain.source_positions, None, ids))
    assert np.abs(y.std(-1) - 1).max() > 0.05


@pytest.mark.parametrize(
    "rates",
    [
        {"attention_dropout": 0.5},
        {"ffn_dropout": 0.5},
        {"attention_dropout": 0.0, "ffn_dropout": 0.0},
    ],
)
def test_each_dropout_rate_drops_only_where_it_is_named(rng, rates):
    """With every other rate at 0, training-mode logits differ from inference exactly when
    the named rate is not 0; in the encoder it reaches keras-hub's attention layer."""
    model = make_transformer(dropout=0.0, **rates)
    for layer in model.encoder_layers:
        assert layer._self_attention_layer.dropout == model.attention_dropout_rate
    x, _ = reversal_data(rng, 4, VOCAB)
    training = np.asarray(model.forward(x, training=True)[0])
    inference = np.asarray(model.forward(x)[0])
    assert np.allclose(training, inference, atol=1e-6) == (not any(rates.values()))


def test_the_encoder_layers_attention_dropout_is_its_own(rng):
    """keras-hub's layer drops its attention weights and sublayer outputs at one rate; ours
    at two, either of which may be 0."""
    x = rng.normal(size=(2, 5, 8)).astype("float32")
    for dropout, attention_dropout in ((0.0, 0.5), (0.5, 0.0), (0.0, 0.0)):
        layer = layers.TransformerEncoderLayer(
            16, 2, dropout=dropout, attention_dropout=attention_dropout
        )
        unchanged = np.allclose(layer(x, training=True), layer(x), atol=1e-6)
        assert unchanged == (dropout == attention_dropout == 0.0)
        assert layer._self_attention_layer.dropout == attention_dropout
        assert layer._feedforward_dropout.rate == layer.dropout == dropout
    assert layers.TransformerEncoderLayer(16, 2, dropout=0.3).attention_dropout == 0.3


def test_a_sentence_does_not_depend_on_its_batch(rng):
    model = make_transformer()
    x, _ = reversal_data(rng, 16, VOCAB)
    batched = np.asarray(model(x))
    for i in range(4):
        source, target = x["source_ids"][i : i + 1], x["target_input_ids"][i : i + 1]
        src_len, tgt_len = (source != 0).sum(), (target != 0).sum()
        alone = model({"source_ids": source[:, :src_len], "target_input_ids": target[:, :tgt_len]})
        np.testing.assert_allclose(alone[0], batched[i, :tgt_len], atol=1e-5)


def test_learns_to_reverse_sequences_and_searches_find_it(rng):
    x, y = reversal_data(rng, 3000, VOCAB)
    x_test, y_test = reversal_data(rng, 200, VOCAB)
    model = make_transformer(model_dim=32, num_heads=4, ffn_dim=64)
    model.compile(optimizer=keras.optimizers.Adam(3e-3))
    # 8 epochs reached 0.942 on an AVX2-only CPU (enough on the earlier AVX-512 VMs).
    model.fit(x, y, batch_size=64, epochs=10, verbose=0)
    results = model.evaluate(x_test, y_test, verbose=0, return_dict=True)
    assert results["token_accuracy"] >= 0.95, results

    source = x_test["source_ids"][:50]
    expected = y_test[:50]
    greedy_ids = greedy_search(model, source, expected.shape[1])[0].numpy()
    beam_ids = beam_search(model, source, expected.shape[1], beam_size=4)[0].numpy()[:, 0]
    for ids in (greedy_ids, beam_ids):
        exact = [np.array_equal(i[: (e != 0).sum()], e[e != 0]) for i, e in zip(ids, expected)]
        assert np.mean(exact) >= 0.8, np.mean(exact)


@pytest.mark.parametrize("tie_embeddings", [True, False])
def test_the_training_twin_has_the_models_loss_metrics_and_gradients(rng, tie_embeddings):
    """Training projects the real positions only, a block at a time: the same objective."""
    model = make_transformer(tie_embeddings=tie_embeddings, label_smoothing=0.1)
    twin = TrainingTransformer.from_config(model.get_config())
    twin.build({"source_ids": (None, None), "target_input_ids": (None, None)})
    twin.set_weights(model.get_weights())
    source, target = rng.integers(4, VOCAB, (2, 4, 7))
    source[0, 5:] = target[1, 3:] = target[2, 6:] = 0  # right-padded rows
    inputs = {"source_ids": source, "target_input_ids": target}
    labels = np.roll(target, -1, axis=1)
    results = []
    for each in (model, twin):
        with tf.GradientTape() as tape:
            loss = each.compute_loss(y=labels, y_pred=each(inputs))
        gradients = tape.gradient(loss, each.trainable_variables)
        metrics = [float(each.token_accuracy.result()), float(each.perplexity.result())]
        results.append((float(loss), metrics, gradients))
    (loss, metrics, gradients), (twin_loss, twin_metrics, twin_gradients) = results
    assert twin_loss == pytest.approx(loss, rel=1e-5)
    np.testing.assert_allclose(twin_metrics, metrics, rtol=1e-5)
    for ours, plain in zip(twin_gradients, gradients):
        np.testing.assert_allclose(tf.convert_to_tensor(ours), tf.convert_to_tensor(plain),
                                   atol=1e-5)  # fmt: skip


def test_save_and_load(tmp_path, rng):
    x, y = reversal_data(rng, 64, VOCAB)
    model = make_transformer(label_smoothing=0.1, dropout=0.1)
    model.compile(optimizer="adam")
    model.fit(x, y, batch_size=32, epochs=1, verbose=0)
    model.save(tmp_path / "model.keras")
    loaded = keras.saving.load_model(tmp_path / "model.keras")
    assert type(loaded) is layers.Transformer
    assert json.dumps(loaded.get_config(), sort_keys=True) == json.dumps(
        model.get_config(), sort_keys=True
    )
    np.testing.assert_allclose(loaded.predict(x, verbose=0), model.predict(x, verbose=0), atol=1e-6)


def test_bad_arguments_and_configs_are_refused(tmp_path):
    with pytest.raises(ValueError, match="positions"):
        make_transformer(positions="rotary")
    with pytest.raises(ValueError, match="divisible"):
        make_transformer(model_dim=18, num_heads=4)
    smoke = PROJECT_ROOT / "configs" / "smoke_transformer.yaml"
    with pytest.raises(UserError, match="model.model_dim .* model.num_heads"):
        load_config(smoke, ["model.num_heads=3"])
    with pytest.raises(UserError, match="train.sampling_schedule"):
        load_config(smoke, ["train.sampling_schedule=linear"])
    with pytest.raises(UserError, match="model.max_positions"):
        load_config(smoke, ["model.positions=learned", "model.max_positions=30"])


@pytest.fixture(scope="module")
def workdir(exported_transformer_workdir):
    return exported_transformer_workdir


@pytest.fixture(scope="module")
def loaded(workdir):
    return tf.saved_model.load(str(workdir / "export" / "saved_model" / "translator" / "1"))


def test_trained_transformer_translates_like_its_saved_model(workdir, loaded):
    config, model, source_tokenizer, target_tokenizer = load_trained(workdir)
    assert type(model) is layers.Transformer
    translator = Translator(
        model, source_tokenizer, target_tokenizer, SearchOptions.from_config(config["decode"])
    )
    sentences = real_sentences(12)
    in_process = translator.translate(sentences)
    served = loaded.signatures["serving_default"](sentences=tf.constant(sentences))
    assert [t.decode() for t in served["translations"].numpy()] == in_process
    assert any(len(text.split()) > 1 for text in in_process)  # a real, multi-token output


def test_onnx_gives_the_saved_models_ids(workdir, loaded):
    path = workdir / "export" / "onnx" / "model.onnx"
    # Each decoder step normalises with one node per norm (see `fuse_layer_norms`).
    step = list(subgraphs(onnx.load(str(path)).graph))[-1]
    in_norms = [node.op_type for node in step.node if "norm" in node.name]
    assert in_norms == ["LayerNormalization"] * 4  # 3 in the decoder layer, then the last
    session = onnxruntime.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    rng = np.random.default_rng(5)
    batches = [rng.integers(4, 300, size=(3, 7)).astype(np.int32)]
    batches[0][1, 4:] = 0
    sentences = real_sentences(40)
    batches += [padded_ids(workdir, sentences[i : i + 10]) for i in range(0, 40, 10)]
    settings = [{}, {"beam_size": np.int32(3), "n_best": np.int32(2)}, {"beam_size": np.int32(1)}]
    for i, source_ids in enumerate(batches):
        options = settings[i % len(settings)]
        expected = search_saved_model(loaded, source_ids, **options)
        actual = search_onnx(session, source_ids, **options)
        np.testing.assert_array_equal(actual["ids"], expected["ids"])
        np.testing.assert_allclose(actual["scores"], expected["scores"], atol=1e-4)
        np.testing.assert_allclose(actual["attention"], expected["attention"], atol=1e-4)
