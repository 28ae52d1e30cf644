"""`python -m pipeline.score`: the model's log-probability of given translations."""

import numpy as np
import pytest
import tensorflow as tf

from pipeline import score
from pipeline.config import PROJECT_ROOT
from pipeline.data.corpus import read_lines
from pipeline.data.tokenizer import BOS_ID, EOS_ID
from pipeline.decoding.scoring import Scorer
from pipeline.workdir import load_trained

DATA = PROJECT_ROOT / "data" / "multi30k"
SOURCES = read_lines(DATA / "test_2016_flickr.de.gz")[:12]
TARGETS = read_lines(DATA / "test_2016_flickr.en.gz")[:12]


@pytest.fixture
def trained(exported_workdir):  # per test: the autouse seeding drops tf-text's tokenizers
    return load_trained(exported_workdir)


def teacher_forced_log_prob(model, source_tokenizer, target_tokenizer, source, target):
    """The sum of log p(y_t | y_<t, x) over the target and </s>, one pair alone."""
    source_ids = source_tokenizer.tokenize(tf.constant([source])).to_tensor()
    target_ids = target_tokenizer.tokenize(tf.constant([target]))[0].numpy().tolist()
    logits = model({"source_ids": source_ids,
                    "target_input_ids": tf.constant([[BOS_ID, *target_ids]])})  # fmt: skip
    log_probs = tf.nn.log_softmax(tf.cast(logits[0], tf.float32)).numpy()
    labels = [*target_ids, EOS_ID]
    return float(sum(log_probs[t, label] for t, label in enumerate(labels))), len(labels)


def test_scores_are_the_sum_of_the_teacher_forced_log_probabilities(trained):
    _, model, source_tokenizer, target_tokenizer = trained
    results = Scorer(model, source_tokenizer, target_tokenizer, batch_size=5).score(
        SOURCES, TARGETS
    )
    for source, target, result in zip(SOURCES, TARGETS, results, strict=True):
        expected, tokens = teacher_forced_log_prob(
            model, source_tokenizer, target_tokenizer, source, target
        )
        assert result.tokens == tokens
        assert result.log_prob == pytest.approx(expected, abs=1e-3)
        assert result.per_token == pytest.approx(expected / tokens, abs=1e-4)
        assert result.attention.shape[0] == tokens
        np.testing.assert_allclose(result.attention.sum(axis=1), 1.0, atol=1e-4)


def test_a_pairs_score_does_not_depend_on_its_batch(trained):
    _, model, source_tokenizer, target_tokenizer = trained
    scorer = Scorer(model, source_tokenizer, target_tokenizer, batch_size=64)
    together = scorer.score(SOURCES, TARGETS)
    alone = [scorer.score([s], [t])[0] for s, t in zip(SOURCES, TARGETS, strict=True)]
    for a, b in zip(together, alone, strict=True):
        assert a.log_prob == pytest.approx(b.log_prob, abs=1e-4)


def test_the_command_streams_blocks_and_writes_scores_and_alignments(
    exported_workdir, tmp_path, monkeypatch, trained
):
    _, model, source_tokenizer, target_tokenizer = trained
    source, target = tmp_path / "src.de", tmp_path / "tgt.en"
    source.write_text("".join(s + "\n" for s in SOURCES), encoding="utf-8")
    target.write_text("".join(t + "\n" for t in TARGETS), encoding="utf-8")
    monkeypatch.setattr(score, "BLOCK_PAIRS", 5)  # three blocks
    output, alignments = tmp_path / "scores.tsv", tmp_path / "links.txt"
    score.main(["--workdir", str(exported_workdir), "--source", str(source),
                "--target", str(target), "--output", str(output),
                "--alignments", str(alignments)])  # fmt: skip
    lines = output.read_text(encoding="utf-8").splitlines()
    expected = Scorer(model, source_tokenizer, target_tokenizer).score(SOURCES, TARGETS)
    assert len(lines) == len(SOURCES)
    for line, result in zip(lines, expected, strict=True):
        log_prob, per_token, tokens = line.split("\t")
        assert float(log_prob) == pytest.approx(result.log_prob, abs=1e-3)
        assert float(per_token) == pytest.approx(result.per_token, abs=1e-3)
        assert int(tokens) == result.tokens
    links = alignments.read_text(encoding="utf-8").splitlines()
    assert len(links) == len(SOURCES)
    for line, result in zip(links, expected, strict=True):
        pairs = [tuple(map(int, link.split("-"))) for link in line.split()]
        assert [t for _, t in pairs] == list(range(result.tokens - 1))
        assert all(0 <= s < result.attention.shape[1] for s, _ in pairs)


def test_misaligned_files_stop_with_one_line_and_write_nothing(exported_workdir, tmp_path, capsys):
    source, target = tmp_path / "src.de", tmp_path / "tgt.en"
    source.write_text("".join(s + "\n" for s in SOURCES), encoding="utf-8")
    target.write_text("".join(t + "\n" for t in TARGETS[:-2]), encoding="utf-8")
    output = tmp_path / "scores.tsv"
    with pytest.raises(SystemExit) as stop:
        score.main(["--workdir", str(exported_workdir), "--source", str(source),
                    "--target", str(target), "--output", str(output)])  # fmt: skip
    assert stop.value.code == 2
    error = capsys.readouterr().err.strip().splitlines()[-1]  # after the progress bar
    assert error.startswith("error: ")
    assert f"{target} ends after 10 lines but {source} goes on" in error
    assert not list(tmp_path.glob("*scores*"))
