"""Ensembles: several models of one vocabulary decoding as one (`pipeline.model_types.ensemble`)
in process, in the commands, and exported as one SavedModel and one ONNX model."""

import json
import re

import numpy as np
import pytest
import tensorflow as tf

from export import __main__ as export_command
from export.runtime import OnnxTranslator
from helpers import SMOKE
from pipeline import evaluate, score, train, translate
from pipeline.config import PROJECT_ROOT
from pipeline.core.errors import UserError
from pipeline.data.corpus import read_lines
from pipeline.decoding.translation import Translator
from pipeline.model_types.ensemble import Ensemble
from pipeline.workdir import load_ensemble, load_trained

QUICK = ["--set", "train.bleu_every_epochs=0", "--set", "data.test_source=null",
         "--set", "data.test_target=null", "--set", "export.after_training=false"]  # fmt: skip
SENTENCES = read_lines(PROJECT_ROOT / "data" / "multi30k" / "val.de.gz")[:12]


@pytest.fixture(scope="module")
def members(exported_workdir, tmp_path_factory):
    """The shared recurrent smoke model and an LSTM trained on the same data: the vocabulary
    is built from the same sample, so the two share it."""
    lstm = tmp_path_factory.mktemp("lstm_member")
    train.main(["--config", str(SMOKE), "--workdir", str(lstm), *QUICK,
                "--set", "train.steps_per_epoch=40", "--set", "model.cell_type=lstm"])  # fmt: skip
    return [exported_workdir, lstm]


@pytest.fixture(scope="module")
def ensemble_export(members, tmp_path_factory):
    out = tmp_path_factory.mktemp("ensemble_export")
    export_command.main(["--ensemble", *map(str, members), "--weights", "2", "1",
                         "--output", str(out)])  # fmt: skip
    return out


def translator(loaded, beam_size):
    return Translator.from_trained(loaded, batch_size=64, beam_size=beam_size)


@pytest.mark.parametrize("beam_size", [1, 5])
def test_an_ensemble_of_one_translates_as_its_model(exported_workdir, beam_size):
    config, model, *tokenizers = load_trained(exported_workdir)
    alone = translator((config, model, *tokenizers), beam_size).hypotheses(SENTENCES)
    one = translator((config, Ensemble([model]), *tokenizers), beam_size).hypotheses(SENTENCES)
    for a, b in zip(alone, one, strict=True):
        assert a[0].text == b[0].text
        assert a[0].score == pytest.approx(b[0].score, abs=1e-4)


def test_the_step_log_probabilities_are_the_weighted_mean_of_the_members(members):
    _, ensemble, source_tokenizer, _ = load_ensemble(members, [3, 1])
    assert ensemble.weights == [0.75, 0.25]
    source_ids = source_tokenizer.tokenize(tf.constant(SENTENCES[:3])).to_tensor()
    encoded = ensemble.encode(source_ids)
    state = ensemble.initial_decoder_state(encoded)
    tokens = tf.fill([3], ensemble.bos_id)
    mixed, _, attention = ensemble.decode_step(tokens, state, encoded, 0)
    expected = 0
    for weight, member in zip((0.75, 0.25), ensemble.members, strict=True):
        encoded_alone = member.encode(source_ids)
        logits, _, _ = member.decode_step(tokens, member.initial_decoder_state(encoded_alone),
                                          encoded_alone, 0)  # fmt: skip
        expected += weight * tf.nn.log_softmax(logits)
    np.testing.assert_allclose(mixed, expected, atol=1e-5)
    assert attention.shape == source_ids.shape


@pytest.mark.parametrize("beam_size", [1, 5])
def test_the_exported_ensemble_gives_the_in_process_ensembles_translations(
    members, ensemble_export, beam_size
):
    in_process = translator(load_ensemble(members, [2, 1]), beam_size)
    expected = in_process.translate(SENTENCES)
    onnx = OnnxTranslator(ensemble_export / "onnx", batch_size=64)
    assert onnx.translate(SENTENCES, beam_size=beam_size) == expected  # batched
    assert [onnx.translate([s], beam_size=beam_size)[0] for s in SENTENCES[:4]] == expected[:4]


def test_the_saved_models_default_search_translates_as_the_ensemble(members, ensemble_export):
    expected = Translator.from_trained(load_ensemble(members, [2, 1]), 64).translate(SENTENCES)
    saved = tf.saved_model.load(str(ensemble_export / "saved_model" / "translator" / "1"))
    texts = saved.signatures["serving_default"](sentences=tf.constant(SENTENCES))
    assert [t.decode() for t in texts["translations"].numpy()] == expected


def test_the_ensembles_model_json_names_its_members_and_counts_their_parameters(
    members, ensemble_export
):
    description = json.loads((ensemble_export / "onnx" / "model.json").read_text())["description"]
    assert description["name"] == f"ensemble of {members[0].name}, {members[1].name}"
    counts = [load_trained(member)[1].count_params() for member in members]
    assert description["parameters"] == sum(counts)
    assert [m["name"] for m in description["members"]] == [m.name for m in members]
    assert [m["properties"]["cell_type"] for m in description["members"]] == ["gru", "lstm"]


def test_the_commands_take_several_work_directories(members, tmp_path, capsys):
    source = tmp_path / "source.txt"
    source.write_text("".join(s + "\n" for s in SENTENCES[:4]), encoding="utf-8")
    translate.main(["--workdir", str(members[0]), "--workdir", str(members[1]),
                    "--input", str(source), "--output", str(tmp_path / "out.txt")])  # fmt: skip
    expected = translator(load_ensemble(members), 5).translate(SENTENCES[:4])
    assert (tmp_path / "out.txt").read_text(encoding="utf-8").splitlines() == expected
    evaluate.main(["--workdir", str(members[0]), "--workdir", str(members[1]),
                   "--split", "valid", "--beam-size", "1"])  # fmt: skip
    report = json.loads((members[0] / "eval_valid.ensemble-of-2.json").read_text())
    assert report["ensemble"]["weights"] == [0.5, 0.5] and report["perplexity"] > 1
    capsys.readouterr()
    score.main(["--workdir", str(members[0]), "--workdir", str(members[1]),
                "--source", str(source), "--target", str(source)])  # fmt: skip
    assert len(capsys.readouterr().out.splitlines()) == 4


def test_members_of_another_vocabulary_and_bad_weights_are_refused(members, tmp_path):
    other = tmp_path / "other"
    train.main(["--config", str(SMOKE), "--workdir", str(other), *QUICK,
                "--set", "train.steps_per_epoch=1", "--set", "train.epochs=1",
                "--set", "data.target_vocab_size=250"])  # fmt: skip
    with pytest.raises(UserError, match=re.escape(
        f"{other}: its target vocabulary differs from {members[0]}'s (250 pieces against 300)"
    )):  # fmt: skip
        load_ensemble([members[0], other])
    with pytest.raises(UserError, match="1 weights for 2 models"):
        load_ensemble(members, [1.0])
    with pytest.raises(UserError, match="ensemble weights must be above 0"):
        load_ensemble(members, [1.0, 0.0])
    with pytest.raises(UserError, match="an ensemble's export needs --output"):
        from export.exporter import export_model

        export_model(members[0], ensemble=[members[1]])
