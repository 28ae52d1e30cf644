"""Imported Marian checkpoints compute what transformers computes: the fixtures under
tests/fixtures/hf_marian (made by tools/hf_fixtures.py in a venv of its own, with torch and
transformers, which this environment never has) hold small trained checkpoints and what
transformers gave for them: tokenizer ids, logits for forced targets, greedy and beam ids."""

import json
import shutil
import subprocess
import sys

import numpy as np
import pytest
import tensorflow as tf

from helpers import PROJECT_ROOT, run_python
from layers.transformer import NEVER
from pipeline.core.errors import UserError
from pipeline.decoding.search import search
from pipeline.decoding.search_options import SearchOptions
from pipeline.import_model import import_checkpoint
from pipeline.pretrained import vocabulary
from pipeline.pretrained.checkpoint import GENERATION_CONFIG_FILE, Checkpoint
from pipeline.pretrained.generation import IMPORT_NOTES, generate_settings
from pipeline.workdir import load_trained
from pretrained_helpers import (
    LOGIT_TOLERANCE,
    IdMap,
    expected_case,
    first_hypotheses,
    import_fixtures,
    indices_by,
)

FIXTURES = PROJECT_ROOT / "tests" / "fixtures" / "hf_marian"
NAMES = ("shared_tied_swish", "separate_untied_relu", "unequal_gelu", "multi_target")
# The fixture whose generation_variants.json holds generate()'s ids under other settings.
VARIANTS_FIXTURE = "shared_tied_swish"
GENERATION_VARIANTS = json.loads(
    (FIXTURES / VARIANTS_FIXTURE / "generation_variants.json").read_text(encoding="utf-8")
)


def expected(name):
    return expected_case(FIXTURES, name)


@pytest.fixture(scope="module")
def imported(tmp_path_factory):
    return import_fixtures(tmp_path_factory, FIXTURES, NAMES)


def test_safetensors_rows_are_read_as_indexing_the_whole_tensor_would():
    weights = Checkpoint(FIXTURES / "separate_untied_relu").weights()
    name = "model.encoder.embed_tokens.weight"
    table = weights[name]
    rows = np.array([5, 3, 3, 0, len(table) - 1, 4, 6, 7, 20, 19])
    assert weights.shape(name) == table.shape
    np.testing.assert_array_equal(weights.rows(name, rows), table[rows])


def id_maps(name, workdir):
    _, _, source_tokenizer, target_tokenizer = load_trained(workdir)
    directory = FIXTURES / name
    source_table = json.loads((directory / "vocab.json").read_text(encoding="utf-8"))
    target_file = directory / "target_vocab.json"
    target_table = (json.loads(target_file.read_text(encoding="utf-8"))
                    if target_file.is_file() else source_table)  # fmt: skip
    config = json.loads((directory / "config.json").read_text(encoding="utf-8"))
    return IdMap(source_tokenizer, source_table, config), IdMap(
        target_tokenizer, target_table, config
    )


def requests(name, workdir):
    """The fixture's sources as the toolkit's runtimes take them (tagged where multi-target)."""
    from pipeline.decoding.translation import Translator

    case = expected(name)
    translator = Translator.from_trained(load_trained(workdir))
    return translator.requests(case["sentences"], case.get("target_languages"))


def source_batch(name, workdir):
    _, _, source_tokenizer, _ = load_trained(workdir)
    ragged = source_tokenizer.tokenize(tf.constant(requests(name, workdir)))
    return ragged.to_list(), ragged.to_tensor(0)


@pytest.mark.parametrize("name", NAMES)
def test_sources_and_targets_tokenize_as_marian_tokenizer_does(imported, name):
    case = expected(name)
    source_map, target_map = id_maps(name, imported[name])
    pieces, _ = source_batch(name, imported[name])
    eos = source_map.to_checkpoint[3]
    assert [source_map.checkpoint(ids) + [eos] for ids in pieces] == case["source_ids"]
    _, _, _, target_tokenizer = load_trained(imported[name])
    targets = target_tokenizer.tokenize(tf.constant(case["target_texts"])).to_list()
    assert [target_map.checkpoint(ids) + [eos] for ids in targets] == case["target_ids"]


@pytest.mark.parametrize("name", NAMES)
def test_logits_for_forced_targets_match_transformers(imported, name):
    _, model, _, _ = load_trained(imported[name])
    source_map, target_map = id_maps(name, imported[name])
    _, sources = source_batch(name, imported[name])
    ours, theirs_columns = target_map.output_columns(model.suppressed_ids)
    for forced in expected(name)["forced"]:
        index = forced["sentence_index"]
        source = sources[index : index + 1]
        target = tf.constant([target_map.ours(forced["decoder_input_ids"])])
        logits = model.forward({"source_ids": source, "target_input_ids": target})[0].numpy()[0]
        theirs = np.array(forced["logits"], np.float32)[:, theirs_columns]
        np.testing.assert_allclose(logits[:, ours], theirs, atol=LOGIT_TOLERANCE, rtol=0)
        assert (logits[:, list(model.suppressed_ids)] <= NEVER / 2).all()


@pytest.mark.parametrize("name", NAMES)
def test_greedy_and_beam_search_give_generates_ids(imported, name):
    """The whole fixture in one batch gives what `generate()` gave each sentence alone."""
    case = expected(name)
    config, model, _, _ = load_trained(imported[name])
    _, target_map = id_maps(name, imported[name])
    _, sources = source_batch(name, imported[name])
    for key, overrides in (("greedy_ids", {"beam_size": 1}), ("beam_ids", {})):
        options = SearchOptions.from_config(config["decode"], **overrides)
        ids, lengths, scores, _ = search(model, sources, options)
        assert [target_map.checkpoint(o) for o in first_hypotheses(ids, lengths)] == case[key], key
    np.testing.assert_allclose(scores.numpy()[:, 0], case["beam_scores"], atol=1e-4)
    # transformers' max_length counts the start token; ours counts the tokens output.
    options = SearchOptions.from_config(config["decode"], max_length=case["beam_short_length"] - 1)
    rows = sources[: len(case["beam_short"])]
    ids, lengths, _, _ = search(model, rows, options)
    assert [target_map.checkpoint(o) for o in first_hypotheses(ids, lengths)] == case["beam_short"]


def test_the_import_writes_a_work_directory_of_the_checkpoints_settings(imported):
    config, model, source_tokenizer, target_tokenizer = load_trained(imported["unequal_gelu"])
    checkpoint = json.loads((FIXTURES / "unequal_gelu" / "config.json").read_text())
    settings = config["model"]
    assert (settings["encoder_layers"], settings["decoder_layers"]) == (
        checkpoint["encoder_layers"], checkpoint["decoder_layers"])  # fmt: skip
    assert (settings["num_heads"], settings["decoder_num_heads"]) == (
        checkpoint["encoder_attention_heads"], checkpoint["decoder_attention_heads"])  # fmt: skip
    assert (settings["activation"], settings["positions"], settings["normalize_first"]) == (
        "gelu", "sinusoidal_halves", False)  # fmt: skip
    generation = json.loads((FIXTURES / "unequal_gelu" / "generation_config.json").read_text())
    decode = config["decode"]
    assert decode["beam_size"] == generation["num_beams"]
    assert decode["max_length_cap"] == generation["max_length"] - 1
    assert (decode["beam_stopping"], decode["force_eos_at_limit"]) == ("no_improvement", True)
    # Every id the model never outputs is suppressed: the padding, the start token.
    assert {0, 2} <= set(settings["suppressed_ids"])


def test_a_multi_target_model_takes_the_target_language_by_its_code(imported):
    config, _, _, _ = load_trained(imported["multi_target"])
    assert config["data"]["language_tags"] == {"deu": ">>deu<<", "fra": ">>fra<<"}
    with pytest.raises(ValueError, match="unknown language 'xyz'; this model translates into "
                       "deu, fra"):  # fmt: skip
        requests_for(imported["multi_target"], ["Ein Hund."], "xyz")


def requests_for(workdir, sentences, language):
    from pipeline.decoding.translation import Translator

    return Translator.from_trained(load_trained(workdir)).requests(sentences, language)


@pytest.fixture(scope="module")
def exported(imported, tmp_path_factory):
    """Two imports exported, between them to every format, each to those its tests read: the
    transformers 4 layout (shared, tied) and a multi-target model."""
    from export.exporter import export_model

    out = tmp_path_factory.mktemp("exported")
    for name, formats in (("shared_tied_swish", ("onnx", "ctranslate2")),
                          ("multi_target", ("saved_model", "onnx"))):  # fmt: skip
        export_model(imported[name], out / name, formats=formats, log=lambda _: None)
    return out


@pytest.mark.parametrize("name", ("shared_tied_swish", "multi_target"))
def test_onnx_runtime_gives_generates_ids(imported, exported, name):
    from export.runtime import OnnxTranslator

    case = expected(name)
    _, target_map = id_maps(name, imported[name])
    translator = OnnxTranslator(exported / name)
    sources = translator.encode(
        translator.requests(case["sentences"], case.get("target_languages"))
    )
    hypotheses = translator.translate_ids(sources, None, None, n_best=1)
    assert [target_map.checkpoint(h[0][0]) for h in hypotheses] == [
        ids[:-1] for ids in case["beam_ids"]]  # fmt: skip


def test_saved_model_gives_generates_translations_in_the_session_loader(exported):
    case = expected("multi_target")
    saved_model = exported / "multi_target" / "saved_model" / "translator" / "1"
    output = run_python(
        "import json, sys\n"
        "import tensorflow as tf, tensorflow_text\n"
        "tf.compat.v1.disable_eager_execution()\n"
        "with tf.compat.v1.Session(graph=tf.Graph()) as session:\n"
        "    meta = tf.compat.v1.saved_model.loader.load(session, ['serve'], sys.argv[1])\n"
        "    signature = meta.signature_def['serving_default']\n"
        "    feed = {signature.inputs['sentences'].name: json.loads(sys.argv[2]),\n"
        "            signature.inputs['target_language'].name: json.loads(sys.argv[3])}\n"
        "    texts = session.run(signature.outputs['translations'].name, feed)\n"
        "print(json.dumps([t.decode() for t in texts]))\n",
        saved_model, json.dumps(case["sentences"]), json.dumps(case["target_languages"]),
    )  # fmt: skip
    assert json.loads(output) == case["beam_texts"]


def test_a_model_whose_biases_are_zeros_translates_alike_through_onnx(imported, tmp_path):
    """Freshly initialised checkpoints (transformers' Linear biases start at zero, and the
    speed benchmarks use random weights) once lost their attention projections' shapes in
    the ONNX conversion."""
    from export.exporter import export_model
    from export.runtime import OnnxTranslator
    from pipeline.decoding.translation import Translator
    from pipeline.workdir import MODEL_FILE

    workdir = tmp_path / "zero_biases"
    shutil.copytree(imported["unequal_gelu"], workdir)
    trained = load_trained(workdir)
    model = trained[1]
    biases = [v for v in model.variables if v.path.endswith("/bias")]
    assert biases
    for variable in biases:
        variable.assign(np.zeros(variable.shape, np.float32))
    model.save(workdir / MODEL_FILE)
    export_model(workdir, tmp_path / "export", formats=("onnx",), log=lambda _: None)
    sentences = expected("unequal_gelu")["sentences"]
    in_process = Translator.from_trained(load_trained(workdir)).translate(sentences)
    assert OnnxTranslator(tmp_path / "export").translate(sentences) == in_process


def by_language(case):
    """{target language: the indices of the fixture's sentences translated into it}."""
    return indices_by(case["target_languages"])


def test_node_gives_generates_translations_into_the_language_asked(exported):
    from helpers import node_example

    node, example = node_example("node")
    case = expected("multi_target")
    for language, indices in by_language(case).items():
        sentences = [case["sentences"][i] for i in indices]
        result = subprocess.run(
            [node, "translate.mjs", str(exported / "multi_target" / "onnx"), *sentences,
             "--to", language],
            cwd=example, capture_output=True, text=True, timeout=300,
        )  # fmt: skip
        assert result.returncode == 0, result.stderr
        assert result.stdout.split("\n")[: len(indices)] == [case["beam_texts"][i] for i in indices]


def test_the_page_gives_generates_translations_into_the_language_chosen(exported):
    from test_web_example import page_translations

    case = expected("multi_target")
    runs = {language: (indices, ["--to", language])
            for language, indices in by_language(case).items()}  # fmt: skip
    shown = page_translations(exported / "multi_target" / "onnx", case["sentences"], runs)
    for language, (indices, _) in runs.items():
        assert shown[language] == [case["beam_texts"][i] for i in indices]


def test_ctranslate2_greedy_search_gives_generates_ids(imported, exported):
    import ctranslate2
    import sentencepiece

    name = "shared_tied_swish"
    case = expected(name)
    _, target_map = id_maps(name, imported[name])
    directory = exported / name / "ctranslate2"
    translator = ctranslate2.Translator(str(directory))
    processor = sentencepiece.SentencePieceProcessor(model_file=str(directory / "source.model"))
    results = translator.translate_batch(
        processor.encode(case["sentences"], out_type=str), beam_size=1, max_decoding_length=63,
        min_decoding_length=0, return_end_token=True,
    )  # fmt: skip
    target = sentencepiece.SentencePieceProcessor(model_file=str(directory / "target.model"))
    ids = [[target.piece_to_id(piece) for piece in r.hypotheses[0]] for r in results]
    assert [target_map.checkpoint(i) for i in ids] == case["greedy_ids"]


def checkpoint_json(name, file):
    return json.loads((FIXTURES / name / file).read_text(encoding="utf-8"))


@pytest.mark.parametrize("variant", sorted(GENERATION_VARIANTS))
def test_each_generation_setting_gives_generates_ids(imported, variant):
    """A checkpoint whose generation_config.json also held `variant`'s keys searches as
    `generate()` did with them."""
    case = GENERATION_VARIANTS[variant]
    name = VARIANTS_FIXTURE
    generation = {**checkpoint_json(name, GENERATION_CONFIG_FILE), **case["keys"]}
    settings = generate_settings(checkpoint_json(name, "config.json"), generation)
    config, model, _, _ = load_trained(imported[name])
    decode = {**config["decode"], **{k: v for k, v in settings.items() if k not in IMPORT_NOTES}}
    _, target_map = id_maps(name, imported[name])
    _, sources = source_batch(name, imported[name])
    options = SearchOptions.from_config(decode)
    ids, lengths, _, _ = search(model, sources[: len(case["ids"])], options)
    assert [target_map.checkpoint(o) for o in first_hypotheses(ids, lengths)] == case["ids"]


def test_a_translation_cut_at_the_limit_reads_as_marian_tokenizers_in_every_runtime(
    imported, exported
):
    """A hypothesis cut at max_length may end in a lone word-boundary piece, which SentencePiece
    decodes to a space and MarianTokenizer strips (the fixture's fifth sentence): so do the
    import's runtimes (`data.strip_translation_spaces`)."""
    from export.runtime import OnnxTranslator
    from pipeline.decoding.translation import Translator

    case, name = GENERATION_VARIANTS["cut_at_max_length"], VARIANTS_FIXTURE
    generation = {**checkpoint_json(name, GENERATION_CONFIG_FILE), **case["keys"]}
    # generate()'s max_length counts the decoder start; the import's limit does not.
    limit = generate_settings(checkpoint_json(name, "config.json"), generation)["max_length_cap"]
    sentences = expected(name)["sentences"][: len(case["texts"])]
    trained = load_trained(imported[name])
    assert trained[0]["data"]["strip_translation_spaces"]
    _, _, _, target_tokenizer = trained
    _, target_map = id_maps(name, imported[name])
    decoded = [target_tokenizer.processor.decode_ids(target_map.ours(ids[:-1]))
               for ids in case["ids"]]  # fmt: skip
    assert any(text != text.strip(" ") for text in decoded)  # the case the fixture holds
    in_process = Translator.from_trained(trained, max_length=limit).translate(sentences)
    onnx = OnnxTranslator(exported / name).translate(sentences, max_length=limit)
    assert in_process == onnx == case["texts"]


def test_node_writes_a_translation_cut_at_the_limit_as_marian_tokenizer(exported):
    from helpers import node_example

    node, example = node_example("node")
    case, name = GENERATION_VARIANTS["cut_at_max_length"], VARIANTS_FIXTURE
    limit = case["keys"]["max_length"] - 1  # generate() counts the decoder start
    sentences = expected(name)["sentences"][: len(case["texts"])]
    result = subprocess.run(
        [node, "translate.mjs", str(exported / name / "onnx"), *sentences, "--max-length",
         str(limit)],
        cwd=example, capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert result.returncode == 0, result.stderr
    assert result.stdout.split("\n")[: len(sentences)] == case["texts"]


def test_generation_settings_that_change_nothing_import_and_sampling_is_said(tmp_path):
    neutral = {"repetition_penalty": 1.0, "num_beam_groups": 1, "suppress_tokens": [],
               "use_cache": True, "num_return_sequences": 3, "temperature": 0.7}  # fmt: skip
    settings = generate_settings({"num_beams": 5, "diversity_penalty": 0.0}, neutral)
    assert settings["beam_size"] == 5 and not settings["sampled"]
    # generate() reads generation_config.json's value over config.json's
    overridden = generate_settings({"repetition_penalty": 1.3}, {"repetition_penalty": 1.0})
    assert overridden["beam_size"] == 1
    source = broken_copy(tmp_path, edit_json(GENERATION_CONFIG_FILE, do_sample=True, top_p=0.9))
    lines = []
    config = import_checkpoint(source, tmp_path / "imported", log=lines.append)
    assert any("do_sample is true; the toolkit's search is beam search" in line for line in lines)
    assert config["decode"]["beam_size"] == 4 and "sampled" not in config["decode"]


# Bad checkpoints: one line, exit status 2, and no work directory left.


def broken_copy(tmp_path, change):
    copy = tmp_path / "checkpoint"
    shutil.copytree(FIXTURES / "shared_tied_swish", copy)
    change(copy)
    return copy


def shard_as(index_of, first_shard):
    """The weights moved into `first_shard` of two that the index of `index_of` lists (the
    second never written: a download cut short)."""

    def change(directory):
        second = first_shard.replace("00001-of", "00002-of")
        (directory / "model.safetensors").rename(directory / first_shard)
        weight_map = {"a": first_shard, "b": second}
        index = directory / f"{index_of}.index.json"
        index.write_text(json.dumps({"metadata": {}, "weight_map": weight_map}))

    return change


def truncated(file):
    def change(directory):
        data = (directory / file).read_bytes()
        (directory / file).write_bytes(data[: len(data) // 2])

    return change


def edit_json(file, **values):
    def change(directory):
        path = directory / file
        config = json.loads(path.read_text())
        config.update(values)
        path.write_text(json.dumps(config))

    return change


def edit_config(**values):
    return edit_json("config.json", **values)


@pytest.mark.parametrize(
    "change,message",
    [
        (lambda d: (d / "source.spm").unlink(), r"source.spm: missing"),
        (lambda d: (d / "vocab.json").unlink(), r"vocab.json: missing"),
        (edit_config(model_type="bart"), r"model_type 'bart' is not supported"),
        (edit_config(normalize_before=True), r"normalize_before: True is not supported"),
        (edit_config(activation_function="gelu_new"), r"activation_function 'gelu_new'"),
        (edit_config(d_model=48), r"has shape .* the configuration gives"),
        (
            lambda d: (d / "model.safetensors").write_bytes(b"\x00" * 64),
            r"model.safetensors: "
            r"not a readable safetensors file",
        ),
        (
            lambda d: (d / "model.safetensors").rename(d / "pytorch_model.bin"),
            r"pytorch_model.bin: .*needs torch to read: pip install torch",
        ),
        (lambda d: (d / "config.json").write_text("{"), r"config.json: not readable JSON"),
        (
            shard_as("model.safetensors", "model-00001-of-00002.safetensors"),
            r"model-00002-of-00002.safetensors: missing",
        ),
        (truncated("model.safetensors"), r"model.safetensors: not a readable safetensors file"),
        (
            shard_as("pytorch_model.bin", "pytorch_model-00001-of-00002.bin"),
            r"pytorch_model-00001-of-00002.bin: .*needs torch to read: pip install torch",
        ),
        (
            edit_json(GENERATION_CONFIG_FILE, repetition_penalty=1.2),
            r"generation_config.json: repetition_penalty 1.2 is not supported; the toolkit's "
            r"search would apply no repetition penalty",
        ),
        (edit_config(num_beam_groups=2), r"config.json: num_beam_groups 2 is not supported"),
        (
            edit_json(GENERATION_CONFIG_FILE, beam_flavour="wide"),
            r"beam_flavour is no generation setting the importer knows",
        ),
    ],  # fmt: skip
)
def test_a_bad_checkpoint_is_one_line_and_leaves_nothing(tmp_path, change, message):
    source = broken_copy(tmp_path, change)
    workdir = tmp_path / "imported"
    if "torch" in message and _importable("torch"):
        pytest.skip("torch is installed here")
    with pytest.raises(UserError, match=message):
        import_checkpoint(source, workdir, log=lambda _: None)
    assert not workdir.exists()


def _importable(module):
    import importlib.util

    return importlib.util.find_spec(module) is not None


def write_safetensors(path, tensors):
    """A safetensors file of {name: (safetensors dtype, the array of its bits or values)},
    written as the format lays it out (NumPy has no bfloat16 for safetensors' own writer)."""
    header, data, offset = {}, [], 0
    for name, (dtype, array) in tensors.items():
        raw = np.ascontiguousarray(array).tobytes()
        header[name] = {"dtype": dtype, "shape": list(array.shape),
                        "data_offsets": [offset, offset + len(raw)]}  # fmt: skip
        data.append(raw)
        offset += len(raw)
    text = json.dumps(header).encode()
    text += b" " * (-len(text) % 8)
    path.write_bytes(len(text).to_bytes(8, "little") + text + b"".join(data))


def test_float16_and_bfloat16_checkpoints_import_as_their_values_in_float32(tmp_path):
    """A checkpoint stored in bfloat16 and float16 (as many on the Hub are) imports as the
    float32 checkpoint of the same values does, weight for weight, the embedding tables read
    a block of rows at a time as ever; the import names the dtypes it read."""
    from safetensors.numpy import load_file

    source = FIXTURES / "separate_untied_relu"
    halves, twin = tmp_path / "halves", tmp_path / "float32_twin"
    for directory in (halves, twin):
        shutil.copytree(source, directory)
    stored, values = {}, {}
    for index, (name, array) in enumerate(sorted(load_file(source / "model.safetensors").items())):
        if "embed" in name or index % 2:  # bfloat16: the upper half of float32's bits
            bits = (array.astype(np.float32).view(np.uint32) >> 16).astype(np.uint16)
            stored[name] = ("BF16", bits)
            values[name] = (bits.astype(np.uint32) << 16).view(np.float32)
        else:
            stored[name] = ("F16", array.astype(np.float16))
            values[name] = stored[name][1].astype(np.float32)
    write_safetensors(halves / "model.safetensors", stored)
    write_safetensors(twin / "model.safetensors", {k: ("F32", v) for k, v in values.items()})
    (halves / "README.md").write_text("---\nlanguage: [de, en]\nlicense: cc-by-4.0\n---\n# Card\n")
    said = []
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(vocabulary, "BLOCK_ROWS", 37)
        import_checkpoint(halves, tmp_path / "from_halves", log=said.append)
        import_checkpoint(twin, tmp_path / "from_twin", log=lambda _: None)
    assert "its weights stored as bfloat16 and float16 (read as float32)" in said[0]
    assert said[1].startswith("Licence: cc-by-4.0, as the checkpoint states it")
    ours, theirs = (load_trained(tmp_path / name)[1].get_weights()
                    for name in ("from_halves", "from_twin"))  # fmt: skip
    assert len(ours) == len(theirs)
    for mine, expected_values in zip(ours, theirs):
        np.testing.assert_array_equal(mine, expected_values)


@pytest.mark.parametrize(
    ("card", "config", "licence"),
    [
        ("---\nlicense: cc-by-nc-4.0\n---\nNLLB-200", {}, "cc-by-nc-4.0"),
        ("---\r\nlicense: other\r\nlicense_name: acme\r\nlicense_link: LICENSE\r\n---\r\n",
         {}, "other: acme LICENSE"),
        (None, {"license": "apache-2.0"}, "apache-2.0"),
        ("---\nlicense: [unclosed\n---\n", {"license": "mit"}, "mit"),
        ("# A card without front matter\nlicense: cc-by-4.0\n", {}, None),
        (None, {}, None),
    ],
)  # fmt: skip
def test_the_licence_comes_from_the_model_card_or_the_config(tmp_path, card, config, licence):
    """The licence a checkpoint names: its model card's front matter first (with the name and
    link of an `other` licence), config.json's `license` else; a card that is only prose, or
    whose front matter YAML cannot read, names none."""
    from pipeline.pretrained.checkpoint import MODEL_CARD_FILE, Checkpoint

    (tmp_path / "config.json").write_text(json.dumps({"model_type": "marian", **config}))
    if card is not None:
        (tmp_path / MODEL_CARD_FILE).write_text(card)
    assert Checkpoint(tmp_path).licence() == licence


def fake_hub(monkeypatch, tmp_path, listing, download_error=None):
    """huggingface_hub as `resolve` calls it, offline: the repository's files `listing` (an
    exception: the listing fails), a download into tmp_path/ID that records its patterns."""
    import types

    fetched = []

    def list_repo_files(repo_id):
        if isinstance(listing, Exception):
            raise listing
        return listing

    def snapshot_download(repo_id, allow_patterns):
        if download_error:
            raise download_error
        fetched.append(allow_patterns)
        return str(tmp_path / repo_id)

    module = types.SimpleNamespace(list_repo_files=list_repo_files,
                                   snapshot_download=snapshot_download)  # fmt: skip
    monkeypatch.setitem(sys.modules, "huggingface_hub", module)
    return fetched


@pytest.mark.parametrize(
    ("listing", "torch_fetched"),
    [(["config.json", "model.safetensors", "pytorch_model.bin"], False),
     (["config.json", "pytorch_model.bin.index.json", "pytorch_model-00001-of-00003.bin"], True),
     (OSError("offline"), True)],
)  # fmt: skip
def test_a_hub_id_fetches_the_weights_once_and_the_model_card(
    monkeypatch, tmp_path, listing, torch_fetched
):
    """A Hub id is downloaded with the files an import reads and the model card: safetensors
    weights where the repository has them, its PyTorch files only where it has not (or where
    its listing cannot be read, offline: the cache answers)."""
    from pipeline.pretrained.checkpoint import MODEL_CARD_FILE, resolve

    fetched = fake_hub(monkeypatch, tmp_path, listing)
    said = []
    assert resolve("facebook/nllb-200-3.3B", said.append) == tmp_path / "facebook/nllb-200-3.3B"
    assert said == ["Fetching facebook/nllb-200-3.3B from the Hugging Face Hub"]
    assert "*.safetensors" in fetched[0] and MODEL_CARD_FILE in fetched[0]
    assert ("pytorch_model*.bin" in fetched[0]) == torch_fetched


def test_a_hub_id_that_cannot_be_fetched_is_one_line(monkeypatch, tmp_path):
    from pipeline.pretrained.checkpoint import resolve

    fake_hub(monkeypatch, tmp_path, [], download_error=OSError("offline\nand more"))
    with pytest.raises(UserError, match=r"^owner/model: cannot fetch it from the Hub \(offline\)$"):
        resolve("owner/model")
    monkeypatch.setitem(sys.modules, "huggingface_hub", None)  # not installed
    with pytest.raises(UserError, match=r'huggingface_hub \(pip install "seq2seq-tf\[hub\]"\)'):
        resolve("owner/model")
    with pytest.raises(UserError, match="no such directory$"):
        resolve("not a hub id")


def test_the_command_reports_one_line_and_exit_status_2(tmp_path):
    result = subprocess.run(
        [sys.executable, "-m", "pipeline.import_model", str(tmp_path / "nowhere"),
         "--workdir", str(tmp_path / "w")],
        capture_output=True, text=True, cwd=PROJECT_ROOT,
    )  # fmt: skip
    assert result.returncode == 2
    assert result.stderr.strip().splitlines() == [
        f"error: {tmp_path / 'nowhere'}: no such directory"
    ]
    assert not (tmp_path / "w").exists()


def test_an_existing_work_directory_is_refused(imported):
    with pytest.raises(UserError, match="already holds a model"):
        import_checkpoint(FIXTURES / "unequal_gelu", imported["unequal_gelu"], log=lambda _: None)


def test_fine_tuning_an_import_keeps_its_model_vocabularies_and_search(imported, tmp_path):
    """A config that names only data and a schedule fine-tunes the imported model."""
    from pipeline.train import main as train

    data = PROJECT_ROOT / "data" / "multi30k"
    config = tmp_path / "domain.yaml"
    config.write_text(
        f"data:\n  train_source: {data / 'val.de.gz'}\n  train_target: {data / 'val.en.gz'}\n"
        "  max_source_length: 40\n  max_target_length: 40\n"
        "train:\n  precision: float32\n  epochs: 1\n  steps_per_epoch: 2\n  batch_size: 16\n"
        "  bleu_every_epochs: 0\n  attention_images: 0\n"
    )  # fmt: skip
    workdir = tmp_path / "fine_tuned"
    train(["--config", str(config), "--workdir", str(workdir),
           "--init-from", str(imported["shared_tied_swish"])])  # fmt: skip
    tuned, model, source_tokenizer, _ = load_trained(workdir)
    original, original_model, original_source, _ = load_trained(imported["shared_tied_swish"])
    assert tuned["model"] == original["model"] and tuned["decode"] == original["decode"]
    assert source_tokenizer.model_proto == original_source.model_proto
    moved = [not np.array_equal(a, b) for a, b in
             zip(model.get_weights(), original_model.get_weights())]  # fmt: skip
    assert any(moved)


def test_fine_tuning_a_multi_target_import_tags_its_sources(imported, tmp_path):
    """Each training source starts with the tag of `data.target_language`, as the model is
    asked at translation; without one, the configuration is refused in one line."""
    from pipeline.config import load_config
    from pipeline.data.corpus import scan_training_corpora
    from pipeline.data.dataset import StreamCounters, stream_training_examples
    from pipeline.train import inherited_overrides

    workdir = imported["multi_target"]
    _, _, source_tokenizer, target_tokenizer = load_trained(workdir)
    sentence = "A dog runs across the meadow."
    for side, text in (("source", sentence), ("target", "Un chien traverse le pré.")):
        (tmp_path / f"pair.{side}").write_text(text + "\n", encoding="utf-8")
    config = tmp_path / "domain.yaml"
    config.write_text(
        f"data:\n  train_source: {tmp_path / 'pair.source'}\n"
        f"  train_target: {tmp_path / 'pair.target'}\n  target_language: fra\n"
    )  # fmt: skip
    data = load_config(config, inherited_overrides(config, [], workdir))["data"]
    corpora, _, _ = scan_training_corpora(data, log=lambda _: None)
    stream, _ = stream_training_examples(corpora, source_tokenizer, target_tokenizer, data,
                                         StreamCounters(corpora, [0]), 0)  # fmt: skip
    inputs, _ = next(iter(stream))
    asked = source_tokenizer.tokenize(tf.constant(requests_for(workdir, [sentence], "fra")))
    assert inputs["source_ids"].numpy().tolist() == asked.to_list()[0]
    assert (
        source_tokenizer.processor.id_to_piece(asked.to_list()[0][0]).lstrip("\u2581") == ">>fra<<"
    )
    config.write_text(config.read_text().replace("  target_language: fra\n", ""))
    refusal = ("data.target_language: give the training pairs' target language by the "
               "checkpoint's code; this model translates into deu, fra")  # fmt: skip
    with pytest.raises(UserError, match=refusal):
        load_config(config, inherited_overrides(config, [], workdir))


def test_evaluate_tells_a_multi_target_import_the_splits_target_language(
    imported, tmp_path, capsys
):
    """One target language of the fixture as a TSV split, its references what transformers
    gave: BLEU 100 when evaluate is told the language; one line when it is not."""
    from pipeline import evaluate

    case = expected("multi_target")
    indices = [i for i, code in enumerate(case["target_languages"]) if code == "fra"]
    split = tmp_path / "split.tsv"
    split.write_text("".join(f"{case['sentences'][i]}\t{case['beam_texts'][i]}\n"
                             for i in indices), encoding="utf-8")  # fmt: skip
    workdir = str(imported["multi_target"])
    evaluate.main(["--workdir", workdir, "--split", str(split), "--target-language", "fra"])
    assert json.loads(capsys.readouterr().out)["bleu"] == 100.0
    with pytest.raises(SystemExit) as exit_status:
        evaluate.main(["--workdir", workdir, "--split", str(split)])
    assert exit_status.value.code == 2
    assert "give --target-language" in capsys.readouterr().err


def test_a_fine_tuned_multi_target_import_is_scored_into_its_language(imported, tmp_path):
    """The test report and pipeline.evaluate of the configuration's split ask the model for
    data.target_language: at learning rate 0, the references being generate()'s beam texts
    into fra, both score 100."""
    from pipeline import evaluate
    from pipeline.train import main as train

    case = expected("multi_target")
    indices = [i for i, code in enumerate(case["target_languages"]) if code == "fra"]
    for side, key in (("source", "sentences"), ("target", "beam_texts")):
        (tmp_path / f"split.{side}").write_text(
            "".join(f"{case[key][i]}\n" for i in indices), encoding="utf-8"
        )
    files = "".join(f"  {split}_{side}: {tmp_path / f'split.{side}'}\n"
                    for split in ("train", "test") for side in ("source", "target"))  # fmt: skip
    config = tmp_path / "domain.yaml"
    config.write_text(
        f"data:\n{files}  target_language: fra\n"
        "train:\n  precision: float32\n  epochs: 1\n  steps_per_epoch: 1\n  batch_size: 8\n"
        "  learning_rate: 0.0\n"
    )  # fmt: skip
    workdir = tmp_path / "tuned"
    train(["--config", str(config), "--workdir", str(workdir), "--init-from",
           str(imported["multi_target"])])  # fmt: skip
    assert json.loads((workdir / "test_report.json").read_text())["bleu"] == 100.0
    evaluate.main(["--workdir", str(workdir), "--split", "test"])
    assert json.loads((workdir / "eval_test.json").read_text())["bleu"] == 100.0
