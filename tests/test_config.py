"""Configuration: every shipped config loads; bad keys, types and values are refused clearly."""

import importlib.util
import re
import subprocess
import sys
from pathlib import Path

import pytest

from pipeline.config import (
    CORPUS_FIELDS,
    PROJECT_ROOT,
    SCHEMA,
    load_config,
    parse_overrides,
)
from pipeline.core.errors import UserError
from pipeline.core.multilingual import model_languages
from pipeline.model_types import MODEL_TYPES, model_keys

CONFIGS = sorted((PROJECT_ROOT / "configs").glob("*.yaml"))


def write(tmp_path, text, name="experiment.yaml"):
    path = tmp_path / name
    path.write_text(text, encoding="utf-8")
    return path


MINIMAL = "data:\n  train_source: a.de\n  train_target: a.en\n"


@pytest.mark.parametrize("path", CONFIGS, ids=[p.stem for p in CONFIGS])
def test_shipped_configs_load_and_point_at_existing_data(path):
    config = load_config(path)
    for key, value in config["data"].items():
        if key.endswith(("_source", "_target", "_tsv")) and value:
            assert Path(value).is_file(), f"{path.name}: data.{key} -> {value}"


def test_shipped_configs_include_the_required_recipes():
    assert {"default", "smoke", "multi30k_de_en"} <= {p.stem for p in CONFIGS}


def test_paths_resolve_against_the_config_file(tmp_path):
    config = load_config(write(tmp_path, MINIMAL))
    assert config["data"]["train_source"] == str(tmp_path / "a.de")


@pytest.mark.parametrize(
    "text,message",
    [
        (
            MINIMAL + "model:\n  atention: luong_dot\n",
            "unknown key 'model.atention' (did you mean 'model.attention'?)",
        ),
        (MINIMAL + "modle:\n  dropout: 0.1\n", "unknown key 'modle' (did you mean 'model'?)"),
        (MINIMAL + "train:\n  epochs: ten\n", "train.epochs must be an integer, got 'ten'"),
        (MINIMAL + "train:\n  epochs: 2.5\n", "train.epochs must be an integer"),
        (MINIMAL + "model:\n  bidirectional: 1\n", "model.bidirectional must be true or false"),
        (MINIMAL + "train:\n  batch_size: 0\n", "train.batch_size must be at least 1, got 0"),
        (MINIMAL + "model:\n  dropout: 1.5\n", "model.dropout must be at most 1.0"),
        (
            MINIMAL + "model:\n  type: transformer\n  ffn_dropout: -0.1\n",
            "model.ffn_dropout must be at least 0.0",
        ),
        (
            MINIMAL + "model:\n  cell_type: lstn\n",
            "model.cell_type must be one of lstm, gru, simple_rnn",
        ),
        (
            MINIMAL + "model:\n  attention: none\n  input_feeding: true\n",
            "model.input_feeding needs",
        ),
        (
            MINIMAL + "model:\n  attention: multi_head\n  attention_heads: 3\n"
            "  attention_project_values: false\n",
            "model.attention_project_values false needs the encoder output size (512) to divide",
        ),
        ("data:\n  train_source: a.de\n", "data.train_target is missing"),
        ("model:\n  dropout: 0.1\n", "no training data"),
        (MINIMAL + "  train_tsv: a.tsv\n", "alternatives"),
        (MINIMAL + "train: [1, 2]\n", "section 'train' must be a mapping"),
        (MINIMAL + "train:\n  epochs: [1\n", "invalid YAML"),
        (MINIMAL + "train:\n  bleu_every_epochs: 1\n", "needs validation data"),
        (
            MINIMAL + "export:\n  formats: saved_model,tflite\n",
            "export.formats must be a comma-separated subset of saved_model, onnx",
        ),
        (MINIMAL + "export:\n  onnx_opset: 19\n", "export.onnx_opset must be at most 18"),
        (MINIMAL + "  train_corpora: [{tsv: a.tsv}]\n", "data.train_corpora replaces"),
        ("data:\n  train_corpora: a.tsv\n", "data.train_corpora must be a list"),
        ("data:\n  train_corpora: []\n", "data.train_corpora must list at least one corpus"),
        ("data:\n  train_corpora: [{source: a.de}]\n", "data.train_corpora[1]: target is missing"),
        (
            "data:\n  train_corpora: [{tsv: a.tsv}, {tsv: b.tsv, source: b.de}]\n",
            "data.train_corpora[2]: give either tsv or both source and target",
        ),
        (
            "data:\n  train_corpora: [{tsv: a.tsv, wieght: 2}]\n",
            "data.train_corpora[1]: unknown key 'wieght' (did you mean 'weight'?)",
        ),
        (
            "data:\n  train_corpora: [{tsv: a.tsv, weight: 0}]\n",
            "data.train_corpora[1]: weight must be positive",
        ),
        (MINIMAL + "  vocab_sample_size: 0\n", "data.vocab_sample_size must be at least 1"),
        (
            MINIMAL + "  subword_sampling_nbest: 1\n",
            "data.subword_sampling_nbest must be -1 (all segmentations) or at least 2, got 1",
        ),
        (MINIMAL + "train:\n  time_budget_hours: 0\n", "train.time_budget_hours must be above 0"),
        (
            MINIMAL + "train:\n  time_budget_hours: 2\ndistribute:\n  strategy: multi_worker\n",
            "train.time_budget_hours needs a single-process strategy",
        ),
        (
            MINIMAL + "export:\n  onnx_search: greedy\n",
            "export.onnx_search: greedy exports the greedy search alone, but decode.beam_size is 5",
        ),
        (MINIMAL + "export:\n  onnx_search: sample\n", "export.onnx_search must be one of"),
    ],
)
def test_bad_configs_name_the_key_and_the_file(tmp_path, text, message):
    path = write(tmp_path, text)
    with pytest.raises(UserError) as error:
        load_config(path)
    assert message in str(error.value)
    assert str(path) in str(error.value) or "--set" in str(error.value)


def test_corpora_paths_and_weights(tmp_path):
    text = "data:\n  train_corpora:\n    - {source: 'x/*.de.gz', target: 'x/*.en.gz'}\n" \
        "    - {tsv: in-domain.tsv, weight: 3}\n"  # fmt: skip
    corpora = load_config(write(tmp_path, text))["data"]["train_corpora"]
    assert corpora == [
        {"weight": 1.0, "source": str(tmp_path / "x/*.de.gz"),
         "target": str(tmp_path / "x/*.en.gz")},
        {"weight": 3.0, "tsv": str(tmp_path / "in-domain.tsv")},
    ]  # fmt: skip


@pytest.mark.parametrize(
    "data, expected",
    [
        ("train_source: a.de\n  train_target: a.en", {"source": "de", "target": "en"}),
        ("train_source: x/train-*.pt_BR.gz\n  train_target: x/train-*.en.gz",
         {"source": "pt_BR", "target": "en"}),
        ("train_source: a.src\n  train_target: a.en\n  source_language: de",
         {"source": "de", "target": "en"}),
        ("train_source: a.txt\n  train_target: b.txt", {}),
        ("train_tsv: a.tsv\n  target_language: en", {"target": "en"}),
        ("train_corpora:\n    - {source: a.de, target: a.en}\n    - {source: b.de, target: b.fr}",
         {"source": "de"}),
    ],
)  # fmt: skip
def test_languages_are_configured_or_read_from_the_training_file_names(tmp_path, data, expected):
    config = load_config(write(tmp_path, f"data:\n  {data}\n"))
    assert model_languages(config["data"]) == expected


def test_missing_config_file(tmp_path):
    with pytest.raises(UserError, match="configuration file not found"):
        load_config(tmp_path / "nope.yaml")


def test_overrides_take_yaml_values_and_win(tmp_path):
    path = write(tmp_path, MINIMAL + "train:\n  epochs: 4\n")
    config = load_config(
        path, ["train.epochs=7", "model.attention=luong_general", "train.clip_norm=null"]
    )
    assert config["train"]["epochs"] == 7
    assert config["model"]["attention"] == "luong_general"
    assert config["train"]["clip_norm"] is None
    assert parse_overrides(["train.seed=3", "a.b=x"]) == {"train": {"seed": 3}, "a": {"b": "x"}}
    assert load_config(path, ["train.learning_rate=1e-3"])["train"]["learning_rate"] == 1e-3


@pytest.mark.parametrize(
    "override,message",
    [
        ("train.epoch=3", "--set: unknown key 'train.epoch' (did you mean 'train.epochs'?)"),
        ("epochs=3", "expected SECTION.KEY=VALUE"),
        ("train.epochs", "expected SECTION.KEY=VALUE"),
        ("train.epochs=0", "--set: train.epochs must be at least 1"),
    ],
)
def test_bad_overrides(tmp_path, override, message):
    with pytest.raises(UserError) as error:
        load_config(write(tmp_path, MINIMAL), [override])
    assert message in str(error.value)


def test_command_line_reports_one_line_and_exit_status_2(tmp_path):
    path = write(tmp_path, MINIMAL + "train:\n  epochz: 3\n")
    result = subprocess.run(
        [
            sys.executable,
            "-m",
            "pipeline.train",
            "--config",
            str(path),
            "--workdir",
            str(tmp_path / "w"),
        ],
        capture_output=True,
        text=True,
        cwd=PROJECT_ROOT,
    )
    assert result.returncode == 2
    assert "Traceback" not in result.stderr
    assert result.stderr.strip().splitlines()[-1] == (
        f"error: {path}: unknown key 'train.epochz' (did you mean 'train.epochs'?)"
    )


def declared_keys():
    """(section, key, Field) of every key of every section, the model keys of every model type
    (each once) and the keys of a data.train_corpora entry (section "train_corpora")."""
    keys = [(section, key, field) for section, fields in SCHEMA.items()
            for key, field in fields.items()]  # fmt: skip
    model = {key: field for name in MODEL_TYPES for key, field in model_keys(name).items()}
    keys += [("model", key, field) for key, field in model.items()]
    keys += [("train_corpora", key, field) for key, field in CORPUS_FIELDS.items()]
    return keys


def test_every_key_has_a_one_line_meaning():
    """What docs/configuration.md says of each key: one line, lowercase, no final period."""
    wrong = [
        f"{section}.{key}: {field.meaning!r}"
        for section, key, field in declared_keys()
        if not field.meaning.strip()
        or "\n" in field.meaning
        or len(field.meaning) > 120
        or field.meaning.endswith(".")
        or field.meaning[0].isupper()
    ]
    assert not wrong, wrong


def config_reference():
    """tools/config_reference.py as a module."""
    path = PROJECT_ROOT / "tools" / "config_reference.py"
    spec = importlib.util.spec_from_file_location("config_reference", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_the_configuration_reference_is_up_to_date():
    page = (PROJECT_ROOT / "docs" / "configuration.md").read_text(encoding="utf-8")
    assert page == config_reference().page(), (
        "docs/configuration.md differs from the declarations: run "
        "python tools/config_reference.py --write"
    )


def test_the_configuration_reference_lists_every_key_in_its_section():
    page = (PROJECT_ROOT / "docs" / "configuration.md").read_text(encoding="utf-8")
    parts = dict(re.findall(r"^#+ ([^\n]+)\n(.*?)(?=^#|\Z)", page, re.M | re.S))
    assert [name for name in parts if name.isidentifier()] == [
        "data", "model", "train", "decode", "distribute", "distill", "export"
    ]  # fmt: skip
    rows = {name: re.findall(r"^\| `(\w+)` \|", text, re.M) for name, text in parts.items()}
    rows["model"] = rows.pop("Every model type")
    for name, model_type in MODEL_TYPES.items():
        assert rows.pop(f"`type: {name}`") == list(model_type.keys)
        rows["model"] += list(model_type.keys)
    rows["train_corpora"] = re.findall(r"^- `(\w+)`: ", parts["data"], re.M)
    declared = {}
    for section, key, _ in declared_keys():
        declared.setdefault(section, []).append(key)
    assert {name: keys for name, keys in rows.items() if keys} == declared


def test_the_configuration_reference_checks_and_writes_the_page(tmp_path, monkeypatch, capsys):
    reference = config_reference()
    monkeypatch.setattr(reference, "PAGE", tmp_path / "docs" / "configuration.md")
    assert reference.main(["--check"]) == 1  # no page yet
    assert capsys.readouterr().err == (
        "docs/configuration.md is out of date: run python tools/config_reference.py --write\n"
    )
    assert reference.main(["--write"]) == 0
    assert reference.PAGE.read_text(encoding="utf-8") == reference.page()
    assert reference.main(["--check"]) == 0
    reference.PAGE.write_text(reference.page().replace("| `epochs` |", "| `epoch` |"))
    assert reference.main(["--check"]) == 1
