"""Export: the SavedModel's signatures (in process, through TF Serving's session loader and
without tensorflow-text), ONNX parity, the TensorFlow-free runtime, the TF Serving client
and the Node.js example, on a briefly trained smoke model."""

import collections
import json
import math
import os
import shutil
import subprocess
import sys

import numpy as np
import onnx
import onnxruntime
import pytest
import tensorflow as tf

import export.__main__ as export_cli
from export import client
from export.exporter import export_onnx, export_saved_model
from export.onnx_rewrites import optimise_loops, subgraphs
from export.runtime import OnnxTranslator, encode_each
from export.serving_check import read_meta_graph, unsupported_ops, write_signature_only
from export.serving_graph import TranslationGraph
from export.signature import REQUIRED_INPUTS, SIGNATURES
from helpers import (
    node_example,
    padded_ids,
    real_sentences,
    run_python,
    search_onnx,
    search_saved_model,
)
from pipeline.config import PROJECT_ROOT
from pipeline.core.errors import UnusableFileError, UserError
from pipeline.data.tokenizer import EOS_ID, PAD_ID
from pipeline.decoding.search import beam_search, decode_length_limits, greedy_search
from pipeline.decoding.translation import SearchOptions, Translator
from pipeline.model_types import MODEL_TYPES
from pipeline.workdir import load_trained

MODEL_NAME = "translator"


@pytest.fixture(scope="module")
def workdir(exported_workdir):
    return exported_workdir


@pytest.fixture(scope="module")
def out(workdir):
    return workdir / "export"


@pytest.fixture(scope="module")
def saved_model_dir(out):
    return out / "saved_model" / MODEL_NAME / "1"


@pytest.fixture(scope="module")
def loaded(saved_model_dir):
    return tf.saved_model.load(str(saved_model_dir))


@pytest.fixture(scope="module")
def onnx_session(out):
    return onnxruntime.InferenceSession(
        str(out / "onnx" / "model.onnx"), providers=["CPUExecutionProvider"]
    )


def keras_beam_search(config, model, source_ids, beam_size, **options):
    """Keras' beam search as the exports run it: ids `[batch, 1, width]`."""
    decode = config["decode"]
    source_ids = tf.constant(source_ids)
    limits = decode_length_limits(
        source_ids, PAD_ID, decode["max_length_ratio"], decode["max_length_offset"],
        decode["max_length_cap"],
    )  # fmt: skip
    return beam_search(
        model, source_ids, limits, beam_size, alpha=decode["length_penalty"],
        penalty=decode["length_penalty_type"], beta=decode["coverage_penalty"], **options,
    )[0].numpy()  # fmt: skip


def serve(loaded, sentences):
    outputs = loaded.signatures["serving_default"](sentences=tf.constant(sentences, tf.string))
    return [t.decode() for t in outputs["translations"].numpy()], outputs["scores"].numpy()


def test_training_exports_both_formats_in_place(out, saved_model_dir):
    assert (saved_model_dir / "saved_model.pb").is_file()
    assert (saved_model_dir / "variables").is_dir()
    onnx_files = {p.name for p in (out / "onnx").iterdir()}
    assert onnx_files == {
        "model.onnx", "model.int8.onnx", "model.json",
        "source.model", "source.vocab", "target.model", "target.vocab",
    }  # fmt: skip
    metadata = json.loads((out / "onnx" / "model.json").read_text())
    assert (metadata["model"], metadata["int8_model"]) == ("model.onnx", "model.int8.onnx")
    assert metadata["special_ids"] == {"pad": 0, "unk": 1, "bos": 2, "eos": 3}
    config, model, _, _ = load_trained(out.parent)
    assert metadata["description"] == {
        "name": out.parent.name, "type": "rnn", "parameters": model.count_params(),
        "properties": MODEL_TYPES["rnn"].properties(config),
    }  # fmt: skip
    assert metadata["defaults"] == {
        "beam_size": 5, "n_best": 1, "length_penalty": 0.6, "max_length": 0,
        "no_repeat_ngram_size": 0,
    }  # fmt: skip
    assert not [p for p in out.rglob(".*") if ".tmp-" in p.name or ".old-" in p.name]


def test_versions_count_up_and_an_existing_one_is_refused(workdir, tmp_path, capsys):
    output = tmp_path / "out"
    for _ in range(2):
        export_cli.main(["--workdir", str(workdir), "--output", str(output),
                         "--formats", "saved_model"])  # fmt: skip
    versions = sorted(p.name for p in (output / "saved_model" / MODEL_NAME).iterdir())
    assert versions == ["1", "2"]
    before = (output / "saved_model" / MODEL_NAME / "1" / "saved_model.pb").read_bytes()
    with pytest.raises(SystemExit) as exit_info:
        export_cli.main(["--workdir", str(workdir), "--output", str(output), "--version", "1",
                         "--formats", "saved_model"])  # fmt: skip
    assert exit_info.value.code == 2
    assert "already exists" in capsys.readouterr().err
    assert (output / "saved_model" / MODEL_NAME / "1" / "saved_model.pb").read_bytes() == before
    assert sorted(p.name for p in (output / "saved_model" / MODEL_NAME).iterdir()) == versions


def test_the_converters_chatter_goes_to_the_export_log(workdir, tmp_path):
    """As a user runs it (a fresh process: pytest's capture would hide where stderr goes)."""
    output = tmp_path / "out"
    result = subprocess.run(
        [sys.executable, "-m", "export", "--workdir", str(workdir), "--output", str(output),
         "--formats", "onnx"],
        capture_output=True, text=True, cwd=PROJECT_ROOT, timeout=300, check=True,
    )  # fmt: skip
    lines = (result.stdout + result.stderr).splitlines()  # ours alone
    assert len(lines) == 2 and lines[0].startswith("ONNX: "), lines
    assert "export.log" in lines[1] and (output / "export.log").exists()


def test_bad_formats_and_missing_workdir_are_refused(tmp_path, capsys):
    for argv in (["--workdir", str(tmp_path), "--formats", "tflite"], ["--workdir", str(tmp_path)]):
        with pytest.raises(SystemExit) as exit_info:
            export_cli.main(argv)
        assert exit_info.value.code == 2
    err = capsys.readouterr().err
    assert "--formats must be a comma-separated subset" in err and "no trained model" in err


def test_serving_default_translates_like_the_in_process_translator(workdir, loaded):
    sentences = real_sentences(24)
    config, model, source_tokenizer, target_tokenizer = load_trained(workdir)
    translator = Translator(
        model, source_tokenizer, target_tokenizer, SearchOptions.from_config(config["decode"]),
        batch_size=len(sentences),
    )  # fmt: skip
    expected = translator.hypotheses(sentences)  # the same batch: the same padding and sums
    translations, scores = serve(loaded, sentences)
    assert translations == [h[0].text for h in expected]
    np.testing.assert_allclose(scores, [h[0].score for h in expected], atol=1e-4)
    assert any(len(t.split()) > 2 for t in translations)  # the model writes real outputs


def test_serving_default_gives_empty_output_for_empty_input(loaded):
    translations, scores = serve(loaded, ["", "Ein Hund.", "   "])
    assert translations[0] == translations[2] == "" and translations[1]
    assert scores[0] == scores[2] == 0.0
    assert serve(loaded, [])[0] == []


def test_beam_search_signature_options_and_defaults(workdir, loaded):
    source_ids = padded_ids(workdir, real_sentences(6))
    default = search_saved_model(loaded, source_ids)
    explicit = search_saved_model(
        loaded, source_ids, beam_size=5, n_best=1, length_penalty=np.float32(0.6), max_length=0,
        no_repeat_ngram_size=0,
    )  # fmt: skip
    for name in default:
        np.testing.assert_array_equal(default[name], explicit[name])
    assert default["ids"].shape[:2] == (6, 1)
    assert default["attention"].shape == (*default["ids"].shape, source_ids.shape[1])

    n_best = search_saved_model(loaded, source_ids, beam_size=4, n_best=3)
    assert n_best["ids"].shape[:2] == (6, 3)
    assert np.all(np.diff(n_best["scores"], axis=1) <= 0)  # best first

    _, model, _, _ = load_trained(workdir)
    greedy_ids, greedy_lengths, _, _ = greedy_search(model, tf.constant(source_ids), 12)
    beam_one = search_saved_model(loaded, source_ids, beam_size=1, max_length=12)
    np.testing.assert_array_equal(beam_one["ids"][:, 0], greedy_ids.numpy())
    np.testing.assert_array_equal(beam_one["lengths"][:, 0], greedy_lengths.numpy())

    capped = search_saved_model(loaded, source_ids, max_length=10_000)
    assert capped["ids"].shape[2] == 20  # decode.max_length_cap of the smoke config

    config = load_trained(workdir)[0]
    for options in ({"beam_size": 1}, {"beam_size": 4}):
        blocked = search_saved_model(loaded, source_ids, no_repeat_ngram_size=2, **options)
        keras_ids = keras_beam_search(
            config, model, source_ids, options["beam_size"], no_repeat_ngram_size=2
        )
        np.testing.assert_array_equal(blocked["ids"][:, 0], keras_ids[:, 0])
        for row in blocked["ids"][:, 0]:
            tokens = [t for t in row.tolist() if t != PAD_ID]
            bigrams = list(zip(tokens, tokens[1:]))
            assert len(set(bigrams)) == len(bigrams), tokens


def test_every_op_exists_in_stock_tf_serving(saved_model_dir):
    assert unsupported_ops(read_meta_graph(saved_model_dir).graph_def) == []


def test_saved_model_cli_runs_both_signatures_with_the_session_loader(
    saved_model_dir, loaded, workdir, tmp_path
):
    """`saved_model_cli run` (the loader TF Serving uses), with tensorflow-text's ops loaded
    as the server has them; omitted beam_search inputs take their defaults."""
    sentences = real_sentences(3)
    source_ids = padded_ids(workdir, sentences)
    for signature, inputs in (
        ("serving_default", f"sentences={sentences!r}"),
        ("beam_search", f"source_ids={source_ids.tolist()!r}"),
    ):
        run_python(
            "import sys, tensorflow_text\n"
            "from tensorflow.python.tools.saved_model_cli import main\n"
            "sys.argv = ['saved_model_cli'] + sys.argv[1:]\n"
            "main()\n",
            "run", "--dir", saved_model_dir, "--tag_set", "serve", "--signature_def", signature,
            "--input_exprs", inputs, "--outdir", tmp_path / signature,
        )  # fmt: skip
    translations = np.load(tmp_path / "serving_default" / "translations.npy", allow_pickle=True)
    assert [t.decode() for t in translations] == serve(loaded, sentences)[0]
    ids = np.load(tmp_path / "beam_search" / "ids.npy")
    np.testing.assert_array_equal(ids, search_saved_model(loaded, source_ids)["ids"])


def test_beam_search_runs_where_tensorflow_text_was_never_imported(
    saved_model_dir, loaded, workdir, tmp_path
):
    core_only = tmp_path / "beam_search_only"
    write_signature_only(saved_model_dir, "beam_search", core_only)
    source_ids = padded_ids(workdir, real_sentences(4))
    output = run_python(
        "import json, sys\n"
        "import tensorflow as tf\n"
        "tf.compat.v1.disable_eager_execution()\n"
        "with tf.compat.v1.Session(graph=tf.Graph()) as session:\n"
        "    meta = tf.compat.v1.saved_model.loader.load(session, ['serve'], sys.argv[1])\n"
        "    signature = meta.signature_def['beam_search']\n"
        "    feed = {signature.inputs['source_ids'].name: json.loads(sys.argv[2]),\n"
        "            signature.inputs['n_best'].name: 2}\n"
        "    ids = session.run(signature.outputs['ids'].name, feed)\n"
        "assert 'tensorflow_text' not in sys.modules\n"
        "print(json.dumps(ids.tolist()))\n",
        core_only, json.dumps(source_ids.tolist()),
    )  # fmt: skip
    expected = search_saved_model(loaded, source_ids, n_best=2)["ids"]
    np.testing.assert_array_equal(np.array(json.loads(output)), expected)


def test_onnx_loops_carry_only_what_changes_and_hold_their_weights(out):
    model = onnx.load(str(out / "onnx" / "model.onnx"))
    loops = [node for node in model.graph.node if node.op_type == "Loop"]
    assert loops and optimise_loops(model.graph) == {
        "hoisted": 0, "selects": 0, "folded_transposes": 0, "projected": 0, "layer_norms": 0,
        "hoisted_nodes": 0, "moved_initializers": 0,
    }  # fmt: skip
    # The decoder step looks its input projection up (target vocabulary x 3 GRU gates).
    tables = [
        initializer.dims
        for graph in subgraphs(model.graph)
        for initializer in graph.initializer
        if initializer.name.endswith("/projected_table")
    ]
    assert tables == [[300, 3 * 16]]
    # A matrix product inside a loop reads its weights from the enclosing graph only when the
    # enclosing graph reads them too (the encoder's first step is outside its loop).
    outer = {initializer.name for initializer in model.graph.initializer}
    read_outside = {name for node in model.graph.node for name in node.input}
    inner_products = [
        node
        for graph in list(subgraphs(model.graph))[1:]
        for node in graph.node
        if node.op_type in ("MatMul", "Gemm")
    ]
    assert inner_products
    assert all(set(node.input) & outer <= read_outside for node in inner_products)


def loop_nodes(model):
    """Nodes a step of each loop body runs, by body (nested loops apart)."""
    return [len(graph.node) for graph in list(subgraphs(model.graph))[1:]]


def test_a_greedy_onnx_export_searches_as_keras_in_a_smaller_loop(workdir, out, tmp_path):
    config, model, source_tokenizer, target_tokenizer = load_trained(workdir)
    decode = {**config["decode"], "beam_size": 1}
    graph = TranslationGraph(
        model, source_tokenizer.model_proto, target_tokenizer.model_proto, decode
    )
    onnx_dir = export_onnx(graph, workdir, tmp_path, 17, int8=False, search="greedy")
    metadata = json.loads((onnx_dir / "model.json").read_text())
    assert metadata["search"] == "greedy"
    assert metadata["inputs"] == ["source_ids", "target_prefix", "max_length"]
    assert metadata["defaults"] == {"max_length": 0}
    # Its decoding loop runs a fraction of the beam search's nodes a step.
    greedy_loops = loop_nodes(onnx.load(str(onnx_dir / "model.onnx")))
    beam_loops = loop_nodes(onnx.load(str(out / "onnx" / "model.onnx")))
    assert max(greedy_loops) < max(beam_loops) / 2
    translator = OnnxTranslator(onnx_dir)
    sentences = real_sentences(30) + [""]
    source_ids = padded_ids(workdir, sentences)
    limits = decode_length_limits(
        tf.constant(source_ids), PAD_ID, decode["max_length_ratio"],
        decode["max_length_offset"], decode["max_length_cap"],
    )  # fmt: skip
    ids, lengths, scores, attention = greedy_search(model, tf.constant(source_ids), limits)
    actual = translator.search(source_ids, beam_size=1, n_best=1, length_penalty=0.6)
    width = actual["ids"].shape[2]
    np.testing.assert_array_equal(actual["ids"][:-1, 0], ids.numpy()[:-1, :width])
    np.testing.assert_array_equal(actual["lengths"][:-1, 0], lengths.numpy()[:-1])
    np.testing.assert_allclose(actual["scores"][:-1, 0], scores.numpy()[:-1], atol=1e-4)
    np.testing.assert_allclose(
        actual["attention"][:-1, 0], attention.numpy()[:-1, :width], atol=1e-4
    )
    assert actual["lengths"][-1, 0] == 0  # the empty sentence
    # A sentence alone gets what it gets in the batch; max_length stays an input.
    assert translator.translate(sentences[3:4]) == translator.translate(sentences)[3:4]
    short = translator.search(source_ids[:4], max_length=3)
    assert short["ids"].shape[2] == 3 and (short["lengths"] <= 3).all()
    with pytest.raises(ValueError, match="greedy search alone .* takes no beam_size \\(5\\)"):
        translator.translate(sentences[:2], beam_size=5)
    # The Node.js example: the same translations; a wider beam is one line and exit 2.
    node, example = node_example("node")
    command = [node, "translate.mjs", str(onnx_dir), *sentences[:3]]
    result = subprocess.run(command + ["--beam-size", "1", "--length-penalty", "1"],
                            cwd=example, capture_output=True, text=True, timeout=300)  # fmt: skip
    assert result.stdout.split("\n")[:3] == translator.translate(sentences[:3]), result.stderr
    result = subprocess.run(command + ["--beam-size", "5"], cwd=example, capture_output=True,
                            text=True, timeout=300)  # fmt: skip
    assert result.returncode == 2
    assert result.stderr.strip() == (
        "error: this export has the greedy search alone and takes no --beam-size 5"
    )


def test_onnx_gives_the_saved_models_ids_on_hundreds_of_inputs(workdir, loaded, onnx_session):
    rng = np.random.default_rng(7)
    batches = []
    for _ in range(20):  # random ids, right-padded rows of mixed lengths
        rows, width = rng.integers(1, 9), rng.integers(1, 16)
        ids = rng.integers(4, 300, size=(rows, width)).astype(np.int32)
        for row in ids:
            row[rng.integers(1, width + 1) :] = 0
        batches.append(ids)
    sentences = real_sentences(130)
    batches += [padded_ids(workdir, sentences[i : i + 13]) for i in range(0, 130, 13)]
    assert sum(len(b) for b in batches) >= 200
    settings = [
        {}, {"beam_size": 3, "n_best": 2}, {"beam_size": 1}, {"length_penalty": 1.0},
        {"no_repeat_ngram_size": 2}, {"beam_size": 1, "no_repeat_ngram_size": 3},
    ]  # fmt: skip
    for i, source_ids in enumerate(batches):
        options = settings[i % len(settings)]
        typed = {
            k: np.float32(v) if k == "length_penalty" else np.int32(v) for k, v in options.items()
        }
        expected = search_saved_model(loaded, source_ids, **typed)
        actual = search_onnx(onnx_session, source_ids, **typed)
        np.testing.assert_array_equal(actual["ids"], expected["ids"])
        np.testing.assert_array_equal(actual["lengths"], expected["lengths"])
        np.testing.assert_allclose(actual["scores"], expected["scores"], atol=1e-4)
        np.testing.assert_allclose(actual["attention"], expected["attention"], atol=1e-4)


def test_runtime_translates_without_tensorflow(out, loaded):
    sentences = real_sentences(12) + ["", "Ein Hund läuft über eine Wiese."]
    output = run_python(
        "import json, sys\n"
        "from export.runtime import OnnxTranslator\n"
        "translator = OnnxTranslator(sys.argv[1])\n"
        "sentences = json.loads(sys.argv[2])\n"
        "best = translator.translate(sentences, beam_size=5)\n"
        "n_best = translator.translate_n_best(sentences[:2], n_best=3)\n"
        "side_by_side = OnnxTranslator(sys.argv[1], batch_size=4, inter_threads=3)\n"
        "parallel = side_by_side.translate(sentences, beam_size=5)\n"
        "assert 'tensorflow' not in sys.modules, 'the runtime imported TensorFlow'\n"
        "print(json.dumps({'best': best, 'n_best': n_best, 'parallel': parallel}))\n",
        out, json.dumps(sentences),
    )  # fmt: skip
    result = json.loads(output)
    assert result["best"] == serve(loaded, sentences)[0]
    assert result["parallel"] == result["best"]  # four batches, three at a time, in order
    assert [len(h) for h in result["n_best"]] == [3, 3]
    assert result["n_best"][0][0][0] == result["best"][0]


def test_each_sentence_is_tokenised_alone_to_the_ids_of_a_batch_call(out):
    import sentencepiece

    processor = sentencepiece.SentencePieceProcessor(model_file=str(out / "onnx" / "source.model"))
    sentences = real_sentences(20) + ["", "Ein Hund läuft über eine Wiese."]
    calls = []

    class Recording:
        def encode(self, text):
            calls.append(text)
            return processor.encode(text)

    assert encode_each(Recording(), sentences) == processor.encode(sentences)
    assert calls == sentences  # one string a call: a list starts SentencePiece's thread pool


def test_int8_model_quantises_the_loops_and_translates(out, workdir, onnx_session):
    model = onnx.load(str(out / "onnx" / "model.int8.onnx"))
    products = collections.Counter()
    graphs = subgraphs(model.graph)
    loops = [node for graph in graphs for node in graph.node if node.op_type == "Loop"]
    for body in (loop.attribute[0].g for loop in loops):
        products.update(n.op_type for n in body.node if n.op_type.startswith("MatMul"))
    assert products["MatMulInteger"] >= 3 and products["MatMul"] <= 2  # attention's stay float
    int8 = OnnxTranslator(out, int8=True)
    sentences = real_sentences(40)
    source_ids = padded_ids(workdir, sentences)
    reference = search_onnx(onnx_session, source_ids)
    quantized = int8.search(source_ids)
    same = np.array([np.array_equal(a, b) for a, b in zip(quantized["ids"], reference["ids"])])
    # Weights rounded to 1/127 of their range: most searches end the same (29 of 40 for this
    # barely trained model), and the same hypothesis scores nearly the same.
    assert same.mean() >= 0.5
    np.testing.assert_allclose(quantized["scores"][same], reference["scores"][same], atol=0.5)
    assert len(int8.translate(sentences[:3])) == 3


def test_a_missing_int8_model_is_named(out, tmp_path):
    shutil.copytree(out / "onnx", tmp_path / "onnx")
    metadata_file = tmp_path / "onnx" / "model.json"
    metadata = json.loads(metadata_file.read_text())
    metadata_file.write_text(json.dumps({**metadata, "int8_model": None}))
    with pytest.raises(UnusableFileError, match="onnx_int8"):
        OnnxTranslator(tmp_path, int8=True)
    assert OnnxTranslator(tmp_path).translate(["Ein Hund."])


def test_the_saved_models_signatures_are_the_declared_ones(saved_model_dir):
    """`export.signature.SIGNATURES`, which the REST server describes and checks requests by,
    is what the SavedModel has: names, dtypes, ranks and the inputs that have defaults."""
    signature_defs = read_meta_graph(saved_model_dir).signature_def
    assert set(signature_defs) >= set(SIGNATURES)
    for name, declared in SIGNATURES.items():
        signature = signature_defs[name]
        for side in ("inputs", "outputs"):
            tensors = getattr(signature, side)
            assert set(tensors) == set(declared[side]), (name, side)
            for tensor, (dtype, rank) in declared[side].items():
                info = tensors[tensor]
                assert tf.dtypes.as_dtype(info.dtype).name == dtype, (name, tensor)
                assert len(info.tensor_shape.dim) == rank, (name, tensor)
        assert set(signature.inputs) - set(signature.defaults) == set(REQUIRED_INPUTS[name])


def test_client_requests_fit_the_signatures(saved_model_dir, loaded, workdir):
    signatures = read_meta_graph(saved_model_dir).signature_def
    sentences = real_sentences(3)
    source_ids = padded_ids(workdir, sentences)
    requests = [
        client.translate_request(sentences, MODEL_NAME),
        client.beam_search_request(source_ids.tolist(), MODEL_NAME, version=1, beam_size=3),
    ]
    for request in requests:
        signature = signatures[request.model_spec.signature_name]
        assert request.model_spec.name == MODEL_NAME
        assert set(request.inputs) <= set(signature.inputs)
        assert set(signature.inputs) - set(signature.defaults) <= set(request.inputs)
        for name, tensor in request.inputs.items():
            assert tensor.dtype == signature.inputs[name].dtype, name
    assert requests[1].model_spec.version.value == 1

    inputs = {k: tf.make_ndarray(v) for k, v in requests[0].inputs.items()}
    outputs = loaded.signatures["serving_default"](**{k: tf.constant(v) for k, v in inputs.items()})
    assert [t.decode() for t in outputs["translations"].numpy()] == serve(loaded, sentences)[0]
    inputs = {k: tf.constant(tf.make_ndarray(v)) for k, v in requests[1].inputs.items()}
    ids = loaded.beam_search(**inputs)["ids"].numpy()
    np.testing.assert_array_equal(ids, search_saved_model(loaded, source_ids, beam_size=3)["ids"])

    body = json.loads(json.dumps(client.translate_body(sentences)))
    assert body == {"signature_name": "serving_default", "instances": sentences}
    body = json.loads(json.dumps(client.beam_search_body(source_ids.tolist(), n_best=2)))
    assert body["signature_name"] == "beam_search"
    assert set(body["inputs"]) == {"source_ids", "n_best"} <= set(signatures["beam_search"].inputs)
    with pytest.raises(TypeError, match="unknown search option"):
        client.beam_search_request(source_ids, MODEL_NAME, beam=3)


def test_node_example_translates_like_the_python_runtime(out):
    node, example = node_example("node")
    sentences = real_sentences(3) + [""]
    result = subprocess.run(
        [node, "translate.mjs", str(out / "onnx"), *sentences, "--beam-size", "5"],
        cwd=example, capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert result.returncode == 0, result.stderr
    python = run_python(
        "import json, sys\n"
        "from export.runtime import OnnxTranslator\n"
        "translator = OnnxTranslator(sys.argv[1], batch_size=100)\n"
        "print(json.dumps(translator.translate(json.loads(sys.argv[2]))))\n",
        out, json.dumps(sentences),
    )  # fmt: skip
    assert result.stdout.split("\n")[: len(sentences)] == json.loads(python)


@pytest.fixture(scope="module")
def never_ending_export(workdir, tmp_path_factory):
    """The smoke model with </s> and padding pushed out of reach (every hypothesis runs to
    its limit), exported in both formats: (SavedModel loaded, ONNX session, decode config)."""
    config, model, source_tokenizer, target_tokenizer = load_trained(workdir)
    bias = model.decoder.output_projection.bias
    bias.assign(tf.tensor_scatter_nd_update(bias, [[PAD_ID], [EOS_ID]], [-1e4, -1e4]))
    graph = TranslationGraph(
        model, source_tokenizer.model_proto, target_tokenizer.model_proto, config["decode"]
    )
    out = tmp_path_factory.mktemp("never_ending")
    saved_model = export_saved_model(graph, out, MODEL_NAME, 1, log=lambda _: None)
    onnx_dir = export_onnx(graph, workdir, out, 17, int8=False, log=lambda _: None)
    session = onnxruntime.InferenceSession(
        str(onnx_dir / "model.onnx"), providers=["CPUExecutionProvider"]
    )
    return tf.saved_model.load(str(saved_model)), session, config["decode"]


GREEDY, BEAM_5 = {"beam_size": np.int32(1)}, {"beam_size": np.int32(5)}


def both_runtimes(loaded, session):
    """{name: search(source_ids, **options) -> outputs} of a SavedModel and an ONNX model."""
    return {
        "SavedModel": lambda source_ids, **options: search_saved_model(
            loaded, source_ids, **options
        ),
        "ONNX Runtime": lambda source_ids, **options: search_onnx(session, source_ids, **options),
    }


def padded(rows):
    batch = np.zeros((len(rows), max(map(len, rows))), np.int32)
    for i, row in enumerate(rows):
        batch[i, : len(row)] = row
    return batch


def test_exports_cut_each_sentence_at_its_own_limit(never_ending_export):
    loaded, session, decode = never_ending_export
    rng = np.random.default_rng(5)
    rows = [rng.integers(4, 300, size=n).tolist() for n in (1, 2, 4, 6, 30)]
    ratio, offset, cap = (decode[f"max_length_{key}"] for key in ("ratio", "offset", "cap"))
    limits = [min(math.ceil(ratio * len(row)) + offset, cap) for row in rows]
    assert len(set(limits)) == 5 and limits[-1] == cap
    for name, search in both_runtimes(loaded, session).items():
        for options in (GREEDY, BEAM_5 | {"n_best": np.int32(3)}):
            batched = search(padded(rows), **options)
            np.testing.assert_array_equal(
                batched["lengths"],
                np.repeat([limits], batched["lengths"].shape[1], 0).T,
                err_msg=name,
            )
            for i, row in enumerate(rows):
                alone = search(padded([row]), **options)
                np.testing.assert_array_equal(alone["lengths"][0], batched["lengths"][i])
                np.testing.assert_array_equal(alone["ids"][0], batched["ids"][i, :, : limits[i]])
        # An explicit max_length is every sentence's limit, still within the cap.
        for asked, expected in ((7, 7), (10_000, cap)):
            lengths = search(padded(rows), max_length=np.int32(asked))["lengths"]
            assert np.all(lengths == expected), name


def test_exports_translate_a_sentence_the_same_in_any_batch(workdir, loaded, onnx_session):
    """Short sentences batched with the longest, alone, and in a shuffled order: the same
    n-best ids and scores, greedy and beam 5, in the SavedModel and ONNX Runtime."""
    sentences = real_sentences(40)
    sentences = sorted(sentences, key=len)[:8] + [max(sentences, key=len)]
    source_ids = padded_ids(workdir, sentences)
    lengths = (source_ids != 0).sum(1)
    shuffle = np.random.default_rng(1).permutation(len(sentences))
    for name, search in both_runtimes(loaded, onnx_session).items():
        for options in (GREEDY, BEAM_5 | {"n_best": np.int32(5)}):
            batched = search(source_ids, **options)
            shuffled = search(source_ids[shuffle], **options)
            for i, n in enumerate(lengths):
                alone = search(source_ids[i : i + 1, :n], **options)
                at = int(np.flatnonzero(shuffle == i)[0])
                for other, row in ((batched, i), (shuffled, at)):
                    width = alone["ids"].shape[2]
                    np.testing.assert_array_equal(
                        other["ids"][row, :, :width], alone["ids"][0], err_msg=name
                    )
                    assert not other["ids"][row, :, width:].any()
                    np.testing.assert_allclose(
                        other["scores"][row], alone["scores"][0], atol=1e-5, err_msg=name
                    )
                    np.testing.assert_allclose(
                        other["attention"][row, :, :width, :n], alone["attention"][0], atol=1e-5
                    )


@pytest.mark.parametrize(
    "options",
    [{"beam_size": 1}, {"sampling_temperature": 1.0, "seed": 7}, {"beam_size": 5, "n_best": 5}],
    ids=["greedy", "sampling", "beam"],
)
def test_translator_gives_a_sentence_the_same_translation_in_any_batch(workdir, options):
    config, model, source_tokenizer, target_tokenizer = load_trained(workdir)
    search = SearchOptions.from_config(config["decode"], **options)
    sentences = real_sentences(30)
    sentences = sorted(sentences, key=len)[:6] + [max(sentences, key=len)]
    shuffle = np.random.default_rng(2).permutation(len(sentences))

    def translate(batch_size, order):
        translator = Translator(model, source_tokenizer, target_tokenizer, search, batch_size)
        hypotheses = translator.hypotheses([sentences[i] for i in order])
        by_sentence = dict(zip(order, hypotheses))
        return [
            [(h.text, h.score, h.target_tokens) for h in by_sentence[i]]
            for i in range(len(sentences))
        ]

    together = translate(len(sentences), range(len(sentences)))
    assert [len(h) for h in together] == [options.get("n_best", 1)] * len(sentences)
    for other in (translate(1, range(len(sentences))), translate(len(sentences), shuffle.tolist())):
        for mine, theirs in zip(other, together):
            assert [(text, tokens) for text, _, tokens in mine] == [
                (text, tokens) for text, _, tokens in theirs
            ]
            np.testing.assert_allclose(
                [s for _, s, _ in mine], [s for _, s, _ in theirs], atol=1e-5
            )


@pytest.mark.slow
def train_and_export_onnx(workdir, settings):
    """The smoke model trained for one epoch with `settings` (`--set` values) and exported to
    ONNX (float32): its ONNX Runtime session."""
    from pipeline import train

    overrides = [
        "train.epochs=1", "train.bleu_every_epochs=0", "data.test_source=null",
        "data.test_target=null", "export.after_training=true", "export.formats=onnx",
        "export.onnx_int8=false", *settings,
    ]  # fmt: skip
    arguments = ["--config", str(PROJECT_ROOT / "configs" / "smoke.yaml"), "--workdir", workdir]
    train.main([str(a) for a in arguments] + [a for o in overrides for a in ("--set", o)])
    return onnxruntime.InferenceSession(
        str(workdir / "export" / "onnx" / "model.onnx"), providers=["CPUExecutionProvider"]
    )


def assert_onnx_searches_as_keras(workdir, session):
    config, model, _, _ = load_trained(workdir)
    source_ids = padded_ids(workdir, real_sentences(6))
    for options in (GREEDY, BEAM_5):
        onnx_ids = search_onnx(session, source_ids, **options)["ids"][:, 0]
        keras_ids = keras_beam_search(config, model, source_ids, int(options["beam_size"]))[:, 0]
        width = max(onnx_ids.shape[1], keras_ids.shape[1])
        np.testing.assert_array_equal(
            np.pad(onnx_ids, ((0, 0), (0, width - onnx_ids.shape[1]))),
            np.pad(keras_ids, ((0, 0), (0, width - keras_ids.shape[1]))),
        )


def test_a_one_head_attention_model_gives_keras_ids_in_onnx_runtime(tmp_path):
    """tf2onnx once folded the one-head query's transpose into a reshape with the wrong
    batch: beam search failed in ONNX Runtime for batches of more than one sentence."""
    settings = ["model.attention=multi_head", "model.attention_heads=1"]
    assert_onnx_searches_as_keras(tmp_path, train_and_export_onnx(tmp_path, settings))


def test_a_transformer_encoder_exports_without_an_encoder_loop(tmp_path):
    """A recurrent decoder's Transformer encoder (`model.encoder_type: transformer`): its
    ONNX model searches as Keras does, and its only loops are the search's."""
    settings = ["model.encoder_type=transformer", "model.encoder_heads=2",
                "model.encoder_layers=2", "model.encoder_ffn_dim=32"]  # fmt: skip
    session = train_and_export_onnx(tmp_path, settings)
    assert_onnx_searches_as_keras(tmp_path, session)
    graph = onnx.load(str(tmp_path / "export" / "onnx" / "model.onnx")).graph
    loops = [node.name for node in graph.node if node.op_type == "Loop"]
    assert len(loops) == 1 and "encoder" not in loops[0]  # the search's


def test_a_convolutional_encoder_exports_without_an_encoder_loop(tmp_path):
    """A recurrent decoder's convolutional encoder (`model.encoder_type: convolutional`): its
    ONNX model searches as Keras does in float32 and int8, with its only loops the search's
    and its convolutions' weights quantised."""
    settings = ["model.encoder_type=convolutional", "model.encoder_layers=2",
                "export.onnx_int8=true"]  # fmt: skip
    session = train_and_export_onnx(tmp_path, settings)
    assert_onnx_searches_as_keras(tmp_path, session)
    int8 = onnx.load(str(tmp_path / "export" / "onnx" / "model.int8.onnx")).graph
    loops = [node.name for node in int8.node if node.op_type == "Loop"]
    assert len(loops) == 1 and "encoder" not in loops[0]  # the search's
    products = {node.op_type for node in int8.node if "convolution" in node.name}
    assert "MatMulInteger" in products and "MatMul" not in products


def test_every_runtime_starts_each_translation_with_its_prefix(workdir, loaded, onnx_session, out):
    config, model, _, target_tokenizer = load_trained(workdir)
    sentences = real_sentences(5)
    prefixes = ["A man", "", "Two", "The dog is", "a"]
    source_ids = padded_ids(workdir, sentences)
    prefix_ids = target_tokenizer.tokenize(tf.constant(prefixes)).to_tensor(PAD_ID).numpy()
    keras = keras_beam_search(config, model, source_ids, 4, target_prefix=prefix_ids)[:, 0]
    for name, search in both_runtimes(loaded, onnx_session).items():
        exported = search(source_ids, target_prefix=prefix_ids, beam_size=np.int32(4))["ids"]
        np.testing.assert_array_equal(exported[:, 0], keras, err_msg=name)
    for row, prefix in enumerate(prefix_ids):
        prefix = [t for t in prefix.tolist() if t != PAD_ID]
        assert keras[row, : len(prefix)].tolist() == prefix

    # Text in, text out: serving_default, the ONNX runtime and the in-process translator.
    served = loaded.signatures["translate_with_prefix"](
        sentences=tf.constant(sentences), target_prefix=tf.constant(prefixes)
    )["translations"].numpy()
    onnx_texts = OnnxTranslator(out).translate(sentences, target_prefix=prefixes)
    search = SearchOptions.from_config(config["decode"])
    keras_texts = Translator(model, *load_trained(workdir)[2:], search).translate(
        sentences, target_prefix=prefixes
    )
    assert [t.decode() for t in served] == onnx_texts == keras_texts
    for text, prefix in zip(onnx_texts, prefixes, strict=True):
        assert text.startswith(prefix), (text, prefix)
    # Without a prefix, as before.
    assert OnnxTranslator(out).translate(sentences) == serve(loaded, sentences)[0]


def test_a_failing_tf2onnx_pass_is_skipped_as_tf2onnx_does(monkeypatch):
    """The conversion runs tf2onnx's passes in place; if one fails, it converts again with
    the passes on copies, so the failing one is skipped and the model still converts."""
    import tf2onnx.optimizer

    from export.onnx_model import convert_to_onnx

    attempts = []

    class FailingPass:
        graph_been_opt = False

        def optimize(self, graph, iteration):
            attempts.append(os.environ.get(tf2onnx.constants.ENV_TF2ONNX_CATCH_ERRORS))
            raise ValueError("a pass that fails")

    monkeypatch.setitem(tf2onnx.optimizer._optimizers, "failing_pass", FailingPass)
    monkeypatch.delenv(tf2onnx.constants.ENV_TF2ONNX_CATCH_ERRORS, raising=False)
    add_one = tf.function(
        lambda x: x + 1.0, input_signature=[tf.TensorSpec([None], tf.float32, name="x")]
    )
    model = convert_to_onnx(add_one, opset=17)
    session = onnxruntime.InferenceSession(model.SerializeToString())
    np.testing.assert_allclose(session.run(None, {"x": np.array([1.0, 2.0], "float32")})[0], [2, 3])
    assert attempts[0] == "false" and attempts[-1] is None  # in place, then on a copy
    assert tf2onnx.constants.ENV_TF2ONNX_CATCH_ERRORS not in os.environ


def test_the_nodes_kept_are_those_tf2onnx_keeps_in_every_graph_of_a_loop(monkeypatch):
    """`_unused_nodes_found_in_one_walk`: on every call of a conversion with a loop (outputs of
    the outer graph and of the loop's body), one walk from all the outputs finds the nodes
    tf2onnx's walks from each output find; the conversion restores tf2onnx's own after."""
    import tf2onnx
    from tf2onnx.graph import Graph

    from export.onnx_model import _unused_nodes_found_in_one_walk

    tf2onnx_walks = Graph.extract_sub_graph_nodes
    with _unused_nodes_found_in_one_walk():
        one_walk = Graph.extract_sub_graph_nodes
    assert Graph.extract_sub_graph_nodes is tf2onnx_walks
    outputs_per_call = []

    def both(graph, outputs_name, input_checker=None, remove_unused_inputs=True):
        ours = one_walk(graph, outputs_name, input_checker, remove_unused_inputs)
        theirs = tf2onnx_walks(graph, outputs_name, input_checker, remove_unused_inputs)
        assert set(ours) == set(theirs)
        outputs_per_call.append(len(outputs_name))
        return ours

    monkeypatch.setattr(Graph, "extract_sub_graph_nodes", both)

    @tf.function(input_signature=[tf.TensorSpec([None], tf.float32, name="x")])
    def loop(x):
        def body(i, total, peak, trace):
            return i + 1, total + x * 2.0, tf.maximum(peak, total), trace * 0.5 + total

        zeros = tf.zeros_like(x)
        return tf.while_loop(lambda i, *_: i < 3, body, [0, zeros, zeros, zeros])[1:]

    tf2onnx.convert.from_function(loop, input_signature=loop.input_signature, opset=17)
    assert outputs_per_call and max(outputs_per_call) > 3  # the body's outputs, walked together


def test_passes_without_proto_rebuilds_make_the_model_tf2onnxs_own_passes_make(monkeypatch):
    """`_passes_without_proto_rebuilds`: the passes leave the protobufs to the model's making;
    a loop converts to the same nodes, graph by graph, with the same values as with
    tf2onnx's own `optimize`, which the conversion restores after."""
    import collections
    import contextlib

    from tf2onnx.optimizer.optimizer_base import GraphOptimizerBase

    from export import onnx_model

    @tf.function(input_signature=[tf.TensorSpec([None], tf.float32, name="x")])
    def loop(x):
        def body(i, total, trace):
            return (
                i + 1,
                total + tf.reshape(tf.transpose(tf.reshape(x, [1, -1])), [-1]),
                trace * 0.5 + total,
            )

        zeros = tf.zeros_like(x)
        return tf.while_loop(lambda i, *_: i < 3, body, [0, zeros, zeros])[1:]

    def nodes(graph, depth=0, counts=None):
        counts = collections.Counter() if counts is None else counts
        for node in graph.node:
            counts[depth, node.op_type] += 1
            for attribute in node.attribute:
                if attribute.type == onnx.AttributeProto.GRAPH:
                    nodes(attribute.g, depth + 1, counts)
        return counts

    def outputs(model):
        session = onnxruntime.InferenceSession(model.SerializeToString())
        return session.run(None, {"x": np.array([1.0, -2.0, 3.0], "float32")})

    tf2onnx_optimize = GraphOptimizerBase.optimize
    ours = onnx_model.convert_to_onnx(loop, opset=17)
    assert GraphOptimizerBase.optimize is tf2onnx_optimize
    monkeypatch.setattr(onnx_model, "_passes_without_proto_rebuilds", contextlib.nullcontext)
    theirs = onnx_model.convert_to_onnx(loop, opset=17)
    assert nodes(ours.graph) == nodes(theirs.graph) and nodes(ours.graph)[1, "Add"]
    for mine, expected in zip(outputs(ours), outputs(theirs), strict=True):
        np.testing.assert_array_equal(mine, expected)


def test_the_passes_left_out_are_tf2onnxs_and_only_for_the_conversion(monkeypatch):
    """The passes for ops the graphs never hold are skipped by name: a name tf2onnx no longer
    uses would leave them running silently. Other conversions keep every pass."""
    import tf2onnx.optimizer

    from export.onnx_model import PASSES_WITHOUT_WORK, convert_to_onnx

    every_pass = tf2onnx.optimizer._optimizers
    assert set(PASSES_WITHOUT_WORK) < set(every_pass)
    ran = []

    def recorded(name, factory):
        def make():
            ran.append(name)
            return factory()

        return make

    for name, factory in list(every_pass.items()):
        monkeypatch.setitem(every_pass, name, recorded(name, factory))
    add_one = tf.function(
        lambda x: x + 1.0, input_signature=[tf.TensorSpec([None], tf.float32, name="x")]
    )
    convert_to_onnx(add_one, opset=17)
    assert ran and not set(ran) & set(PASSES_WITHOUT_WORK)
    assert tf2onnx.optimizer._optimizers is every_pass


def test_both_translators_offer_the_same_calls_and_results(workdir, out):
    """`Translator` (in process) and `OnnxTranslator` answer `translate` and
    `translate_n_best` with the same parameters and the same (text, score) results; options
    given per call equal the same options given at construction."""
    import inspect

    for method in ("translate", "translate_n_best"):
        parameters = [
            list(inspect.signature(getattr(cls, method)).parameters)
            for cls in (Translator, OnnxTranslator)
        ]
        assert parameters[0] == parameters[1], method
    config, model, source_tokenizer, target_tokenizer = load_trained(workdir)
    sentences = real_sentences(8)
    in_process = Translator(
        model, source_tokenizer, target_tokenizer, SearchOptions.from_config(config["decode"])
    )
    expected = in_process.translate_n_best(sentences, 3)
    runtime = OnnxTranslator(out).translate_n_best(sentences, 3)
    assert [[t for t, _ in h] for h in runtime] == [[t for t, _ in h] for h in expected]
    np.testing.assert_allclose(
        [[s for _, s in h] for h in runtime], [[s for _, s in h] for h in expected], atol=1e-4
    )
    greedy = Translator(
        model, source_tokenizer, target_tokenizer,
        SearchOptions.from_config(config["decode"], beam_size=1),
    )  # fmt: skip
    assert in_process.translate(sentences, beam_size=1) == greedy.translate(sentences)
    with pytest.raises(UserError, match="beam_size must be at least 1"):
        in_process.translate(sentences, beam_size=0)
