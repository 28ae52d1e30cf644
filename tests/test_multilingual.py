"""One model for many directions: the multi-way set, its directions and their mix, the
target-language tags, training and translating with them."""

import gzip
import json
import subprocess
import sys

import numpy as np
import pytest

from export.signature import TARGET_LANGUAGE
from pipeline import translate
from pipeline.config import PROJECT_ROOT, load_config
from pipeline.core.errors import UserError
from pipeline.core.multilingual import (
    Direction,
    leading_tag_pieces,
    parse_directions,
    tag_requests,
)
from pipeline.data.corpus import (
    read_split,
    scan_multiway,
    temperature_weights,
)
from pipeline.data.tokenizer import Tokenizer, vocabulary_paths

SMOKE = PROJECT_ROOT / "configs" / "smoke_multilingual.yaml"
FOUR = ["cs", "de", "en", "fr"]


def test_directions_all_to_and_from_one_language_or_listed():
    assert len(parse_directions("all", FOUR)) == 12
    centric = parse_directions("to_and_from:en", FOUR)
    assert [str(d) for d in centric] == ["cs-en", "de-en", "en-cs", "en-de", "en-fr", "fr-en"]
    assert parse_directions("de-en, en-fr", FOUR) == [Direction("de", "en"), Direction("en", "fr")]
    for text, says in [
        ("de-xx", "unknown language 'xx'; the set has cs, de, en, fr"),
        ("to_and_from:pt", "unknown language 'pt'"),
        ("de-de", "translates a language into itself"),
        ("de-en,de-en", "listed twice"),
        ("deen", "is not a direction such as de-en"),
    ]:
        with pytest.raises(UserError, match=says):
            parse_directions(text, FOUR)


def test_temperature_sampling_goes_from_sizes_to_even():
    sizes = [1000, 100, 10]
    np.testing.assert_allclose(temperature_weights(sizes, 1.0), np.array(sizes) / 1110)
    shares = [temperature_weights(sizes, t) for t in (1.0, 2.0, 5.0, 1e6)]
    smallest = [share[-1] for share in shares]
    assert smallest == sorted(smallest)  # a higher temperature gives the small direction more
    np.testing.assert_allclose(shares[-1], [1 / 3] * 3, atol=1e-4)
    assert all(abs(sum(share) - 1) < 1e-9 for share in shares)


def write_multiway(directory, lines_by_language):
    files = {}
    for language, lines in lines_by_language.items():
        path = directory / f"train.{language}.gz"
        path.write_bytes(gzip.compress("".join(line + "\n" for line in lines).encode()))
        files[language] = str(path)
    return files


def multiway_config(tmp_path, files, overrides=()):
    config = tmp_path / "config.yaml"
    config.write_text(json.dumps({"data": {"multiway_train": files, "shared_vocabulary": True}}))
    return load_config(config, overrides)


@pytest.mark.parametrize("yaml,says", [
    ("data:\n  multiway_train: {de: a.de, en: a.en}\n",
     "data.multiway_train needs data.shared_vocabulary: true"),
    ("data:\n  multiway_train: {de: a.de}\n  shared_vocabulary: true\n", "at least two languages"),
    ("data:\n  multiway_train: {de: a.de, EN: a.en}\n  shared_vocabulary: true\n",
     "'EN' is not a language code"),
    ("data:\n  multiway_train: {de: a.de, en: a.en}\n  shared_vocabulary: true\n"
     "  train_source: a.de\n", "data.multiway_train replaces data.train_source"),
    ("data:\n  multiway_train: {de: a.de, en: a.en}\n  shared_vocabulary: true\n"
     "  directions: de-fr\n", "data.directions: unknown language 'fr'"),
    ("data:\n  multiway_train: {de: a.de, en: a.en}\n  shared_vocabulary: true\n"
     "  multiway_test: {de: t.de, fr: t.fr}\n", "data.multiway_test has fr"),
    ("data:\n  train_source: a.de\n  train_target: a.en\n  multiway_valid: {de: v.de, en: v.en}\n",
     "data.multiway_valid needs data.multiway_train"),
    ("data:\n  multiway_train: [a.de, a.en]\n", "data.multiway_train must be a mapping"),
    ("data:\n  multiway_train: {de: a.de, en: a.en, fr: a.fr}\n  shared_vocabulary: true\n"
     "  directions: to_and_from:en\n  multiway_synthetic: {de: s.de}\n",
     "data.multiway_synthetic needs data.synthetic_directions"),
    ("data:\n  multiway_train: {de: a.de, en: a.en, fr: a.fr}\n  shared_vocabulary: true\n"
     "  directions: to_and_from:en\n  multiway_synthetic: {de: s.de}\n"
     "  synthetic_directions: fr-de\n",
     "data.synthetic_directions: fr-de needs a fr file in data.multiway_synthetic"),
    ("data:\n  multiway_train: {de: a.de, en: a.en}\n  shared_vocabulary: true\n"
     "  multiway_synthetic: {de: s.de}\n  synthetic_directions: de-en\n",
     "data.synthetic_directions: de-en is also in data.directions"),
    ("data:\n  multiway_train: {de: a.de, en: a.en}\n  shared_vocabulary: true\n"
     "  multiway_synthetic: {cs: s.cs}\n  synthetic_directions: cs-en\n",
     "data.multiway_synthetic has cs"),
    ("data:\n  train_source: a.de\n  train_target: a.en\n  synthetic_directions: de-en\n",
     "data.synthetic_directions needs data.multiway_train"),
])  # fmt: skip
def test_a_bad_multiway_configuration_is_one_line_naming_the_key(tmp_path, yaml, says):
    config = tmp_path / "config.yaml"
    config.write_text(yaml)
    with pytest.raises(UserError) as refused:
        load_config(config)
    assert says in str(refused.value) and "\n" not in str(refused.value)


def test_a_multiway_set_whose_files_differ_in_length_names_each_file_and_count(tmp_path):
    files = write_multiway(tmp_path, {"de": ["a", "b", "c"], "en": ["a", "b"]})
    config = multiway_config(tmp_path, files)
    with pytest.raises(UserError, match=r"train.de.gz has 3, .*train.en.gz has 2"):
        scan_multiway(config["data"], 10, log=lambda _: None)
    config["data"]["multiway_test"] = files
    with pytest.raises(UserError, match=r"aligned line by line: .*has 3, .*has 2"):
        read_split(config["data"], "test")


def test_the_directions_are_read_tagged_aligned_and_mixed_as_configured(tmp_path):
    lines = {language: [f"{language} {i}" for i in range(40)] for language in ("de", "en", "fr")}
    lines["de"][7] = ""  # a blank line stays blank: nothing to translate
    files = write_multiway(tmp_path, lines)
    config = multiway_config(tmp_path, files, ["data.directions=to_and_from:en",
                                               "data.sampling_temperature=2"])  # fmt: skip
    config["data"]["multiway_test"] = files
    logged = []
    corpora, sources, targets, vocabulary = scan_multiway(config["data"], 30, seed=3,
                                                          log=logged.append)  # fmt: skip
    assert [c.name for c in corpora] == ["de-en", "en-de", "en-fr", "fr-en"]
    assert [c.source_prefix for c in corpora] == ["<2en> ", "<2de> ", "<2fr> ", "<2en> "]
    assert all(c.weight == pytest.approx(0.25) for c in corpora)
    assert "train: de-en: 40 lines, 25.0% of the mix" in logged
    # The samples: each language's lines in equal number; the pairs aligned, sources tagged.
    # 30 sampled lines, 10 of each language (in the order of their codes).
    assert len(vocabulary) == 30
    for number, language in enumerate((b"de", b"en", b"fr")):
        assert all(line.startswith(language) or not line
                   for line in vocabulary[number * 10 : number * 10 + 10])  # fmt: skip
    _, _, _, everything = scan_multiway(config["data"], 300, seed=3, log=lambda _: None)
    counts = {lang: sum(line.startswith(lang.encode()) for line in everything) for lang in lines}
    assert counts == {"de": 39, "en": 40, "fr": 40} and len(everything) == 120
    for source, target in zip(sources, targets):
        tag, _, text = source.partition(b" ")
        if text:
            assert text.split()[-1] == target.split()[-1]  # the same line number
            assert tag == f"<2{target.split()[0].decode()}>".encode()
    test = read_split(config["data"], "test")
    assert [str(d) for d, _, _ in test.directions] == ["de-en", "en-de", "en-fr", "fr-en"]
    lines = {str(d): (test.sources[a:b], test.targets[a:b]) for d, a, b in test.directions}
    assert lines["en-de"][0][0] == "<2de> en 0" and lines["en-de"][1][0] == "de 0"
    assert lines["de-en"][0][7] == "" and lines["de-en"][0][8] == "<2en> de 8"


def test_synthetic_sources_train_their_directions_beside_the_sets_own(tmp_path):
    lines = {language: [f"{language} {i}" for i in range(40)] for language in ("de", "en", "fr")}
    files = write_multiway(tmp_path, lines)
    synthetic = tmp_path / "synthetic.de.txt"
    synthetic.write_text("".join(f"de* {i}\n" for i in range(40)))
    config = multiway_config(tmp_path, files, ["data.directions=to_and_from:en",
                                               f"data.multiway_synthetic={{de: {synthetic}}}",
                                               "data.synthetic_directions=de-fr"])  # fmt: skip
    logged = []
    corpora, _, _, _ = scan_multiway(config["data"], 30, log=logged.append)
    assert [c.name for c in corpora] == ["de-en", "en-de", "en-fr", "fr-en", "de-fr"]
    made = corpora[-1]
    assert made.shards[0].source == str(synthetic) and made.shards[0].target == files["fr"]
    assert made.source_prefix == "<2fr> " and corpora[0].shards[0].source == files["de"]
    assert "train: de-fr: 40 lines, 20.0% of the mix" in logged
    synthetic.write_text("de* 0\n")
    with pytest.raises(UserError, match=r"aligned line by line: .*synthetic.de.txt has 1"):
        scan_multiway(config["data"], 30, log=lambda _: None)


def test_requests_are_tagged_for_a_multilingual_model_and_checked():
    known, flag = {code: f"<2{code}>" for code in ("de", "en", "fr")}, "--target-language"
    assert tag_requests(["Ein Hund.", ""], "fr", known) == ["<2fr> Ein Hund.", ""]
    assert tag_requests(["a", "b"], ["en", "de"], known) == ["<2en> a", "<2de> b"]
    with pytest.raises(UserError, match="translates into de, en, fr: give --target-language"):
        tag_requests(["a"], None, known, name=flag)
    with pytest.raises(ValueError, match="target_language: unknown language 'pt'"):
        tag_requests(["a"], "pt", known, error=ValueError)
    with pytest.raises(UserError, match="2 target languages for 1 sentences"):
        tag_requests(["a"], ["en", "de"], known)
    # A bilingual model takes its own target language only, and leaves sentences as they are.
    assert tag_requests(["Ein Hund."], "en", [], "en") == ["Ein Hund."]
    assert tag_requests(["Ein Hund."], None, [], "en") == ["Ein Hund."]
    with pytest.raises(UserError, match="this model translates into en only, not fr"):
        tag_requests(["Ein Hund."], "fr", [], "en", flag)


@pytest.fixture(scope="module")
def trained(tmp_path_factory):
    workdir = tmp_path_factory.mktemp("multilingual")
    from pipeline import train

    history = train.main(["--config", str(SMOKE), "--workdir", str(workdir)])
    # Validation BLEU of each direction, as TensorBoard shows it, beside the pooled figure.
    assert {"val_bleu", "val_bleu_de-en", "val_bleu_en-fr"} <= set(history)
    return workdir


def test_training_builds_one_vocabulary_with_the_tags_and_scores_each_direction(trained):
    source_path, target_path = vocabulary_paths(trained)
    assert source_path == target_path  # one vocabulary over every language
    tokenizer = Tokenizer(source_path)
    for language in ("de", "en", "fr"):
        tag = f"<2{language}>"
        assert tokenizer.processor.encode(f"{tag} Ein Hund.", out_type=str)[:2] == ["▁", tag]
    assert tokenizer.processor.encode("Příliš žluťoučký kůň", out_type=str)  # no <unk> needed
    report = json.loads((trained / "test_report.json").read_text())
    assert sorted(report["directions"]) == ["de-en", "en-de", "en-fr", "fr-en"]
    assert all(0 <= s["wrong_language"] <= 100 for s in report["directions"].values())
    assert all(0 <= s["chrf"] <= 100 and s["sentences"] == 1000
               for s in report["directions"].values())  # fmt: skip


def test_translate_takes_a_target_language_a_file_of_them_and_refuses_the_rest(
    trained, tmp_path, capsys
):
    sentences = tmp_path / "input.de"
    sentences.write_text("Ein Hund läuft.\nZwei Männer.\n")
    languages = tmp_path / "languages"
    languages.write_text("en\nfr\n")
    translate.main(["--workdir", str(trained), "--input", str(sentences),
                    "--target-languages", str(languages)])  # fmt: skip
    mixed = capsys.readouterr().out.splitlines()
    alone = []
    for line, language in [("Ein Hund läuft.", "en"), ("Zwei Männer.", "fr")]:
        one = tmp_path / f"one.{language}"
        one.write_text(line + "\n")
        translate.main(["--workdir", str(trained), "--input", str(one),
                        "--target-language", language])  # fmt: skip
        alone += capsys.readouterr().out.splitlines()
    assert mixed == alone  # a batch mixing languages gives each sentence what it gets alone
    tsv = tmp_path / "input.tsv"
    tsv.write_text("en\tEin Hund läuft.\nfr\tZwei Männer.\n")
    translate.main(["--workdir", str(trained), "--input", str(tsv), "--languages-in-input"])
    assert capsys.readouterr().out.splitlines() == alone
    tsv.write_text("en\tEin Hund läuft.\nZwei Männer.\n")
    with pytest.raises(SystemExit):
        translate.main(["--workdir", str(trained), "--input", str(tsv), "--languages-in-input"])
    assert "input line 2: no tab" in capsys.readouterr().err
    for flags, says in [
        ([], "this model translates into de, en, fr: give --target-language"),
        (["--target-language", "cs"], "--target-language: unknown language 'cs'"),
    ]:
        result = subprocess.run(
            [sys.executable, "-m", "pipeline.translate", "--workdir", str(trained), *flags],
            input="Ein Hund.\n", capture_output=True, text=True, cwd=PROJECT_ROOT, timeout=300,
        )  # fmt: skip
        assert result.returncode == 2
        assert says in result.stderr and len(result.stderr.strip().splitlines()) == 1


SENTENCES = ["Ein Hund läuft über eine Wiese.", "Zwei Männer stehen.", "", "A dog."]
LANGUAGES = ["en", "fr", "en", "de"]


@pytest.fixture(scope="module")
def exported(trained, tmp_path_factory):
    from export.exporter import export_model

    output = tmp_path_factory.mktemp("multilingual_export")
    export_model(trained, output, formats=["saved_model", "onnx"], log=lambda _: None)
    return output


def test_the_onnx_export_translates_into_each_language_asked_as_the_model_does(trained, exported):
    from export.runtime import OnnxTranslator
    from pipeline.decoding.translation import Translator
    from pipeline.workdir import load_trained

    runtime = OnnxTranslator(exported / "onnx")
    assert runtime.languages == ["de", "en", "fr"]
    assert json.loads((exported / "onnx" / "model.json").read_text())["languages"] == {
        "targets": ["de", "en", "fr"],
        "tags": {"de": "<2de>", "en": "<2en>", "fr": "<2fr>"},
    }
    sentences, languages = SENTENCES, LANGUAGES
    loaded = load_trained(trained)
    in_process = Translator.from_trained(loaded).translate(sentences, target_language=languages)
    mixed = runtime.translate(sentences, target_language=languages)
    assert mixed == in_process and mixed[2] == ""
    alone = [
        runtime.translate([s], target_language=lang)[0] for s, lang in zip(sentences, languages)
    ]
    assert mixed == alone  # a batch mixing target languages: each sentence as alone
    for language, says in [(None, "give target_language"), ("cs", "unknown language 'cs'"),
                           (["en"], "1 target languages for 4 sentences")]:  # fmt: skip
        with pytest.raises(ValueError, match=says):
            runtime.translate(sentences, target_language=language)


def test_the_saved_models_text_signatures_take_a_target_language_a_sentence(exported):
    import tensorflow as tf

    from export.runtime import OnnxTranslator

    loaded = tf.saved_model.load(str(exported / "saved_model" / "translator" / "1"))
    serve = loaded.signatures["serving_default"]
    assert set(serve.structured_input_signature[1]) == {"sentences", "target_language"}
    outputs = serve(sentences=tf.constant(SENTENCES), target_language=tf.constant(LANGUAGES))
    texts = [t.decode() for t in outputs["translations"].numpy()]
    runtime = OnnxTranslator(exported / "onnx")
    assert texts == runtime.translate(SENTENCES, target_language=LANGUAGES)
    prefixed = loaded.signatures["translate_with_prefix"]
    assert set(prefixed.structured_input_signature[1]) == {
        "sentences", "target_prefix", "target_language"}  # fmt: skip
    for languages in (["en", "xx", "en", "de"], ["en"]):
        with pytest.raises(tf.errors.InvalidArgumentError,
                           match="this model translates into de, en, fr"):  # fmt: skip
            serve(sentences=tf.constant(SENTENCES), target_language=tf.constant(languages))


def test_the_rest_server_takes_a_target_language_and_names_what_it_refuses(exported):
    from export import rest_api
    from export.batching import BatchingParameters
    from export.runtime import OnnxTranslator
    from export.serve import TranslationService, outputs_of

    service = TranslationService(exported / "onnx", BatchingParameters(num_batch_threads=1))
    try:
        body = {"instances": [{"sentences": s, "target_language": language}
                              for s, language in zip(SENTENCES, LANGUAGES)]}  # fmt: skip
        prediction = rest_api.parse_predict(json.dumps(body).encode(), (TARGET_LANGUAGE,))
        texts = outputs_of(prediction, service.submit(prediction).result(120))["translations"]
        runtime = OnnxTranslator(exported / "onnx")
        assert texts == runtime.translate(SENTENCES, target_language=LANGUAGES)
        with pytest.raises(rest_api.RequestError, match="object with 'sentences' and 'target_"):
            rest_api.parse_predict(b'{"instances": ["Ein Hund."]}', (TARGET_LANGUAGE,))
        unknown = json.dumps({"inputs": {"sentences": ["Ein Hund."], "target_language": ["pt"]}})
        unknown = rest_api.parse_predict(unknown.encode(), (TARGET_LANGUAGE,))
        with pytest.raises(rest_api.RequestError, match="unknown language 'pt'") as refused:
            service.submit(unknown)
        assert refused.value.status == 400
    finally:
        service.close()
    metadata = rest_api.model_metadata("translator", 1, (TARGET_LANGUAGE,))
    inputs = metadata["metadata"]["signature_def"]["signature_def"]["serving_default"]["inputs"]
    assert set(inputs) == {"sentences", "target_language"}
    bilingual = rest_api.model_metadata("translator", 1)
    assert set(
        bilingual["metadata"]["signature_def"]["signature_def"]["serving_default"]["inputs"]
    ) == {"sentences"}  # a bilingual export's signatures are unchanged


def test_the_client_sends_a_target_language_in_both_protocols(exported):
    import tensorflow as tf

    from export import client, rest_api

    body = client.translate_body(SENTENCES, "fr")
    parsed = rest_api.parse_predict(json.dumps(body).encode(), (TARGET_LANGUAGE,))
    assert parsed.inputs["target_language"] == ["fr"] * len(SENTENCES)
    assert client.translate_body(SENTENCES) == {"signature_name": "serving_default",
                                                "instances": SENTENCES}  # fmt: skip
    request = client.translate_request(SENTENCES, "translator", target_language=LANGUAGES)
    feeds = {name: tf.make_ndarray(proto) for name, proto in request.inputs.items()}
    loaded = tf.saved_model.load(str(exported / "saved_model" / "translator" / "1"))
    outputs = loaded.signatures["serving_default"](**{k: tf.constant(v) for k, v in feeds.items()})
    expected = loaded.signatures["serving_default"](
        sentences=tf.constant(SENTENCES), target_language=tf.constant(LANGUAGES))  # fmt: skip
    assert outputs["translations"].numpy().tolist() == expected["translations"].numpy().tolist()


def test_the_node_example_translates_into_the_language_asked(exported):
    from export.runtime import OnnxTranslator
    from helpers import node_example

    node, example = node_example("node")
    sentences = ["Ein Hund läuft über eine Wiese.", "", "Zwei Männer stehen."]
    runtime = OnnxTranslator(exported / "onnx")
    for language in ("en", "fr"):
        result = subprocess.run(
            [node, "translate.mjs", str(exported / "onnx"), *sentences, "--to", language],
            cwd=example, capture_output=True, text=True, timeout=300,
        )  # fmt: skip
        assert result.returncode == 0, result.stderr
        expected = runtime.translate(sentences, target_language=language)
        assert result.stdout.split("\n")[: len(sentences)] == expected
    for flags, says in [([], "translates into de, en, fr: give --to"),
                        (["--to", "cs"], "--to: unknown language 'cs'")]:  # fmt: skip
        result = subprocess.run(
            [node, "translate.mjs", str(exported / "onnx"), "Ein Hund.", *flags],
            cwd=example, capture_output=True, text=True, timeout=300,
        )  # fmt: skip
        assert result.returncode == 2 and says in result.stderr
        assert len(result.stderr.strip().splitlines()) == 1


def test_the_wrong_language_share_counts_translations_in_another_language():
    from pipeline.decoding.evaluation import LanguageIdentifier

    identify = LanguageIdentifier(["de", "en", "fr", "cs"])
    texts = ["A dog runs across a meadow.", "Two men are playing football in a park.",
             "Ein Hund läuft über eine Wiese.", "Un chien court dans un pré.", ""]  # fmt: skip
    assert identify.wrong_share(texts, "en") == 50.0  # of the 4 non-blank, 2 are not English
    assert identify.wrong_share(texts[2:3], "de") == 0.0
    assert identify.wrong_share([""], "en") is None
    assert LanguageIdentifier(["en", "xx"]).wrong_share(texts, "en") is None  # cannot tell


def test_the_browser_page_offers_the_models_languages_and_translates_into_the_one_chosen(
    exported, tmp_path
):
    from test_web_example import browser_tools, drive, serving

    from export.runtime import OnnxTranslator

    node, chromium = browser_tools()
    sentences = ["Ein Hund läuft über eine Wiese.", "Zwei Männer stehen."]
    runtime = OnnxTranslator(exported / "onnx")
    screenshot = tmp_path / "page.png"
    # The first sentence before any choice, then both into French.
    with serving(node, exported / "onnx") as address:
        result = drive(node, chromium, address, [sentences[0], "--to", "fr", *sentences,
                                                 "--screenshot", str(screenshot)])  # fmt: skip
    assert result.returncode == 0, result.stderr
    unchosen, *shown = json.loads(result.stdout)
    assert [s["translation"] for s in shown] == runtime.translate(sentences, target_language="fr")
    assert shown[0]["languages"] == "into German, English, French"
    assert shown[0]["targetLabel"] == "French"
    # The menu starts at the first language (German): the page never sends a request without one.
    assert unchosen["targetLabel"] == "German"
    assert unchosen["translation"] == runtime.translate(sentences[:1], target_language="de")[0]
    assert screenshot.read_bytes().startswith(b"\x89PNG")


def test_a_multilingual_transformers_ctranslate2_export_translates_with_the_tag(tmp_path):
    import ctranslate2
    import sentencepiece
    import yaml

    from export.exporter import export_model
    from pipeline import train
    from pipeline.decoding.translation import Translator
    from pipeline.workdir import load_trained

    # The multilingual smoke recipe with the Transformer smoke model, its paths made absolute.
    recipe = yaml.safe_load(SMOKE.read_text())
    recipe["model"] = yaml.safe_load((SMOKE.parent / "smoke_transformer.yaml").read_text())["model"]
    recipe["data"]["multiway_test"] = None  # nothing here reads the test report
    for split in ("train", "valid"):
        files = recipe["data"][f"multiway_{split}"]
        recipe["data"][f"multiway_{split}"] = {
            language: str((SMOKE.parent / path).resolve()) for language, path in files.items()
        }
    config = tmp_path / "transformer.yaml"
    config.write_text(yaml.safe_dump(recipe))
    workdir = tmp_path / "run"
    train.main(["--config", str(config), "--workdir", str(workdir), "--set",
                "train.bleu_every_epochs=0"])  # fmt: skip
    exported = export_model(workdir, tmp_path / "out", ["ctranslate2"], log=lambda _: None)
    directory = exported["ctranslate2"]
    processor = sentencepiece.SentencePieceProcessor(model_file=str(directory / "shared.model"))
    translator = ctranslate2.Translator(str(directory))
    # Greedy, with one length limit for both (the tiny model seldom ends by itself).
    ours = Translator.from_trained(load_trained(workdir), beam_size=1, max_length=12)
    sentences = ["Ein Hund läuft über eine Wiese.", "Zwei Männer stehen am Strand."]
    for language in ("en", "fr"):
        tokens = processor.encode([f"<2{language}> {s}" for s in sentences], out_type=str)
        assert all(row[1] == f"<2{language}>" for row in tokens)  # the tag: one token
        results = translator.translate_batch(tokens, beam_size=1, max_decoding_length=12)
        theirs = [processor.decode(result.hypotheses[0]) for result in results]
        assert theirs == ours.translate(sentences, target_language=language)


def test_evaluate_scores_untrained_directions_for_zero_shot(trained, capsys):
    from pipeline import evaluate

    evaluate.main(["--workdir", str(trained), "--split", "test", "--directions", "de-fr,fr-de",
                   "--beam-size", "1"])  # fmt: skip
    report = json.loads((trained / "eval_test.json").read_text())
    assert sorted(report["directions"]) == ["de-fr", "fr-de"]  # trained: only to and from en
    assert "| de-fr |" in capsys.readouterr().err
    with pytest.raises(SystemExit) as stopped:
        evaluate.main(["--workdir", str(trained), "--directions", "de-cs"])
    assert stopped.value.code == 2
    assert "--directions: unknown language 'cs'" in capsys.readouterr().err


def test_score_takes_the_target_language_of_a_multilingual_model(trained, tmp_path, capsys):
    from pipeline import score

    (tmp_path / "src").write_text("Ein Hund läuft.\nZwei Männer.\n")
    (tmp_path / "tgt").write_text("Un chien court.\nDeux hommes.\n")
    files = ["--workdir", str(trained), "--source", str(tmp_path / "src"), "--target",
             str(tmp_path / "tgt")]  # fmt: skip
    score.main([*files, "--target-language", "fr"])
    as_french = capsys.readouterr().out.splitlines()
    score.main([*files, "--target-language", "en"])
    as_english = capsys.readouterr().out.splitlines()
    assert len(as_french) == len(as_english) == 2 and as_french != as_english
    with pytest.raises(SystemExit):
        score.main(files)
    assert "give --target-language" in capsys.readouterr().err


def test_the_tag_is_left_out_of_alignments_and_plots(trained):
    from pipeline.decoding.translation import Translator
    from pipeline.workdir import load_trained

    translator = Translator.from_trained(load_trained(trained))
    source = "Ein Hund läuft."
    ((best,),) = translator.hypotheses(translator.requests([source], "fr"))
    pieces = translator.source_tokenizer.processor.encode(source, out_type=str)
    assert best.source_tokens == pieces
    assert best.attention.shape == (len(best.target_tokens), len(pieces))
    assert leading_tag_pieces(["▁", "<2fr>", "▁Ein"], {"de": "<2de>", "fr": "<2fr>"}) == 2
    assert leading_tag_pieces(["<2fr>", "▁Ein"], {"fr": "<2fr>"}) == 1
    assert leading_tag_pieces(["▁", "Ein"], {"fr": "<2fr>"}) == 0
    # An imported checkpoint's tag, one piece with its word boundary.
    assert leading_tag_pieces(["▁>>fra<<", "▁Ein"], {"fra": ">>fra<<"}) == 1


def test_backtranslation_picks_the_untrained_directions_and_a_pivot_into_their_sources():
    from pipeline.backtranslate import pivot_language, untrained_directions

    data = {"multiway_train": dict.fromkeys(FOUR, "f"), "directions": "to_and_from:en",
            "synthetic_directions": None}  # fmt: skip
    unseen = untrained_directions(data)
    assert len(unseen) == 6 and all("en" not in (d.source, d.target) for d in unseen)
    assert pivot_language(data, ["cs", "de", "fr"]) == "en"
    assert untrained_directions(data, "de-fr") == [Direction("de", "fr")]
    with pytest.raises(UserError, match="--directions: the model trains de-en already"):
        untrained_directions(data, "de-en")
    with pytest.raises(UserError, match="--pivot de: the model does not translate de into"):
        pivot_language(data, ["cs", "fr"], "de")
    chain = {**data, "directions": "de-en,en-fr,fr-cs"}
    with pytest.raises(UserError, match="no language of the set is translated by the model into"):
        pivot_language(chain, ["cs", "de", "en", "fr"])
    everything = {**data, "directions": "all"}
    with pytest.raises(UserError, match="trains every direction of its set already"):
        untrained_directions(everything)


def test_backtranslation_teaches_the_untrained_directions_from_the_models_translations(
    trained, exported, tmp_path, capsys
):
    import shutil

    from export.runtime import OnnxTranslator
    from pipeline import backtranslate
    from pipeline.data.corpus import read_lines

    model = tmp_path / "model"
    shutil.copytree(trained, model, ignore=shutil.ignore_patterns("checkpoints", "logs"))
    (model / "export").symlink_to(exported)
    workdir = tmp_path / "backtranslated"
    history = backtranslate.main(["--model", str(model), "--workdir", str(workdir),
                                  "--set", "distill.beam_size=1", "--set", "train.epochs=1",
                                  "--set", "train.bleu_every_epochs=0",
                                  "--set", "data.multiway_test=null"])  # fmt: skip
    captured = capsys.readouterr()
    assert "Back-translation: en -> de, the sources of de-fr" in captured.out
    assert "train: fr-de: " in captured.out and len(history["loss"]) == 1
    english = read_lines(SMOKE.parent.parent / "data" / "multi30k" / "val.en.gz")
    translator = OnnxTranslator(exported / "onnx")
    for language in ("de", "fr"):
        made = read_lines(workdir / backtranslate.BACKTRANSLATED_DIR / language /
                          "train.target.txt")  # fmt: skip
        assert len(made) == len(english)
        assert made[:5] == translator.translate(english[:5], target_language=language,
                                                beam_size=1)  # fmt: skip
    saved = load_config(workdir / "config.yaml", saved=True)["data"]
    assert saved["synthetic_directions"] == "de-fr,fr-de"
    assert (workdir / "model.keras").is_file()
    with pytest.raises(SystemExit) as stopped:
        backtranslate.main(["--model", str(workdir), "--workdir", str(tmp_path / "again")])
    assert stopped.value.code == 2
    assert "no ONNX export" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        backtranslate.main(["--model", str(model), "--set", "distill.interpolate=true"])
    assert "back-translation's have none" in capsys.readouterr().err
