"""Imported M2M100 and NLLB checkpoints compute what transformers computes: the fixtures under
tests/fixtures/hf_m2m (made by bench/hf_m2m_fixtures.py in a venv of its own, with torch and
transformers, which this environment never has) hold small trained checkpoints of both
tokenizer layouts and what transformers gave for them, each sentence with its source and
target language: tokenizer ids, logits for forced targets, greedy and beam ids."""

import json
import re

import numpy as np
import pytest
import tensorflow as tf

from helpers import PROJECT_ROOT
from pipeline.core.errors import UserError
from pipeline.decoding.search import search
from pipeline.decoding.search_options import SearchOptions
from pipeline.decoding.translation import Translator
from pipeline.import_model import import_checkpoint
from pipeline.pretrained import vocabulary
from pipeline.workdir import load_trained

FIXTURES = PROJECT_ROOT / "tests" / "fixtures" / "hf_m2m"
NAMES = ("m2m100", "nllb")
LOGIT_TOLERANCE = 1e-4
ROW_PIECE = re.compile(r"<row(\d+)>")


def expected(name):
    return json.loads((FIXTURES / name / "expected.json").read_text(encoding="utf-8"))


@pytest.fixture(scope="module")
def imported(tmp_path_factory):
    """{fixture name: its work directory}, each imported once, in blocks of a few rows."""
    root = tmp_path_factory.mktemp("imported")
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(vocabulary, "BLOCK_ROWS", 37)
        for name in NAMES:
            import_checkpoint(FIXTURES / name, root / name, log=lambda _: None)
    return {name: root / name for name in NAMES}


def checkpoint_table(name):
    """{token: id} as transformers' tokenizer has it, recorded by the fixture script."""
    return expected(name)["vocabulary"]


class IdMap:
    """The checkpoint's ids of a work directory's ids and back, by the pieces' names."""

    def __init__(self, tokenizer, table, config):
        processor = tokenizer.processor
        specials = {1: table["<unk>"], 2: config["decoder_start_token_id"],
                    3: config["eos_token_id"]}  # fmt: skip
        self.to_checkpoint = {}
        for i in range(processor.get_piece_size()):
            piece = processor.id_to_piece(i)
            if i in specials:
                self.to_checkpoint[i] = specials[i]
            elif i >= 4 and (row := ROW_PIECE.fullmatch(piece)):  # a row no token owns
                self.to_checkpoint[i] = int(row[1])
            elif i >= 4:
                name = piece.split("@")[0] if "@" in piece else piece.lstrip("\u2581")
                found = table.get(piece, table.get(name))
                self.to_checkpoint[i] = table["<unk>"] if found is None else found
        self.to_ours = {}
        for ours, theirs in sorted(self.to_checkpoint.items(), reverse=True):
            self.to_ours[theirs] = ours  # the lowest of our ids for a checkpoint id

    def checkpoint(self, ids):
        return [self.to_checkpoint[i] for i in ids]

    def ours(self, ids):
        return [self.to_ours[i] for i in ids]


def id_map(name, workdir):
    _, _, source_tokenizer, _ = load_trained(workdir)
    config = json.loads((FIXTURES / name / "config.json").read_text(encoding="utf-8"))
    return IdMap(source_tokenizer, checkpoint_table(name), config)


def translator(workdir):
    return Translator.from_trained(load_trained(workdir))


def sources_and_prefixes(name, workdir):
    """The fixture's sentences as the model takes them (each after its source language's
    token) and their target prefixes (the target language's token), as padded id tensors."""
    case = expected(name)
    model_translator = translator(workdir)
    requests = model_translator.requests(case["sentences"], case["target_languages"],
                                         case["source_languages"])  # fmt: skip
    prefixes = model_translator.target_prefixes(case["sentences"], case["target_languages"])
    sources = model_translator.source_tokenizer.tokenize(tf.constant(requests))
    prefix_ids = model_translator.target_tokenizer.tokenize(tf.constant(prefixes))
    return sources, prefix_ids.to_tensor(0)


def outputs(ids, lengths):
    return [
        row[0, : length[0]].tolist() for row, length in zip(np.asarray(ids), np.asarray(lengths))
    ]


@pytest.mark.parametrize("name", NAMES)
def test_sources_and_targets_tokenize_as_transformers_does(imported, name):
    case = expected(name)
    ids = id_map(name, imported[name])
    sources, prefixes = sources_and_prefixes(name, imported[name])
    eos = ids.to_checkpoint[3]
    assert [ids.checkpoint(row) + [eos] for row in sources.to_list()] == case["source_ids"]
    assert [ids.checkpoint([row[0]]) for row in prefixes.numpy().tolist()] == [
        [case["vocabulary"][language_token(name, code)]] for code in case["target_languages"]
    ]


def language_token(name, code):
    return f"__{code}__" if name == "m2m100" else code


@pytest.mark.parametrize("name", NAMES)
def test_logits_for_forced_targets_match_transformers(imported, name):
    _, model, _, _ = load_trained(imported[name])
    ids = id_map(name, imported[name])
    sources, _ = sources_and_prefixes(name, imported[name])
    sources = sources.to_tensor(0)
    columns = [ids.to_ours[j] for j in range(len(ids.to_ours))]
    for forced in expected(name)["forced"]:
        index = forced["sentence_index"]
        target = tf.constant([ids.ours(forced["decoder_input_ids"])])
        source = sources[index : index + 1]
        logits = model.forward({"source_ids": source, "target_input_ids": target})[0].numpy()[0]
        theirs = np.array(forced["logits"], np.float32)
        np.testing.assert_allclose(logits[:, columns], theirs, atol=LOGIT_TOLERANCE, rtol=0)


@pytest.mark.parametrize("name", NAMES)
def test_greedy_and_beam_search_give_generates_ids(imported, name):
    """The whole fixture in one batch, directions mixed, gives what `generate()` gave each
    sentence alone (less the target language token, which the output leaves out)."""
    case = expected(name)
    config, model, _, _ = load_trained(imported[name])
    ids = id_map(name, imported[name])
    sources, prefixes = sources_and_prefixes(name, imported[name])
    sources = sources.to_tensor(0)
    for key, overrides in (("greedy_ids", {"beam_size": 1}), ("beam_ids", {})):
        options = SearchOptions.from_config(config["decode"], **overrides)
        out, lengths, scores, _ = search(model, sources, options, prefixes)
        assert [ids.checkpoint(o) for o in outputs(out, lengths)] == [
            theirs[1:] for theirs in case[key]], key  # fmt: skip
    np.testing.assert_allclose(scores.numpy()[:, 0], case["beam_scores"], atol=1e-4)


def test_the_languages_are_the_checkpoints_codes(imported):
    config, _, _, _ = load_trained(imported["nllb"])
    assert config["data"]["source_language_tags"]["deu_Latn"] == "deu_Latn"
    assert config["model"]["target_language_first"]
    with pytest.raises(ValueError, match="source_language: unknown language 'xx_Latn'"):
        translator(imported["nllb"]).requests(["Ein Hund."], "fra_Latn", "xx_Latn")
    with pytest.raises(ValueError, match="give target_language"):
        translator(imported["m2m100"]).target_prefixes(["Ein Hund."], None)
    texts = translator(imported["m2m100"]).translate(
        ["Ein Hund läuft.", "A dog runs."], target_language=["en", "fr"],
        source_language=["de", "en"],
    )  # fmt: skip
    assert all(texts) and not any("__" in text for text in texts)


def test_an_unsupported_m2m_derivative_is_named(tmp_path):
    import shutil

    copy = tmp_path / "moe"
    shutil.copytree(FIXTURES / "nllb", copy)
    config = json.loads((copy / "config.json").read_text())
    config["num_experts"] = 4
    (copy / "config.json").write_text(json.dumps(config))
    with pytest.raises(UserError, match="num_experts"):
        import_checkpoint(copy, tmp_path / "w", log=lambda _: None)
    assert not (tmp_path / "w").exists()
