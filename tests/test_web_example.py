"""The browser example (examples/web) in headless Chromium: the page translates as the Python
ONNX runtime does, shows the n-best list and the attention heatmap, handles empty and
over-long input, and says in one line when it cannot load a model."""

import contextlib
import json
import re
import shutil
import subprocess

import pytest

import export.__main__ as export_cli
from export.runtime import OnnxTranslator
from helpers import node_example, real_sentences
from pipeline.config import PROJECT_ROOT
from pipeline.decoding.attention_plot import piece_label

EXAMPLE = PROJECT_ROOT / "examples" / "web"
BEAM_SIZE = 3  # not the exported default (5): the page's control must reach the model


@pytest.fixture(scope="module")
def tools():
    return browser_tools()


def browser_tools():
    """(node, chromium), with the example's packages installed; skips the test without."""
    chromium = next(filter(None, map(shutil.which, ("chromium", "chromium-browser"))), None)
    if not chromium:
        pytest.skip("chromium is needed to test the page in a browser")
    node, _ = node_example("web")
    return node, chromium


@contextlib.contextmanager
def serving(node, directory):
    """The address of `serve.mjs` serving the page with the model in `directory`."""
    server = subprocess.Popen(
        [node, "serve.mjs", str(directory), "--port", "0"],
        cwd=EXAMPLE, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )  # fmt: skip
    try:
        address = re.search(r"http://\S+/", server.stdout.readline())
        assert address, server.stderr.read()
        yield address[0]
    finally:
        server.terminate()
        server.wait(timeout=10)


def page_translations(directory, sentences, runs):
    """{key: the translations the page shows for `sentences[i]` of each index, driven with its
    options} of `runs` ({key: (indices, options)}), all on one page serving `directory`: the
    model loaded once, each run's options chosen before its sentences."""
    node, chromium = browser_tools()
    steps = [step for indices, options in runs.values()
             for step in (*options, *(sentences[i] for i in indices))]  # fmt: skip
    with serving(node, directory) as address:
        result = drive(node, chromium, address, steps)
    assert result.returncode == 0, result.stderr
    shown = iter(s["translation"] for s in json.loads(result.stdout))
    return {key: [next(shown) for _ in indices] for key, (indices, _) in runs.items()}


def drive(node, chromium, address, steps):
    """Runs test/drive.mjs: the page's results for the sentences of `steps`, typed one by one,
    each after the options before it."""
    return subprocess.run(
        [node, "test/drive.mjs", address, "--browser", chromium, *steps],
        cwd=EXAMPLE, capture_output=True, text=True, timeout=120,
    )  # fmt: skip


def test_the_page_translates_like_the_python_runtime(tools, exported_workdir, tmp_path):
    node, chromium = tools
    onnx_dir = exported_workdir / "export" / "onnx"
    translator = OnnxTranslator(onnx_dir)
    limit = translator.metadata["max_source_length"]
    over_long = " ".join(real_sentences(40))
    over_long_pieces = len(translator.source.encode(over_long))
    assert over_long_pieces > limit
    sentences = ["", over_long, *real_sentences(3)]
    screenshot = tmp_path / "page.png"
    with serving(node, onnx_dir) as address:
        result = drive(node, chromium, address, ["--beam-size", str(BEAM_SIZE), *sentences,
                                                 "--screenshot", str(screenshot)])  # fmt: skip
    assert result.returncode == 0, result.stderr
    shown = json.loads(result.stdout)

    empty, *translated = shown
    assert empty["translation"] == "" and "Nothing to translate" in empty["details"]
    assert empty["nBest"] == [] and empty["cells"] == 0
    assert f"cut from {over_long_pieces} to {limit} pieces" in shown[1]["details"]
    n_best = translator.translate_n_best(sentences[1:], BEAM_SIZE, beam_size=BEAM_SIZE)
    best = translator.translate(sentences[1:], beam_size=BEAM_SIZE)
    for page, expected, best_text, sentence in zip(translated, n_best, best, sentences[1:]):
        assert page["translation"] == best_text
        assert [h["text"] for h in page["nBest"]] == [text for text, _ in expected]
        assert [h["score"] for h in page["nBest"]] == pytest.approx(
            [score for _, score in expected], abs=1e-4
        )
        # The heatmap: a column per source piece, a row per piece of the best hypothesis
        # (</s> included where it ended), labelled as `translate --plot` labels them.
        source_ids = translator.encode([sentence])[0]
        output = translator.search([source_ids], beam_size=BEAM_SIZE, n_best=BEAM_SIZE)
        target_ids = output["ids"][0, 0, : output["lengths"][0, 0]].tolist()
        source_pieces = translator.source.id_to_piece(source_ids)
        target_pieces = translator.target.id_to_piece(target_ids)
        assert page["columnLabels"] == [piece_label(piece) for piece in source_pieces]
        assert page["rowLabels"] == [piece_label(piece) for piece in target_pieces]
        assert page["cells"] == len(source_ids) * len(target_ids)
    assert shown[-1]["languages"] == "German → English"  # smoke.yaml trains on val.de/val.en
    assert screenshot.read_bytes().startswith(b"\x89PNG")
    size = (onnx_dir / "model.onnx").stat().st_size / 1e6
    name, kind, parameters = (translator.metadata["description"][key]
                              for key in ("name", "type", "parameters"))  # fmt: skip
    assert shown[-1]["status"].startswith(
        f"{name} ({kind}, {parameters / 1e6:.1f}M parameters) · model.onnx, {size:.1f} MB "
        "(opset 17), loaded in "
    )
    assert name == exported_workdir.name


def test_the_page_runs_the_int8_model_when_asked(tools, exported_workdir):
    node, chromium = tools
    onnx_dir = exported_workdir / "export" / "onnx"
    sentences = real_sentences(3)
    with serving(node, onnx_dir) as address:
        result = drive(node, chromium, address + "?weights=int8", sentences)
    assert result.returncode == 0, result.stderr
    shown = json.loads(result.stdout)
    # onnxruntime-web's integer kernels need not round as the native ones do: on the smoke
    # model, undertrained, its int8 translations can part from ONNX Runtime's from the first
    # word, so the page is held to the int8 file it names below, not to native ids.
    translations = [page["translation"] for page in shown]
    assert len(translations) == len(sentences) and all(translations)
    assert all(page["milliseconds"] > 0 for page in shown)  # what benchmarks read
    size = (onnx_dir / "model.int8.onnx").stat().st_size / 1e6
    assert f"· model.int8.onnx, {size:.1f} MB (opset 17)" in shown[-1]["status"]


def test_the_page_says_when_it_cannot_load_the_model(tools, exported_workdir, tmp_path):
    node, chromium = tools
    shutil.copy(exported_workdir / "export" / "onnx" / "model.json", tmp_path)  # and nothing else
    with serving(node, tmp_path) as address:
        result = drive(node, chromium, address, ["Ein Hund."])
    assert result.returncode != 0
    assert "Cannot load the model from /model/: /model/model.onnx: 404 Not Found" in result.stderr


def test_the_page_names_a_damaged_file_of_the_export(tools, exported_workdir, tmp_path):
    node, chromium = tools
    shutil.copytree(exported_workdir / "export" / "onnx", tmp_path, dirs_exist_ok=True)
    (tmp_path / "model.json").write_text('{"model": "model.onnx",')  # cut short
    with serving(node, tmp_path) as address:
        result = drive(node, chromium, address, ["Ein Hund."])
    assert result.returncode != 0
    assert (
        "Cannot load the model from /model/: /model/model.json: cannot load the export's "
        "description (" in result.stderr
    ), result.stderr


def test_the_server_refuses_a_directory_without_a_model(tools, tmp_path):
    node, _ = tools
    result = subprocess.run(
        [node, "serve.mjs", str(tmp_path)], cwd=EXAMPLE, capture_output=True, text=True, timeout=30
    )
    assert (result.returncode, result.stderr) == (
        2, f"serve.mjs: {tmp_path}: no exported ONNX model (model.json not found)\n"
    )  # fmt: skip


def test_the_page_runs_a_greedy_export(tools, exported_workdir, tmp_path):
    node, chromium = tools
    export_cli.main(["--workdir", str(exported_workdir), "--formats", "onnx",
                     "--onnx-search", "greedy", "--output", str(tmp_path)])  # fmt: skip
    onnx_dir = tmp_path / "onnx"
    sentences = real_sentences(3)
    with serving(node, onnx_dir) as address:
        result = drive(node, chromium, address, sentences)
    assert result.returncode == 0, result.stderr
    shown = json.loads(result.stdout)
    expected = OnnxTranslator(onnx_dir).translate(sentences)
    assert [page["translation"] for page in shown] == expected
    assert [len(page["nBest"]) for page in shown] == [1, 1, 1]
