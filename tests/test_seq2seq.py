"""RecurrentSeq2Seq: learning, the decoding contract, batch independence, saving and loading."""

import json
import zipfile

import keras
import numpy as np
import pytest

import layers
from helpers import reversal_data

VOCAB = 20


def make_model(attention="bahdanau", input_feeding=False, units=32, **kwargs):
    attention_layer = {
        "bahdanau": lambda: layers.BahdanauAttention(units),
        "bahdanau_normalized": lambda: layers.BahdanauAttention(units, normalize=True),
        "luong_general": lambda: layers.LuongAttention("general"),
        "luong_dot": lambda: layers.LuongAttention("dot", scale=True),
        "luong_concat": lambda: layers.LuongAttention("concat"),
        "scaled_dot": lambda: layers.ScaledDotProductAttention(16, project_values=True),
        "multi_head": lambda: layers.MultiHeadCrossAttention(2, 8),
        None: lambda: None,
    }[attention]()
    encoder = layers.RecurrentEncoder(VOCAB, 16, units // 2, bidirectional=True)
    decoder = layers.AttentionDecoder(
        VOCAB, 16, units, attention=attention_layer, input_feeding=input_feeding
    )
    return layers.RecurrentSeq2Seq(encoder, decoder, **kwargs)


@pytest.mark.parametrize("attention,input_feeding", [("bahdanau", False), ("luong_general", True)])
def test_learns_to_reverse_sequences(rng, attention, input_feeding):
    x, y = reversal_data(rng, 3000, VOCAB)
    x_test, y_test = reversal_data(rng, 300, VOCAB)
    model = make_model(attention, input_feeding)
    model.compile(optimizer=keras.optimizers.Adam(1e-2))
    model.fit(x, y, batch_size=64, epochs=4, verbose=0)
    results = model.evaluate(x_test, y_test, verbose=0, return_dict=True)
    assert results["token_accuracy"] >= 0.95, results
    assert results["perplexity"] < 1.3, results


def test_scheduled_sampling_and_label_smoothing_train(rng):
    x, y = reversal_data(rng, 640, VOCAB)
    model = make_model(
        "bahdanau",
        input_feeding=True,
        label_smoothing=0.1,
        scheduled_sampling=layers.SamplingSchedule("linear", probability=0.5, decay_steps=20),
    )
    model.compile(optimizer=keras.optimizers.Adam(1e-2))
    history = model.fit(x, y, batch_size=64, epochs=3, verbose=0).history
    assert history["loss"][-1] < history["loss"][0]
    assert float(model.scheduled_sampling(model.optimizer.iterations)) == pytest.approx(0.5)


def test_loss_is_the_mean_over_real_target_tokens(rng):
    x, y = reversal_data(rng, 8, VOCAB)
    model = make_model("luong_general")
    logits = model(x)
    loss = float(model.compute_loss(x, y, logits))
    log_probs = np.asarray(keras.ops.log_softmax(logits, axis=-1))
    mask = y != 0
    expected = -np.take_along_axis(log_probs, y[..., None], -1)[..., 0][mask].mean()
    assert loss == pytest.approx(expected, rel=1e-5)


@pytest.mark.parametrize("input_feeding", [False, True])
def test_decode_step_contract_matches_teacher_forcing(rng, input_feeding):
    x, _ = reversal_data(rng, 4, VOCAB)
    model = make_model("bahdanau", input_feeding=input_feeding)
    logits, weights = model.forward(x)
    encoded = model.encode(x["source_ids"])
    state = model.initial_decoder_state(encoded)
    targets = x["target_input_ids"]
    for t in range(targets.shape[1]):
        step_logits, state, step_weights = model.decode_step(targets[:, t], state, encoded)
        np.testing.assert_allclose(step_logits, logits[:, t], atol=1e-5)
        np.testing.assert_allclose(step_weights, weights[:, t], atol=1e-6)


@pytest.mark.parametrize("input_feeding", [False, True])
def test_a_sentence_does_not_depend_on_its_batch(rng, input_feeding):
    x, _ = reversal_data(rng, 16, VOCAB)
    model = make_model("luong_general", input_feeding=input_feeding)
    batched = np.asarray(model(x))
    for i in range(4):
        source = x["source_ids"][i : i + 1]
        target = x["target_input_ids"][i : i + 1]
        src_len, tgt_len = (source != 0).sum(), (target != 0).sum()
        alone = model({"source_ids": source[:, :src_len], "target_input_ids": target[:, :tgt_len]})
        np.testing.assert_allclose(alone[0], batched[i, :tgt_len], atol=1e-5)


@pytest.mark.parametrize(
    "attention",
    [
        "bahdanau",
        "bahdanau_normalized",
        "luong_general",
        "luong_dot",
        "luong_concat",
        "scaled_dot",
        "multi_head",
        None,
    ],
)
def test_save_and_load(tmp_path, rng, attention):
    x, _ = reversal_data(rng, 64, VOCAB)
    model = make_model(
        attention, input_feeding=attention is not None, label_smoothing=0.1, bridge="dense"
    )
    model(x)  # built: its random weights must come back, not a fresh draw
    path = tmp_path / "model.keras"
    model.save(path)
    loaded = keras.saving.load_model(path)  # safe_mode stays on
    assert type(loaded) is layers.RecurrentSeq2Seq
    # JSON is what a .keras file keeps: tuples come back as lists.
    assert json.dumps(loaded.get_config(), sort_keys=True) == json.dumps(
        model.get_config(), sort_keys=True
    )
    np.testing.assert_allclose(loaded.predict(x, verbose=0), model.predict(x, verbose=0), atol=1e-6)
    encoded = loaded.encode(x["source_ids"])
    logits, _, _ = loaded.decode_step(
        x["target_input_ids"][:, 0], loaded.initial_decoder_state(encoded), encoded
    )
    np.testing.assert_allclose(logits, model(x)[:, 0], atol=1e-5)


def test_a_model_saved_as_seq2seq_loads_as_recurrent_seq2seq(tmp_path, rng):
    """`.keras` files written before the rename name the class "Seq2Seq"."""
    x, _ = reversal_data(rng, 8, VOCAB)
    model = make_model()
    model.predict(x, verbose=0)
    model.save(tmp_path / "new.keras")
    with (
        zipfile.ZipFile(tmp_path / "new.keras") as new,
        zipfile.ZipFile(tmp_path / "old.keras", "w") as old,
    ):
        for item in new.infolist():
            data = new.read(item)
            if item.filename == "config.json":
                config = json.loads(data)
                assert config["class_name"] == "RecurrentSeq2Seq"
                config.update(class_name="Seq2Seq", registered_name="seq2seq>Seq2Seq")
                data = json.dumps(config).encode()
            old.writestr(item, data)
    loaded = keras.saving.load_model(tmp_path / "old.keras")
    assert type(loaded) is layers.RecurrentSeq2Seq
    np.testing.assert_allclose(loaded.predict(x, verbose=0), model.predict(x, verbose=0), atol=1e-6)
    with pytest.warns(DeprecationWarning, match="RecurrentSeq2Seq"):
        assert layers.Seq2Seq is layers.RecurrentSeq2Seq


def test_bad_arguments_are_refused():
    with pytest.raises(ValueError, match="label_smoothing"):
        make_model(label_smoothing=1.0)
    with pytest.raises(ValueError, match="bridge"):
        make_model(bridge="mlp")
