"""translate and evaluate on the smoke model: outputs, options, plots, and errors."""

import json
import subprocess
import sys

import pytest
from PIL import Image

from pipeline import evaluate, train, translate
from pipeline.config import PROJECT_ROOT

SENTENCES = ["Ein Mann fährt Fahrrad.", "Zwei Hunde spielen im Schnee.", "Eine Frau liest."]


@pytest.fixture(scope="module")
def workdir(tmp_path_factory):
    workdir = tmp_path_factory.mktemp("smoke")
    train.main(
        ["--config", str(PROJECT_ROOT / "configs" / "smoke.yaml"), "--workdir", str(workdir),
         "--set", "data.test_source=null", "--set", "data.test_target=null",
         "--set", "train.bleu_every_epochs=0"]
    )  # fmt: skip
    return workdir


@pytest.fixture
def input_file(tmp_path):
    path = tmp_path / "input.de"
    path.write_text("".join(s + "\n" for s in SENTENCES), encoding="utf-8")
    return path


def run_translate(capsys, *args):
    translate.main([*map(str, args)])
    return capsys.readouterr().out.splitlines()


def test_one_translation_per_line(workdir, input_file, capsys):
    lines = run_translate(capsys, "--workdir", workdir, "--input", input_file)
    assert len(lines) == len(SENTENCES)


def test_n_best_scores_and_alignments(workdir, input_file, tmp_path, capsys):
    alignments = tmp_path / "align.txt"
    lines = run_translate(
        capsys, "--workdir", workdir, "--input", input_file, "--beam-size", 4, "--n-best", 3,
        "--alignments", alignments,
    )  # fmt: skip
    rows = [line.split("\t") for line in lines]
    assert [(int(r[0]), int(r[1])) for r in rows] == [(i, n) for i in range(3) for n in range(3)]
    for i in range(3):
        scores = [float(r[2]) for r in rows if int(r[0]) == i]
        assert scores == sorted(scores, reverse=True)
    links = alignments.read_text(encoding="utf-8").splitlines()
    assert len(links) == 9
    assert all(pair.count("-") == 1 for line in links for pair in line.split())


def test_greedy_and_beam_one_agree_and_sampling_is_seeded(workdir, input_file, capsys):
    greedy = run_translate(capsys, "--workdir", workdir, "--input", input_file, "--beam-size", 1)
    scored = run_translate(
        capsys, "--workdir", workdir, "--input", input_file, "--beam-size", 1, "--scores"
    )
    assert [line.split("\t", 1)[1] for line in scored] == greedy
    sample = ["--workdir", workdir, "--input", input_file, "--sampling-temperature", 2.0,
              "--sampling-topk", 10, "--seed", 5]  # fmt: skip
    assert run_translate(capsys, *sample) == run_translate(capsys, *sample)


def test_plot_writes_a_png_per_sentence(workdir, input_file, tmp_path, capsys):
    plots = tmp_path / "plots"
    run_translate(capsys, "--workdir", workdir, "--input", input_file, "--plot", plots)
    images = sorted(plots.glob("*.png"))
    assert [p.name for p in images] == ["1.png", "2.png", "3.png"]
    with Image.open(images[0]) as image:
        assert image.size[0] > 300 and image.size[1] > 200


def test_stdin_and_invalid_utf8(workdir, tmp_path, capsys):
    command = [sys.executable, "-m", "pipeline.translate", "--workdir", str(workdir)]
    result = subprocess.run(command, input=b"Ein Hund.\n", capture_output=True, cwd=PROJECT_ROOT)
    assert result.returncode == 0 and len(result.stdout.decode().splitlines()) == 1
    bad = tmp_path / "bad.de"
    bad.write_bytes(b"Ein Hund.\nkaputt \xff\n")
    with pytest.raises(SystemExit) as exit_info:
        translate.main(["--workdir", str(workdir), "--input", str(bad)])
    assert exit_info.value.code == 2
    assert f"{bad}:2: not valid UTF-8" in capsys.readouterr().err
    translate.main(["--workdir", str(workdir), "--input", str(bad), "--errors", "replace"])
    assert len(capsys.readouterr().out.splitlines()) == 2


def test_bad_options_and_missing_model(tmp_path, input_file, capsys):
    with pytest.raises(SystemExit) as exit_info:
        translate.main(["--workdir", str(tmp_path), "--input", str(input_file)])
    assert exit_info.value.code == 2
    assert "no trained model here" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        translate.main(["--workdir", str(tmp_path), "--beam-size", "2", "--n-best", "3"])
    assert "--n-best (3) cannot exceed --beam-size (2)" in capsys.readouterr().err


def test_evaluate_reports_bleu_chrf_ter_and_perplexity(workdir, capsys):
    evaluate.main(["--workdir", str(workdir), "--split", "valid", "--beam-size", "2"])
    report = json.loads((workdir / "eval_valid.json").read_text(encoding="utf-8"))
    assert report["sentences"] == 1000
    assert {
        "bleu",
        "bleu_lowercase",
        "chrf",
        "ter",
        "perplexity",
        "bleu_signature",
        "ter_signature",
    } <= set(report)
    assert report["perplexity"] > 1.0 and report["search"]["beam_size"] == 2
    assert json.loads(capsys.readouterr().out) == report


def test_evaluate_on_a_tsv_file(workdir, tmp_path, capsys):
    tsv = tmp_path / "pairs.tsv"
    tsv.write_text("Ein Hund.\tA dog.\nEine Katze.\tA cat.\n", encoding="utf-8")
    evaluate.main(["--workdir", str(workdir), "--split", str(tsv)])
    assert (
        json.loads((workdir / "eval_pairs.tsv.json").read_text(encoding="utf-8"))["sentences"] == 2
    )


def test_ter_counts_edits_per_reference_word():
    from pipeline.decoding.evaluation import score_translations

    assert score_translations(["a dog runs ."], ["a dog runs ."])["ter"] == 0.0
    # One substitution and one deletion against 8 reference words (sacreBLEU's tokenisation).
    scores = score_translations(["a cat runs .", "two men sit"], ["a dog runs .", "two men sit ."])
    assert scores["ter"] == 25.0 and scores["ter_signature"].startswith("nrefs:1|case:lc")
