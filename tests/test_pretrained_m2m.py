"""Imported M2M100, NLLB and mBART-50 checkpoints compute what transformers computes: the
fixtures under tests/fixtures/hf_m2m (made by tools/hf_m2m_fixtures.py in a venv of its own,
with torch and transformers, which this environment never has) hold small trained checkpoints
of the three tokenizer layouts and what transformers gave for them, each sentence with its
source and target language: tokenizer ids, logits for forced targets, greedy and beam ids."""

import json
import re
import subprocess

import numpy as np
import pytest
import tensorflow as tf

from helpers import PROJECT_ROOT, run_python
from layers.transformer import NEVER
from pipeline.core.errors import UserError
from pipeline.decoding.search import search
from pipeline.decoding.search_options import CAPPED_HYPOTHESES, SearchOptions
from pipeline.decoding.translation import Translator
from pipeline.import_model import import_checkpoint
from pipeline.workdir import load_trained
from pretrained_helpers import (
    LOGIT_TOLERANCE,
    IdMap,
    expected_case,
    first_hypotheses,
    import_fixtures,
    indices_by,
)

FIXTURES = PROJECT_ROOT / "tests" / "fixtures" / "hf_m2m"
NAMES = ("m2m100", "nllb", "mbart50")


def expected(name):
    return expected_case(FIXTURES, name)


@pytest.fixture(scope="module")
def imported(tmp_path_factory):
    return import_fixtures(tmp_path_factory, FIXTURES, NAMES)


def checkpoint_table(name):
    """{token: id} as transformers' tokenizer has it, recorded by the fixture script."""
    return expected(name)["vocabulary"]


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
    ours, theirs_columns = ids.output_columns(model.suppressed_ids)
    for forced in expected(name)["forced"]:
        index = forced["sentence_index"]
        target = tf.constant([ids.ours(forced["decoder_input_ids"])])
        source = sources[index : index + 1]
        logits = model.forward({"source_ids": source, "target_input_ids": target})[0].numpy()[0]
        theirs = np.array(forced["logits"], np.float32)[:, theirs_columns]
        np.testing.assert_allclose(logits[:, ours], theirs, atol=LOGIT_TOLERANCE, rtol=0)
        assert (logits[:, list(model.suppressed_ids)] <= NEVER / 2).all()


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
        assert [ids.checkpoint(o) for o in first_hypotheses(out, lengths)] == [
            theirs[1:] for theirs in case[key]], key  # fmt: skip
    np.testing.assert_allclose(scores.numpy()[:, 0], case["beam_scores"], atol=1e-4)


def test_beams_cut_at_max_length_rank_with_the_ended_ones_as_generate_ranks_them(imported):
    """capped.json: `generate()` at a max_length that most beams reach. A beam cut there is
    finished and ranks with the ended ones by its score: the import's search gives the same
    ids and scores; the toolkit's own rule (the ended ones first) would not, on one sentence
    of these fixtures."""
    differs = 0
    for name in NAMES:
        capped = json.loads((FIXTURES / name / "capped.json").read_text(encoding="utf-8"))
        config, model, _, _ = load_trained(imported[name])
        assert config["decode"]["capped_hypotheses"] == "rank"
        ids = id_map(name, imported[name])
        sources, prefixes = sources_and_prefixes(name, imported[name])
        limit = capped["max_length"] - 1  # transformers counts the decoder's start token
        found = {}
        for rule in CAPPED_HYPOTHESES:
            options = SearchOptions.from_config(config["decode"], max_length_offset=limit,
                                                max_length_cap=limit,
                                                capped_hypotheses=rule)  # fmt: skip
            out, lengths, scores, _ = search(model, sources.to_tensor(0), options, prefixes)
            hypotheses = first_hypotheses(out, lengths)
            found[rule] = [ids.checkpoint(o) for o in hypotheses], scores.numpy()
        assert found["rank"][0] == [theirs[1:] for theirs in capped["beam_ids"]], name
        np.testing.assert_allclose(found["rank"][1][:, 0], capped["beam_scores"], atol=1e-4)
        differs += found["fill"][0] != found["rank"][0]
    assert differs


def test_the_languages_are_the_checkpoints_codes(imported):
    config, model, _, _ = load_trained(imported["nllb"])
    assert config["data"]["source_language_tags"]["deu_Latn"] == "deu_Latn"
    assert config["data"]["target_language_tokens"]["fra_Latn"] == "fra_Latn"
    assert model.target_language_first
    with pytest.raises(ValueError, match="source_language: unknown language 'xx_Latn'"):
        translator(imported["nllb"]).requests(["Ein Hund."], "fra_Latn", "xx_Latn")
    with pytest.raises(ValueError, match="give target_language"):
        translator(imported["m2m100"]).target_prefixes(["Ein Hund."], None)
    texts = translator(imported["m2m100"]).translate(
        ["Ein Hund läuft.", "A dog runs."], target_language=["en", "fr"],
        source_language=["de", "en"],
    )  # fmt: skip
    assert all(texts) and not any("__" in text for text in texts)


@pytest.mark.parametrize("name, file, key, value, message", [
    ("nllb", "config.json", "num_experts", 4, "num_experts"),
    # The first mBART's conventions: the language code after the source, decoding from the
    # target's code.
    ("mbart50", "tokenizer_config.json", "tokenizer_class", "MBartTokenizer",
     "tokenizer MBartTokenizer is not supported: mBART checkpoints import with mBART-50's"),
])  # fmt: skip
def test_an_unsupported_derivative_is_named(tmp_path, name, file, key, value, message):
    import shutil

    copy = tmp_path / "derivative"
    shutil.copytree(FIXTURES / name, copy)
    settings = json.loads((copy / file).read_text())
    settings[key] = value
    (copy / file).write_text(json.dumps(settings))
    with pytest.raises(UserError, match=message):
        import_checkpoint(copy, tmp_path / "w", log=lambda _: None)
    assert not (tmp_path / "w").exists()


# The NLLB fixture is exported as a multi-gigabyte model is: its SavedModel's variables in
# shards, its ONNX models' tensors in files beside them.
LARGE_EXPORT = "nllb"


@pytest.fixture(scope="module")
def exported(imported, tmp_path_factory):
    """Both imports exported as a SavedModel, to ONNX (with int8) and for CTranslate2."""
    from export import exporter, onnx_model

    out = tmp_path_factory.mktemp("exported")
    for name in NAMES:
        with pytest.MonkeyPatch.context() as patch:
            if name == LARGE_EXPORT:
                patch.setattr(exporter, "SAVED_MODEL_SHARD_BYTES", 200_000)
                patch.setattr(onnx_model, "EXTERNAL_DATA_ABOVE_BYTES", 0)
            exporter.export_model(imported[name], out / name,
                                  formats=("saved_model", "onnx", "ctranslate2"),
                                  log=lambda _: None)  # fmt: skip
    return out


def test_a_large_models_export_is_split_as_its_formats_allow(exported):
    """Beyond what one file may hold (a 2 GiB protobuf) or should (a multi-gigabyte variables
    file): the ONNX models' tensors beside them, the SavedModel's variables in shards; the
    runtimes that read them are the tests below."""
    import onnx
    from onnx.external_data_helper import ExternalDataInfo, _get_all_tensors

    from export.onnx_model import WEIGHTS_FILE

    onnx_dir = exported / LARGE_EXPORT / "onnx"
    assert json.loads((onnx_dir / "model.json").read_text())["external_data"]
    for model in ("model.onnx", "model.int8.onnx"):
        assert (onnx_dir / f"{model}.data").stat().st_size > 100_000, model
    # The weights the export rewrote the model beside are gone, and the tensors file holds
    # the tensors the model reads and nothing else (no weight a rewrite replaced).
    assert not (onnx_dir / WEIGHTS_FILE).exists()
    model = onnx.load(str(onnx_dir / "model.onnx"), load_external_data=False)
    spans = sorted((info.offset, info.length) for info in map(ExternalDataInfo, _get_all_tensors(
        model)) if info.location)  # fmt: skip
    gaps = [start - (previous + length) for (previous, length), (start, _) in zip(spans, spans[1:])]
    assert min(gaps) >= 0 and max(gaps) < 4096  # at most an alignment apart
    assert (onnx_dir / "model.onnx.data").stat().st_size - sum(spans[-1]) < 4096
    variables = exported / LARGE_EXPORT / "saved_model" / "translator" / "1" / "variables"
    assert len(list(variables.glob("variables.data-*"))) > 1
    assert not json.loads((exported / "m2m100" / "onnx" / "model.json").read_text())[
        "external_data"]  # fmt: skip


def without_language_and_end(name, theirs):
    """`generate()`'s ids less the forced language token, cut before </s>."""
    eos = json.loads((FIXTURES / name / "config.json").read_text())["eos_token_id"]
    theirs = theirs[1:]
    return theirs[: theirs.index(eos)] if eos in theirs else theirs


@pytest.mark.parametrize("name", NAMES)
def test_onnx_runtime_gives_generates_ids_and_texts_in_mixed_directions(imported, exported, name):
    from export.runtime import OnnxTranslator

    case = expected(name)
    ids = id_map(name, imported[name])
    translator = OnnxTranslator(exported / name)
    languages = {"target_language": case["target_languages"],
                 "source_language": case["source_languages"]}  # fmt: skip
    sources, prefixes = translator.encode_requests(case["sentences"], None, **languages)
    hypotheses = translator.translate_ids(sources, prefixes, n_best=1)
    assert [ids.checkpoint(h[0][0]) for h in hypotheses] == [
        without_language_and_end(name, theirs) for theirs in case["beam_ids"]]  # fmt: skip
    assert translator.translate(case["sentences"], **languages) == case["beam_texts"]
    assert translator.request_languages.inputs == ("target_language", "source_language")
    with pytest.raises(ValueError, match="give source_language"):
        translator.translate(case["sentences"][:1], target_language=case["target_languages"][0])


def test_the_saved_models_ops_are_all_in_stock_tf_serving(exported):
    """The language lookups' checks (`Assert`) included: TF Serving registers every op."""
    from export.serving_check import read_meta_graph, unsupported_ops

    for name in NAMES:
        saved_model = exported / name / "saved_model" / "translator" / "1"
        assert unsupported_ops(read_meta_graph(saved_model).graph_def) == [], name


@pytest.mark.parametrize("name", NAMES)
def test_the_saved_model_gives_generates_texts_and_ids_in_tf_servings_loader(imported, exported,
                                                                          name):  # fmt: skip
    """TF Serving's loader: `serving_default` takes each sentence's source and target
    language; `beam_search` takes ids, the target language's token as the prefix."""
    case = expected(name)
    ids = id_map(name, imported[name])
    sources, prefixes = sources_and_prefixes(name, imported[name])
    output = run_python(
        "import json, sys\n"
        "import tensorflow as tf, tensorflow_text\n"
        "tf.compat.v1.disable_eager_execution()\n"
        "sentences, targets, sources, source_ids, prefixes = map(json.loads, sys.argv[2:])\n"
        "with tf.compat.v1.Session(graph=tf.Graph()) as session:\n"
        "    meta = tf.compat.v1.saved_model.loader.load(session, ['serve'], sys.argv[1])\n"
        "    text = meta.signature_def['serving_default']\n"
        "    feed = {text.inputs['sentences'].name: sentences,\n"
        "            text.inputs['target_language'].name: targets,\n"
        "            text.inputs['source_language'].name: sources}\n"
        "    texts = session.run(text.outputs['translations'].name, feed)\n"
        "    search = meta.signature_def['beam_search']\n"
        "    feed = {search.inputs['source_ids'].name: source_ids,\n"
        "            search.inputs['target_prefix'].name: prefixes}\n"
        "    found, lengths = session.run([search.outputs['ids'].name,\n"
        "                                  search.outputs['lengths'].name], feed)\n"
        "print(json.dumps({'texts': [t.decode() for t in texts],\n"
        "                  'ids': [row[0, :n[0]].tolist() for row, n in zip(found, lengths)]}))\n",
        exported / name / "saved_model" / "translator" / "1", json.dumps(case["sentences"]),
        json.dumps(case["target_languages"]), json.dumps(case["source_languages"]),
        json.dumps(sources.to_tensor(0).numpy().tolist()), json.dumps(prefixes.numpy().tolist()),
    )  # fmt: skip
    result = json.loads(output)
    assert result["texts"] == case["beam_texts"]
    assert [ids.checkpoint(row) for row in result["ids"]] == [
        theirs[1:] for theirs in case["beam_ids"]]  # fmt: skip


def test_the_int8_model_beside_its_tensors_translates_in_mixed_directions(exported):
    """int8 weights may move a translation: most of the fixture's stay as transformers'."""
    from export.runtime import OnnxTranslator

    case = expected(LARGE_EXPORT)
    translator = OnnxTranslator(exported / LARGE_EXPORT, int8=True)
    texts = translator.translate(case["sentences"], target_language=case["target_languages"],
                                 source_language=case["source_languages"])  # fmt: skip
    assert all(texts) and not any("_Latn" in text for text in texts)
    assert sum(a == b for a, b in zip(texts, case["beam_texts"])) > len(texts) / 2


def test_the_saved_model_names_an_unknown_source_language(exported):
    loaded = tf.saved_model.load(str(exported / "nllb" / "saved_model" / "translator" / "1"))
    serve = loaded.signatures["serving_default"]
    assert set(serve.structured_input_signature[1]) == {
        "sentences", "target_language", "source_language"}  # fmt: skip
    refusal = "source_language: an unknown language, or not one a sentence; this model translates "
    with pytest.raises(tf.errors.InvalidArgumentError,
                       match=refusal + "from ace_Arab, ace_Latn, .* and 190 more"):  # fmt: skip
        serve(sentences=tf.constant(["Ein Hund."]), target_language=tf.constant(["fra_Latn"]),
              source_language=tf.constant(["xx_Latn"]))  # fmt: skip


def test_the_rest_server_takes_both_languages_and_names_what_it_refuses(exported):
    from export import rest_api
    from export.batching import BatchingParameters
    from export.serve import TranslationService, outputs_of

    case = expected("nllb")
    service = TranslationService(exported / "nllb", BatchingParameters(num_batch_threads=1))
    languages = service.translator.request_languages.inputs
    try:
        body = {"instances": [
            {"sentences": s, "target_language": target, "source_language": source}
            for s, target, source in zip(case["sentences"], case["target_languages"],
                                         case["source_languages"])]}  # fmt: skip
        prediction = rest_api.parse_predict(json.dumps(body).encode(), languages)
        texts = outputs_of(prediction, service.submit(prediction).result(120))["translations"]
        assert texts == case["beam_texts"]
        with pytest.raises(rest_api.RequestError, match="needs the input 'source_language'"):
            rest_api.parse_predict(json.dumps({"inputs": {
                "sentences": ["Ein Hund."], "target_language": ["fra_Latn"]}}).encode(),
                languages)  # fmt: skip
        unknown = rest_api.parse_predict(json.dumps({"inputs": {
            "sentences": ["Ein Hund."], "target_language": ["xx_Latn"],
            "source_language": ["deu_Latn"]}}).encode(), languages)  # fmt: skip
        with pytest.raises(rest_api.RequestError, match="unknown language 'xx_Latn'") as refused:
            service.submit(unknown)
        assert refused.value.status == 400
    finally:
        service.close()


def by_direction(case):
    """{(source language, target language): the indices of the sentences in that direction}."""
    return indices_by(zip(case["source_languages"], case["target_languages"]))


@pytest.mark.parametrize("name", ["nllb", "mbart50"])
def test_node_gives_generates_translations_in_the_direction_asked(exported, name):
    from helpers import node_example

    node, example = node_example("node")
    case = expected(name)
    for (source, target), indices in by_direction(case).items():
        result = subprocess.run(
            [node, "translate.mjs", str(exported / name / "onnx"),
             *[case["sentences"][i] for i in indices], "--from", source, "--to", target],
            cwd=example, capture_output=True, text=True, timeout=300,
        )  # fmt: skip
        assert result.returncode == 0, result.stderr
        assert result.stdout.split("\n")[: len(indices)] == [case["beam_texts"][i] for i in indices]


@pytest.mark.parametrize("name", ["m2m100", "mbart50"])
def test_the_page_gives_generates_translations_in_the_direction_chosen(exported, name):
    from test_web_example import page_translations

    case = expected(name)
    runs = {(source, target): (indices, ["--from", source, "--to", target])
            for (source, target), indices in by_direction(case).items()}  # fmt: skip
    shown = page_translations(exported / name / "onnx", case["sentences"], runs)
    for direction, (indices, _) in runs.items():
        assert shown[direction] == [case["beam_texts"][i] for i in indices]


def test_evaluate_takes_the_splits_languages(imported, tmp_path, capsys):
    """One direction of the fixture as a TSV split, its references what transformers gave:
    BLEU 100; the languages are given to this model only."""
    from pipeline import evaluate

    case = expected("nllb")
    (source, target), indices = next(iter(by_direction(case).items()))
    split = tmp_path / "split.tsv"
    split.write_text("".join(f"{case['sentences'][i]}\t{case['beam_texts'][i]}\n"
                             for i in indices), encoding="utf-8")  # fmt: skip
    evaluate.main(["--workdir", str(imported["nllb"]), "--split", str(split),
                   "--source-language", source, "--target-language", target])  # fmt: skip
    report = json.loads(capsys.readouterr().out)
    assert report["bleu"] == 100.0
    assert report["perplexity"] > 1 and report["perplexity_pairs"] == len(indices)
    with pytest.raises(SystemExit) as exit_status:
        evaluate.main(["--workdir", str(imported["nllb"]), "--split", str(split),
                       "--target-language", target])  # fmt: skip
    assert exit_status.value.code == 2
    assert "this model translates from ace_Arab, " in (err := capsys.readouterr().err)
    assert err.rstrip().endswith("give --source-language")


def test_beam_search_needs_the_target_languages_token_as_its_prefix(exported):
    """Every runtime that takes ids is told: ONNX Runtime's JavaScript packages would ignore or
    refuse a prefix that had a default, so the export gives it none."""
    import onnx

    from export import rest_api
    from export.runtime import OnnxTranslator
    from export.signature import BEAM_SEARCH

    translator = OnnxTranslator(exported / "nllb")
    with pytest.raises(ValueError, match="target_prefix: this model's targets start with"):
        translator.search([[5, 6, 3]])
    model = onnx.load(str(exported / "nllb" / "onnx" / "model.onnx"), load_external_data=False)
    assert "target_prefix" not in {tensor.name for tensor in model.graph.initializer}
    body = json.dumps({"signature_name": BEAM_SEARCH, "inputs": {"source_ids": [[5, 6, 3]]}})
    with pytest.raises(rest_api.RequestError, match="needs the input 'target_prefix'"):
        rest_api.parse_predict(body.encode(), translator.request_languages.inputs)


@pytest.mark.parametrize("name", NAMES)
def test_ctranslate2_gives_generates_greedy_ids_and_beam_texts(imported, exported, name):
    """CTranslate2 is given the source language's token before the source, and the target
    language's as the target prefix, as the other runtimes are; its hypotheses start with it."""
    import ctranslate2
    import sentencepiece

    case = expected(name)
    directory = exported / name / "ctranslate2"
    model_translator = translator(imported[name])
    requests = model_translator.requests(case["sentences"], case["target_languages"],
                                         case["source_languages"])  # fmt: skip
    prefixes = model_translator.target_prefixes(case["sentences"], case["target_languages"])
    processor = sentencepiece.SentencePieceProcessor(model_file=str(directory / "shared.model"))
    ctranslate2_translator = ctranslate2.Translator(str(directory))
    results = ctranslate2_translator.translate_batch(
        processor.encode(requests, out_type=str),
        target_prefix=processor.encode(prefixes, out_type=str),
        beam_size=1, max_decoding_length=64, min_decoding_length=0, return_end_token=True,
    )  # fmt: skip
    ids = id_map(name, imported[name])
    found = [[processor.piece_to_id(piece) for piece in r.hypotheses[0]] for r in results]
    assert [ids.checkpoint(hypothesis) for hypothesis in found] == case["greedy_ids"]
    results = ctranslate2_translator.translate_batch(
        processor.encode(requests, out_type=str),
        target_prefix=processor.encode(prefixes, out_type=str), beam_size=4,
    )  # fmt: skip
    assert [processor.decode(r.hypotheses[0][1:]) for r in results] == case["beam_texts"]


MULTI30K = PROJECT_ROOT / "data" / "multi30k"
CODES = {
    "nllb": {"deu_Latn": "de", "eng_Latn": "en", "fra_Latn": "fr"},
    "mbart50": {"de_DE": "de", "en_XX": "en", "fr_XX": "fr"},
}


def references(name):
    """{index of a fixture sentence with labels: its reference}, found where the fixture
    script took the sentence from (Multi30k's test_2016_flickr, in the direction's target
    language)."""
    import gzip

    case = expected(name)
    found = {}
    for index in case["target_sentence_indices"]:
        source, target = (CODES[name][case[f"{side}_languages"][index]]
                          for side in ("source", "target"))  # fmt: skip
        lines = {code: gzip.open(MULTI30K / f"test_2016_flickr.{code}.gz", "rt",
                                 encoding="utf-8").read().splitlines()
                 for code in (source, target)}  # fmt: skip
        found[index] = lines[target][lines[source].index(case["sentences"][index])]
    return found


def direction_config(tmp_path, pairs, source, target, **train):
    """A fine-tuning configuration of `pairs` (source, reference), in the direction
    `source`-`target` (checkpoint codes), as training, validation and test split."""
    import yaml

    for side, lines in zip(("source", "target"), zip(*pairs)):
        (tmp_path / f"pairs.{side}").write_text("".join(f"{line}\n" for line in lines),
                                                encoding="utf-8")  # fmt: skip
    data = {f"{split}_{side}": str(tmp_path / f"pairs.{side}")
            for split in ("train", "valid", "test") for side in ("source", "target")}  # fmt: skip
    config = {"data": {**data, "source_language": source, "target_language": target},
              "train": {"precision": "float32", "epochs": 1, "steps_per_epoch": 2,
                        "batch_size": 8, "attention_images": 0, **train}}  # fmt: skip
    path = tmp_path / "direction.yaml"
    path.write_text(yaml.safe_dump(config), encoding="utf-8")
    return path


@pytest.mark.parametrize("name", ["nllb", "mbart50"])
def test_fine_tuning_pairs_are_those_transformers_trains_on(imported, tmp_path, name):
    """The training stream of a fine-tuning run gives each pair as transformers' tokenizer
    gives it to train on: the source after its language's token (</s> the model appends),
    the labels the target language's token, the pieces and </s>, decoding from </s>."""
    from pipeline.config import load_config
    from pipeline.data.corpus import scan_training_corpora
    from pipeline.data.dataset import StreamCounters, stream_training_examples
    from pipeline.train import inherited_overrides

    case = expected(name)
    ids = id_map(name, imported[name])
    _, _, tokenizer, _ = load_trained(imported[name])
    start, eos = ids.to_checkpoint[2], ids.to_checkpoint[3]
    for (index, reference), labels in zip(references(name).items(), case["target_ids"]):
        pair = [(case["sentences"][index], reference)]
        languages = case["source_languages"][index], case["target_languages"][index]
        path = direction_config(tmp_path, pair, *languages)
        data = load_config(path, inherited_overrides(path, [], imported[name]))["data"]
        corpora, _, _ = scan_training_corpora(data, log=lambda _: None)
        counters = StreamCounters(corpora, [0])
        stream, _ = stream_training_examples(corpora, tokenizer, tokenizer, data, counters, 0)
        inputs, outputs = next(iter(stream))
        inputs, outputs = (
            {k: v.numpy().tolist() for k, v in inputs.items()},
            outputs.numpy().tolist(),
        )
        source = ids.checkpoint(inputs["source_ids"]) + [eos]
        assert source == case["source_ids"][index]
        assert ids.checkpoint(outputs) == labels
        assert ids.checkpoint(inputs["target_input_ids"]) == [start, *labels[:-1]]


@pytest.mark.parametrize("name, label_smoothing", [("nllb", 0.0), ("nllb", 0.1),
                                                   ("mbart50", 0.1)])  # fmt: skip
def test_the_training_loss_is_transformers_loss(imported, name, label_smoothing):
    """The loss a fine-tuning run trains on (the training twin's, whose projection is
    chunked, and the plain model's) is transformers' cross-entropy of the forced targets:
    the ids the model never outputs take no share of the softmax, nor of label smoothing
    (as transformers' label smoother spreads it over the checkpoint's vocabulary)."""
    import copy

    from pipeline.model_types.builder import build_model

    config, model, _, _ = load_trained(imported[name])
    config = copy.deepcopy(config)
    config["train"]["label_smoothing"] = label_smoothing
    ids = id_map(name, imported[name])
    ours, theirs_columns = ids.output_columns(model.suppressed_ids)
    assert len(set(theirs_columns)) == len(theirs_columns)
    label_ids = dict(zip(theirs_columns, ours))
    sources, _ = sources_and_prefixes(name, imported[name])
    case = expected(name)
    vocab = model.target_vocab_size
    models = [build_model(config, vocab, vocab, for_training=twin) for twin in (False, True)]
    for built in models:
        built.set_weights(model.get_weights())
    for forced, labels in zip(case["forced"], case["target_ids"]):
        index = forced["sentence_index"]
        logits = np.array(forced["logits"], np.float64)
        top = logits.max(axis=1, keepdims=True)
        log_probs = logits - top - np.log(np.exp(logits - top).sum(axis=1, keepdims=True))
        positions = np.arange(len(labels))
        theirs = -((1 - label_smoothing) * log_probs[positions, labels]
                   + label_smoothing * log_probs.mean(axis=1)).sum()  # fmt: skip
        target = tf.constant([ids.ours(forced["decoder_input_ids"])])
        inputs = {"source_ids": sources[index : index + 1].to_tensor(0), "target_input_ids": target}
        y = tf.constant([[label_ids[label] for label in labels]])
        for built in models:
            loss_sum, tokens = built.token_loss(y, built(inputs))
            assert float(tokens) == len(labels)
            np.testing.assert_allclose(float(loss_sum), theirs, rtol=1e-4)


def test_a_fine_tuned_import_is_scored_and_evaluated_in_its_direction(imported, tmp_path):
    """Validation BLEU, the test report and pipeline.evaluate translate the split in the
    direction fine-tuned: at learning rate 0, the references being generate()'s beam texts,
    every score is 100; at another, the weights move."""
    from pipeline import evaluate
    from pipeline.train import main as train

    case = expected("nllb")
    (source, target), indices = next(iter(by_direction(case).items()))
    pairs = [(case["sentences"][i], case["beam_texts"][i]) for i in indices]
    config = direction_config(
        tmp_path, pairs, source, target, learning_rate=0.0, bleu_every_epochs=1
    )
    workdir = tmp_path / "tuned"
    history = train(["--config", str(config), "--workdir", str(workdir),
                     "--init-from", str(imported["nllb"])])  # fmt: skip
    assert history.get("val_bleu") == [100.0]
    assert json.loads((workdir / "test_report.json").read_text())["bleu"] == 100.0
    evaluate.main(["--workdir", str(workdir), "--split", "test"])
    assert json.loads((workdir / "eval_test.json").read_text())["bleu"] == 100.0
    moved = tmp_path / "moved"
    train(["--config", str(config), "--workdir", str(moved), "--init-from",
           str(imported["nllb"]), "--set", "train.learning_rate=0.01"])  # fmt: skip
    _, tuned, _, _ = load_trained(moved)
    _, original, _, _ = load_trained(imported["nllb"])
    assert any(not np.array_equal(a, b) for a, b in zip(tuned.get_weights(),
                                                        original.get_weights()))  # fmt: skip


@pytest.mark.parametrize("change, message", [
    ({"source_language": None}, "data.source_language: give the training pairs' source "
     "language by the checkpoint's code; this model translates from"),
    ({"target_language": "xx_Latn"}, "data.target_language: unknown language 'xx_Latn'"),
])  # fmt: skip
def test_a_fine_tuning_run_names_a_missing_or_unknown_language(imported, tmp_path, change,
                                                               message):  # fmt: skip
    import yaml

    from pipeline.config import load_config
    from pipeline.train import inherited_overrides

    path = direction_config(tmp_path, [("Ein Hund.", "A dog.")], "deu_Latn",
                            "eng_Latn")  # fmt: skip
    config = yaml.safe_load(path.read_text())
    config["data"].update(change)
    path.write_text(yaml.safe_dump(config))
    with pytest.raises(UserError, match=re.escape(message)):
        load_config(path, inherited_overrides(path, [], imported["nllb"]))


def test_a_multi_way_fine_tuning_of_an_import_is_refused_in_one_line(imported):
    from pipeline.train import inherited_overrides

    with pytest.raises(UserError, match="fine-tuned on one direction a run"):
        inherited_overrides(
            PROJECT_ROOT / "configs" / "smoke_multilingual.yaml", [], imported["nllb"]
        )
