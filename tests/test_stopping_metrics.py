"""Early stopping and the kept best checkpoints by validation loss, BLEU or chrF
(`train.early_stopping_metric`, `train.keep_best`, `pipeline.average --best`)."""

import json
import re

import pytest
import tensorflow as tf

from helpers import SMOKE
from pipeline import average, train
from pipeline.config import STOPPING_METRICS, load_config
from pipeline.core.errors import UserError
from pipeline.model_types.builder import build_model
from pipeline.training.callbacks import EarlyStopping
from pipeline.training.checkpoints import (
    BEST_DIR,
    BEST_INDEX,
    WATCHED_METRICS,
    BestCheckpoints,
    best_checkpoints,
)
from pipeline.training.run_state import EarlyStoppingState

QUICK = ["--set", "data.test_source=null", "--set", "data.test_target=null",
         "--set", "export.after_training=false"]  # fmt: skip


def test_every_configurable_metric_is_watched():
    assert set(WATCHED_METRICS) == set(STOPPING_METRICS)


def run_epochs(metric, epochs):
    """Early stopping (patience 2) over epochs of logs; returns (the epoch it stopped after or
    None, the best epoch, lines logged)."""
    model = build_model(load_config(SMOKE), 40, 40)
    model.stop_training = False  # as Keras' fit sets it
    lines = []
    stopping = EarlyStopping(2, EarlyStoppingState(model), WATCHED_METRICS[metric], lines.append)
    stopping.set_model(model)
    for epoch, logs in enumerate(epochs):
        stopping.on_epoch_end(epoch, dict(logs))
        if model.stop_training:
            return epoch + 1, int(stopping.state.best_epoch.numpy()), lines
    return None, int(stopping.state.best_epoch.numpy()), lines


# The loss keeps falling while BLEU and chrF fall after the second epoch (over-fitting to the
# loss's shape: longer, blander output).
EPOCHS = [
    {"val_loss": 4.0, "val_bleu": 20.0, "val_chrf": 45.0},
    {"val_loss": 3.5, "val_bleu": 24.0, "val_chrf": 49.0},
    {"val_loss": 3.3, "val_bleu": 23.5, "val_chrf": 48.2},
    {"val_loss": 3.2, "val_bleu": 22.0, "val_chrf": 47.0},
    {"val_loss": 3.1, "val_bleu": 21.0, "val_chrf": 46.5},
]


@pytest.mark.parametrize("metric", ["bleu", "chrf"])
def test_stopping_on_a_score_stops_when_it_falls_while_the_loss_falls(metric):
    stopped, best, lines = run_epochs(metric, EPOCHS)
    assert (stopped, best) == (4, 2)
    description = WATCHED_METRICS[metric].description
    best_value = EPOCHS[1][WATCHED_METRICS[metric].log_key]
    assert lines == [f"Early stopping: the {description} has not risen for 2 epochs "
                     f"(best {best_value:.3f}, after epoch 2)"]  # fmt: skip
    assert run_epochs("loss", EPOCHS)[:2] == (None, 5)


def test_the_best_checkpoints_are_kept_best_first_and_the_rest_removed(tmp_path):
    variable = tf.Variable(0.0)
    checkpoint = tf.train.Checkpoint(v=variable)
    best = BestCheckpoints(tmp_path, 2, WATCHED_METRICS["bleu"])
    kept = [best.offer(checkpoint, step, step // 10, value)
            for step, value in ((10, 20.0), (20, 25.0), (30, 22.0), (40, 21.0))]  # fmt: skip
    assert kept == [True, True, True, False]
    assert [(e["checkpoint"], e["value"]) for e in best.entries()] == [
        ("ckpt-20", 25.0), ("ckpt-30", 22.0),
    ]  # fmt: skip
    folder = tmp_path / BEST_DIR
    assert sorted({p.name.split(".")[0] for p in folder.glob("ckpt-*")}) == ["ckpt-20", "ckpt-30"]
    (folder / "ckpt-99.index").write_text("left by an interrupted update")
    assert best.offer(checkpoint, 50, 5, 30.0)
    assert sorted({p.name.split(".")[0] for p in folder.glob("ckpt-*")}) == ["ckpt-20", "ckpt-50"]
    assert [path.rsplit("/", 1)[1] for path, _ in best_checkpoints(tmp_path, 1)] == ["ckpt-50"]
    lowest = BestCheckpoints(tmp_path / "loss", 1, WATCHED_METRICS["loss"])
    assert lowest.offer(checkpoint, 1, 1, 3.0) and lowest.offer(checkpoint, 2, 2, 2.5)
    assert not lowest.offer(checkpoint, 3, 3, 2.7)


def test_a_run_keeps_its_best_checkpoints_by_chrf_and_averages_them(tmp_path, capsys):
    workdir = tmp_path / "run"
    history = train.main(["--config", str(SMOKE), "--workdir", str(workdir), *QUICK,
                          "--set", "train.epochs=3", "--set", "train.early_stopping_metric=chrf",
                          "--set", "train.keep_best=2", "--set", "train.bleu_every_epochs=0",
                          "--set", "train.average_checkpoints=0"])  # fmt: skip
    output = capsys.readouterr().out
    assert len(history["val_chrf"]) == 3 and len(history["val_bleu"]) == 3  # every epoch
    assert len(re.findall(r"Kept among the 2 best: ckpt-\d+ \(validation chrF", output)) >= 2
    entries = json.loads((workdir / "checkpoints" / BEST_DIR / BEST_INDEX).read_text())
    assert len(entries) == 2 and {e["metric"] for e in entries} == {"chrf"}
    assert entries[0]["value"] == max(history["val_chrf"])
    assert entries[0]["value"] >= entries[1]["value"]
    average.main(["--workdir", str(workdir), "--best", "2", "--output", str(tmp_path / "best")])
    printed = capsys.readouterr().out
    assert f"Averaged the best 2 checkpoints ({entries[0]['checkpoint']}: chrf " in printed
    assert (tmp_path / "best" / "model.keras").is_file()


@pytest.mark.parametrize(
    ("overrides", "message"),
    [
        (["train.early_stopping_metric=bleu", "distribute.strategy=multi_worker"],
         "train.early_stopping_metric: bleu needs a single-process strategy"),
        (["train.keep_best=2", "data.valid_source=null", "data.valid_target=null",
          "train.bleu_every_epochs=0"], "train.keep_best needs validation data"),
        (["train.early_stopping_metric=ter"], "train.early_stopping_metric"),
    ],
)  # fmt: skip
def test_settings_that_cannot_work_are_refused(overrides, message):
    with pytest.raises(UserError, match=re.escape(message)):
        load_config(SMOKE, overrides)


def test_average_refuses_best_with_a_step_and_a_run_without_best(tmp_path):
    with pytest.raises(SystemExit):
        average.main(["--workdir", str(tmp_path), "--best", "2", "--up-to-step", "5",
                      "--output", str(tmp_path / "out")])  # fmt: skip
    with pytest.raises(UserError, match="no best checkpoints kept"):
        best_checkpoints(tmp_path, 2)
