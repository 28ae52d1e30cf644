"""`python -m pipeline.train` on the smoke config: trains, checkpoints, resumes, evaluates."""

import json
import re

import pytest
import yaml

from pipeline import train
from pipeline.config import PROJECT_ROOT

SMOKE = str(PROJECT_ROOT / "configs" / "smoke.yaml")


@pytest.fixture(scope="module")
def trained(tmp_path_factory):
    workdir = tmp_path_factory.mktemp("smoke")
    history = train.main(["--config", SMOKE, "--workdir", str(workdir)])
    return workdir, history


def checkpoint_steps(workdir):
    return sorted(int(p.name[5:-6]) for p in (workdir / "checkpoints").glob("ckpt-*.index"))


def test_training_lowers_the_loss(trained):
    _, history = trained
    assert len(history["loss"]) == 2
    assert history["loss"][-1] < history["loss"][0]
    assert history["val_loss"][-1] < history["val_loss"][0]
    assert all(k in history for k in ("perplexity", "token_accuracy", "tgt_tok/s", "val_bleu"))


def test_work_directory_holds_everything(trained):
    workdir, _ = trained
    config = yaml.safe_load((workdir / "config.yaml").read_text(encoding="utf-8"))
    assert config["train"]["epochs"] == 2 and config["model"]["attention"] == "bahdanau"
    for name in ("vocab/source.model", "vocab/source.vocab", "vocab/target.model", "model.keras"):
        assert (workdir / name).is_file(), name
    assert list((workdir / "logs").rglob("events.out.tfevents.*"))
    report = json.loads((workdir / "test_report.json").read_text(encoding="utf-8"))
    assert report["sentences"] == 1000 and "nrefs:1" in report["bleu_signature"]
    translations = (workdir / "test_translations.txt").read_text(encoding="utf-8").splitlines()
    assert len(translations) == 1000


def test_checkpoints_every_n_steps_and_keeps_k(trained):
    workdir, _ = trained
    # 8 steps, every 3 steps and at each epoch end (4, 8): saved 3, 4, 6, 8; the last 2 kept.
    assert checkpoint_steps(workdir) == [6, 8]


def test_rerun_resumes_where_it_stopped(trained, capsys):
    workdir, _ = trained
    history = train.main(["--config", SMOKE, "--workdir", str(workdir), "--set", "train.epochs=3"])
    output = capsys.readouterr().out
    assert "Resuming from" in output and "(step 8, 2 epochs done)" in output
    assert re.search(
        r"Training stream: \S+val.de.gz \+ \S+ continues at line [\d,]+ of pass", output
    )
    assert "1,014 lines in 1 file(s)" in output and "First training step after" in output
    stream = r"train stream: \S+ \+ \S+: read [\d,]+ pairs \([\d.]+ passes\), kept"
    assert len(re.findall(stream, output)) == 1  # once, at the end
    assert len(history["loss"]) == 1  # only the third epoch ran
    assert checkpoint_steps(workdir)[-1] == 12  # the step count continued


def test_a_work_directory_of_another_model_is_refused(trained, capsys):
    workdir, _ = trained
    with pytest.raises(SystemExit) as exit_info:
        train.main(["--config", SMOKE, "--workdir", str(workdir), "--set", "model.cell_type=lstm"])
    assert exit_info.value.code == 2
    assert "model.cell_type differ" in capsys.readouterr().err
