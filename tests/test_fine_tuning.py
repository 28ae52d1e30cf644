"""`python -m pipeline.train --init-from DIR`: fine-tuning a trained model."""

import hashlib

import numpy as np
import pytest

from pipeline import train
from pipeline.config import PROJECT_ROOT
from pipeline.workdir import load_trained

SMOKE = str(PROJECT_ROOT / "configs" / "smoke.yaml")


def fingerprint(directory):
    """Every file under `directory` with its content's hash and its modification time."""
    return {
        str(path.relative_to(directory)): (
            hashlib.sha256(path.read_bytes()).hexdigest(),
            path.stat().st_mtime_ns,
        )  # fmt: skip
        for path in sorted(directory.rglob("*"))
        if path.is_file()
    }


def train_briefly(workdir, *arguments):
    return train.main(["--config", SMOKE, "--workdir", str(workdir), "--set", "train.epochs=1",
                       "--set", "train.bleu_every_epochs=0", "--set", "data.test_source=null",
                       "--set", "data.test_target=null", *arguments])  # fmt: skip


def fine_tune(init_from, workdir, *overrides):
    return train_briefly(workdir, "--init-from", str(init_from), *overrides)


def test_fine_tuning_starts_from_the_trained_weights_and_leaves_them_untouched(
    exported_workdir, tmp_path, capsys
):
    before = fingerprint(exported_workdir)
    # A learning rate of 0: the fine-tuned weights must be the trained ones, exactly.
    fine_tune(exported_workdir, tmp_path, "--set", "train.learning_rate=0.0",
              "--set", "model.dropout=0.3")  # fmt: skip
    assert "Initialised from" in capsys.readouterr().out
    _, trained, _, _ = load_trained(exported_workdir)
    _, tuned, _, _ = load_trained(tmp_path)
    for a, b in zip(trained.get_weights(), tuned.get_weights(), strict=True):
        np.testing.assert_array_equal(a, b)
    for side in ("source", "target"):
        assert (tmp_path / "vocab" / f"{side}.model").read_bytes() == (
            exported_workdir / "vocab" / f"{side}.model"
        ).read_bytes()
    assert fingerprint(exported_workdir) == before

    # The same command again resumes from the fine-tuning's own checkpoint.
    fine_tune(exported_workdir, tmp_path, "--set", "train.learning_rate=0.0",
              "--set", "model.dropout=0.3", "--set", "train.epochs=2")  # fmt: skip
    output = capsys.readouterr().out
    assert "Resuming from" in output and "Initialised from" not in output


def test_fine_tuning_trains_from_the_trained_model(exported_workdir, tmp_path):
    history = fine_tune(exported_workdir, tmp_path)
    scratch = train_briefly(tmp_path / "scratch")
    assert history["loss"][0] < scratch["loss"][0]  # it starts where the trained model was


@pytest.mark.parametrize(
    ("override", "named"),
    [("model.decoder_units=32", "model.decoder_units is 32 here but 16"),
     ("model.attention=luong_general", "model.attention is 'luong_general' here")],
)  # fmt: skip
def test_a_model_that_does_not_fit_is_refused_with_the_setting_named(
    exported_workdir, tmp_path, capsys, override, named
):
    with pytest.raises(SystemExit) as stop:
        fine_tune(exported_workdir, tmp_path / "new", "--set", override)
    assert stop.value.code == 2
    assert named in capsys.readouterr().err
    assert not (tmp_path / "new").exists()


def test_another_vocabulary_is_refused(exported_workdir, tmp_path, capsys):
    other = exported_workdir / "vocab" / "source.model"  # a vocabulary, but not the target's
    with pytest.raises(SystemExit):
        fine_tune(exported_workdir, tmp_path / "new", "--set", f"data.target_vocabulary={other}")
    assert "is not the vocabulary the model was trained with" in capsys.readouterr().err
