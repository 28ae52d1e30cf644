"""`python -m pipeline.train` on the smoke config: trains, checkpoints, resumes, evaluates."""

import json
import math
import os
import re
import subprocess
import sys
from collections import Counter

import keras
import numpy as np
import pytest
import tensorflow as tf
import yaml

from pipeline import train
from pipeline.config import PROJECT_ROOT, load_config
from pipeline.core.errors import UnusableFileError
from pipeline.training import callbacks as training_callbacks
from pipeline.training import trainer
from pipeline.training.callbacks import EarlyStopping
from pipeline.training.checkpoints import WATCHED_METRICS
from pipeline.training.optimizers import make_optimizer
from pipeline.training.run_state import (
    EARLY_STOPPING,
    EPOCH_STEPS,
    EPOCHS,
    STREAM,
    TIME_BUDGET,
    TRAINING_TIME,
    EarlyStoppingState,
    RunState,
    restore_run,
    training_checkpoint,
)
from pipeline.training.trainer import PROFILE_AFTER

SMOKE = str(PROJECT_ROOT / "configs" / "smoke.yaml")
# TensorFlow's native log lines (`I0000 00:00:...`) and the notice before them.
NATIVE_LOG_LINE = re.compile(r"^([IWE]\d{4} \d|WARNING: All log messages before absl)")


@pytest.fixture(scope="module")
def trained(tmp_path_factory):
    workdir = tmp_path_factory.mktemp("smoke")
    history = train.main(["--config", SMOKE, "--workdir", str(workdir)])
    return workdir, history


def holds_entry(checkpoint, name):
    keys = tf.train.load_checkpoint(checkpoint).get_variable_to_shape_map()
    return any(key.startswith(f"{name}/") for key in keys)


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
    # With no epoch length set, a resumed run keeps the one it began with (not a new estimate).
    history = train.main(["--config", SMOKE, "--workdir", str(workdir), "--set", "train.epochs=3",
                          "--set", "train.steps_per_epoch=null",
                          "--set", "train.cooldown_epochs=1"])  # fmt: skip
    output = capsys.readouterr().out
    assert "Resuming from" in output and "(step 8, 2 epochs done)" in output
    assert "Epochs of 4 steps (as the run began)" in output
    # The cool-down is counted in the kept epoch length, to the end of the (longer) run.
    assert "cools down linearly to 0 over steps 9-12 (train.cooldown_epochs: 1)" in output
    assert re.search(
        r"Training stream: \S+val.de.gz \+ \S+ continues at line [\d,]+ of pass", output
    )
    assert "1,014 lines in 1 file(s)" in output and "First training step after" in output
    stream = r"train stream: \S+ \+ \S+: read [\d,]+ pairs \([\d.]+ passes\), kept"
    assert len(re.findall(stream, output)) == 1  # once, at the end
    assert len(history["loss"]) == 1  # only the third epoch ran
    assert checkpoint_steps(workdir)[-1] == 12  # the step count continued


# Each checkpoint format's entries beside the model and optimizer, oldest first; "budget"
# stands for the time budget's entry as it was then: its decision and the training time.
FORMATS = {
    "first": (EPOCHS, STREAM),
    "epoch length": (EPOCHS, STREAM, EPOCH_STEPS),
    "time budget": (EPOCHS, STREAM, EPOCH_STEPS, "budget"),
    "early stopping": (EPOCHS, STREAM, EPOCH_STEPS, "budget", EARLY_STOPPING),
    "training time": (EPOCHS, STREAM, EPOCH_STEPS, TRAINING_TIME, EARLY_STOPPING),
    "current": (EPOCHS, STREAM, EPOCH_STEPS, TRAINING_TIME, TIME_BUDGET, EARLY_STOPPING),
}


def written_as(form, model, optimizer, state):
    """The checkpoint of `state` as the format `form` of `FORMATS` wrote it."""
    entries = state.entries()
    entries["budget"] = tf.train.Checkpoint(
        last_epoch=state.last_epoch, seconds=state.training_seconds
    )
    return tf.train.Checkpoint(model=model, optimizer=optimizer, **{
        TIME_BUDGET if name == "budget" else name: entries[name] for name in FORMATS[form]
    })  # fmt: skip


@pytest.mark.parametrize("form", FORMATS)
def test_a_checkpoint_of_every_format_restores_what_it_holds(tmp_path, form):
    """Each format's entries come back; those it lacks keep their initial values, and
    `restore_run` names them."""
    model = keras.Sequential([keras.Input((2,)), keras.layers.Dense(1)])
    optimizer = make_optimizer(load_config(SMOKE)["train"])
    optimizer.build(model.trainable_variables)
    saved = RunState(2, model)
    values = {"completed_epochs": 3, "epoch_steps": 7, "training_seconds": 12.5, "last_epoch": 4}
    for name, value in values.items():
        getattr(saved, name).assign(value)
    for position, value in zip(saved.positions, (11, 13), strict=True):
        position.assign(value)
    saved.early_stopping.best_epoch.assign(2)
    path = written_as(form, model, optimizer, saved).save(str(tmp_path / "ckpt"))

    restored = RunState(2, model)
    lacked = restore_run(path, model, optimizer, restored)
    held = set(FORMATS[form])
    if "budget" in held:
        held |= {TRAINING_TIME, TIME_BUDGET}
    assert lacked == set(restored.entries()) - held
    expected = {
        "completed_epochs": 3,
        "epoch_steps": 7 if EPOCH_STEPS in held else 0,
        "training_seconds": 12.5 if TRAINING_TIME in held else 0.0,
        "last_epoch": 4 if TIME_BUDGET in held else 0,
    }
    assert {name: getattr(restored, name).numpy() for name in values} == expected
    assert [int(p.numpy()) for p in restored.positions] == [11, 13]
    assert int(restored.early_stopping.best_epoch.numpy()) == (2 if EARLY_STOPPING in held else 0)


def test_a_damaged_checkpoint_is_named_and_changes_nothing(tmp_path):
    model = keras.Sequential([keras.Input((2,)), keras.layers.Dense(1)])
    optimizer = make_optimizer(load_config(SMOKE)["train"])
    optimizer.build(model.trainable_variables)
    path = training_checkpoint(model, optimizer, RunState(1)).save(str(tmp_path / "ckpt"))
    data = next(tmp_path.glob("ckpt-1.data-*"))
    data.write_bytes(data.read_bytes()[:10])
    state = RunState(1)
    with pytest.raises(UnusableFileError, match="cannot restore this checkpoint"):
        restore_run(path, model, optimizer, state)
    assert int(state.completed_epochs.numpy()) == 0


def test_a_run_of_the_first_checkpoint_format_resumes_without_a_budget(
    tmp_path, monkeypatch, capsys
):
    """Its checkpoints hold no epoch length (estimated again) and no training time (counted
    from the resume), so a time budget, which could not count the time so far, is refused."""
    quick = ["--config", SMOKE, "--workdir", str(tmp_path), "--set", "train.steps_per_epoch=2",
             "--set", "train.bleu_every_epochs=0", "--set", "data.test_source=null",
             "--set", "data.test_target=null"]  # fmt: skip
    with monkeypatch.context() as patch:  # the checkpoints as written then
        patch.setattr(trainer, "training_checkpoint",
                      lambda *args: written_as("first", *args))  # fmt: skip
        train.main([*quick, "--set", "train.epochs=1"])
    latest = tf.train.latest_checkpoint(str(tmp_path / "checkpoints"))
    assert not holds_entry(latest, EPOCH_STEPS) and not holds_entry(latest, TRAINING_TIME)
    capsys.readouterr()
    with pytest.raises(SystemExit):
        train.main([*quick, "--set", "train.epochs=2", "--set", "train.time_budget_hours=1"])
    assert "do not hold the run's training time" in capsys.readouterr().err
    assert tf.train.latest_checkpoint(str(tmp_path / "checkpoints")) == latest
    history = train.main([*quick, "--set", "train.epochs=2"])
    out = capsys.readouterr().out
    assert "(step 2, 1 epochs done)" in out and "holds no training time" in out
    assert len(history["loss"]) == 1
    assert holds_entry(tf.train.latest_checkpoint(str(tmp_path / "checkpoints")), TRAINING_TIME)


@pytest.mark.parametrize(
    "subword_model, how",
    [("unigram", "(alpha 0.1, n-best 64)"), ("bpe", "(BPE-dropout, merges dropped at rate 0.1)")],
)
def test_training_with_subword_sampling(tmp_path, capsys, subword_model, how):
    history = train.main(["--config", SMOKE, "--workdir", str(tmp_path), "--set", "train.epochs=1",
                          "--set", "train.bleu_every_epochs=0", "--set", "data.test_source=null",
                          "--set", "data.test_target=null",
                          "--set", f"data.subword_model={subword_model}",
                          "--set", "data.subword_sampling_alpha=0.1"])  # fmt: skip
    out = capsys.readouterr().out
    assert f"training pairs segmented at random {how}" in out
    assert all(math.isfinite(loss) for loss in history["loss"])


def test_early_stopping_counts_on_across_a_resume_and_restores_the_best_epoch(tmp_path):
    """Validation losses 3.0, 2.0 | resume | 2.5, 2.4 with patience 2: the resumed run stops
    after epoch 4 (a count begun afresh would take 2.4 as a fall) with epoch 2's weights."""
    model = keras.Sequential([keras.Input((2,)), keras.layers.Dense(1)])
    kernel = model.layers[0].kernel
    logged = []

    def run(state, losses, first_epoch):
        stopping = EarlyStopping(2, state, WATCHED_METRICS["loss"], logged.append)
        stopping.set_model(model)
        model.stop_training = False
        for epoch, loss in enumerate(losses, first_epoch):
            kernel.assign(tf.fill(kernel.shape, float(epoch + 1)))  # marks the epoch
            stopping.on_epoch_end(epoch, {"val_loss": loss})
        return stopping

    state = EarlyStoppingState(model)
    run(state, [3.0, 2.0], 0)
    saved = tf.train.Checkpoint(state=state).save(str(tmp_path / "ckpt"))
    resumed = EarlyStoppingState(model)
    tf.train.Checkpoint(state=resumed).restore(saved).assert_consumed()
    run(resumed, [2.5, 2.4], 2)
    assert model.stop_training
    assert logged == ["Early stopping: the validation loss has not fallen for 2 epochs "
                      "(best 2.000, after epoch 2)"]  # fmt: skip
    assert resumed.restore_best(model) == 2
    assert kernel.numpy().tolist() == [[2.0], [2.0]]


def test_a_resumed_run_stops_early_on_the_checkpointed_state(tmp_path, capsys, monkeypatch):
    """Validation losses set to 2.0 in epoch 1, 3.0 after, patience 1: the run resumed after
    epoch 1 stops after epoch 2 and saves epoch 1's weights; a count begun afresh at the
    resume would take epoch 2 as its best and train on."""
    losses = [2.0, 3.0, 3.0]
    judge = training_callbacks.EarlyStopping.on_epoch_end
    monkeypatch.setattr(
        training_callbacks.EarlyStopping, "on_epoch_end",
        lambda self, epoch, logs=None: judge(self, epoch, {**logs, "val_loss": losses[epoch]}),
    )  # fmt: skip
    command = ["--config", SMOKE, "--workdir", str(tmp_path), "--set", "train.epochs=1",
               "--set", "train.early_stopping_patience=1", "--set", "train.bleu_every_epochs=0",
               "--set", "data.test_source=null", "--set", "data.test_target=null"]  # fmt: skip
    train.main(command)
    assert holds_entry(tf.train.latest_checkpoint(str(tmp_path / "checkpoints")), EARLY_STOPPING)
    command[command.index("train.epochs=1")] = "train.epochs=3"
    capsys.readouterr()
    history = train.main(command)
    out = capsys.readouterr().out
    assert "(step 4, 1 epochs done)" in out and len(history["loss"]) == 1
    assert "the validation loss has not fallen for 1 epochs (best 2.000, after epoch 1)" in out
    assert "Weights: the best epoch's, epoch 1 (best validation loss, 2.000)" in out


def test_the_test_report_counts_the_training_time_of_every_command(tmp_path, capsys, monkeypatch):
    """The checkpoints keep the training time: after a resume, test_report.json holds the
    first command's time plus the second's. The callbacks' clock advances 1 s a reading, so
    the sums are exact."""
    readings = iter(range(10**6))
    monkeypatch.setattr(
        training_callbacks, "time", type("Clock", (), {"perf_counter": lambda: next(readings)})
    )
    command = ["--config", SMOKE, "--workdir", str(tmp_path), "--set", "train.epochs=1",
               "--set", "train.bleu_every_epochs=0"]  # fmt: skip

    def reported():
        return json.loads((tmp_path / "test_report.json").read_text())["training_seconds"]

    train.main(command)
    first = reported()
    assert first > 0
    assert holds_entry(tf.train.latest_checkpoint(str(tmp_path / "checkpoints")), TRAINING_TIME)
    command[command.index("train.epochs=1")] = "train.epochs=2"
    capsys.readouterr()
    train.main(command)
    second = int(
        re.search(r"Trained for \d+ s \((\d+) s in this command\)", capsys.readouterr().out)[1]
    )
    assert second > 0 and reported() == first + second


def test_the_same_command_after_the_end_scores_the_saved_model(tmp_path):
    """With nothing left to train, the test split is translated with the saved model (here
    the mean of the last 2 checkpoints), not the last checkpoint: the report and the
    translations stay as they were."""
    command = ["--config", SMOKE, "--workdir", str(tmp_path), "--set", "train.epochs=1",
               "--set", "train.average_checkpoints=2",
               "--set", "train.bleu_every_epochs=0"]  # fmt: skip
    outputs = [tmp_path / "test_report.json", tmp_path / "test_translations.txt"]
    train.main(command)
    first = [path.read_text() for path in outputs]
    assert train.main(command) == {}
    assert [path.read_text() for path in outputs] == first


def test_a_time_budget_begins_the_cooldown_early_and_the_run_keeps_its_end(tmp_path, capsys):
    """A budget shorter than an epoch: after epoch 1 the one-epoch cool-down begins and
    training stops after epoch 2 of 5; the same command again keeps that end."""
    command = ["--config", SMOKE, "--workdir", str(tmp_path), "--set", "train.epochs=5",
               "--set", "train.cooldown_epochs=1", "--set", "train.time_budget_hours=0.000001",
               "--set", "train.bleu_every_epochs=0", "--set", "data.test_source=null",
               "--set", "data.test_target=null"]  # fmt: skip
    history = train.main(command)
    out = capsys.readouterr().out
    assert "Learning rate cools down linearly to 0 over steps 17-20" in out  # as configured
    assert "the run and its cool-down end sooner if the rest would not fit" in out
    assert "the learning rate cools down to 0 over steps 5-8 (epoch 2), then training stops" in out
    assert len(history["loss"]) == 2
    checkpoint = tf.train.latest_checkpoint(str(tmp_path / "checkpoints"))
    assert checkpoint.endswith("ckpt-8") and holds_entry(checkpoint, TIME_BUDGET)
    assert train.main(command) == {}
    out = capsys.readouterr().out
    assert "Learning rate cools down linearly to 0 over steps 5-8" in out
    assert "the run ends after epoch 2" in out


def test_without_a_cooldown_a_time_budget_stops_at_an_epoch_end(tmp_path, capsys):
    command = ["--config", SMOKE, "--workdir", str(tmp_path), "--set", "train.epochs=3",
               "--set", "train.time_budget_hours=0.000001", "--set", "train.bleu_every_epochs=0",
               "--set", "data.test_source=null", "--set", "data.test_target=null"]  # fmt: skip
    assert len(train.main(command)["loss"]) == 1
    # The hours used are the epoch's, however slow the machine.
    assert re.search(r"Time budget: \d+\.\d\d of 1e-06 h used, \d+ s an epoch: training "
                     r"stops here", capsys.readouterr().out)  # fmt: skip


def test_a_budget_added_to_a_run_begun_without_one_counts_its_time_so_far(tmp_path, capsys):
    command = ["--config", SMOKE, "--workdir", str(tmp_path), "--set", "train.epochs=1",
               "--set", "train.bleu_every_epochs=0", "--set", "data.test_source=null",
               "--set", "data.test_target=null"]  # fmt: skip
    train.main(command)
    capsys.readouterr()
    budget = ["--set", "train.epochs=3", "--set", "train.time_budget_hours=0.000001"]
    assert len(train.main([*command, *budget])["loss"]) == 1  # the budget was spent already
    out = capsys.readouterr().out
    assert "Time budget: 1e-06 h of training" in out and "training stops here" in out


def test_a_work_directory_of_another_model_is_refused(trained, capsys):
    workdir, _ = trained
    with pytest.raises(SystemExit) as exit_info:
        train.main(["--config", SMOKE, "--workdir", str(workdir), "--set", "model.cell_type=lstm"])
    assert exit_info.value.code == 2
    assert "model.cell_type differ" in capsys.readouterr().err


def test_profile_steps_write_a_trace_for_tensorboard(trained, tmp_path):
    vocab = trained[0] / "vocab"
    settings = [
        "train.epochs=1", f"train.steps_per_epoch={PROFILE_AFTER + 1}", "train.profile_steps=1",
        f"data.source_vocabulary={vocab / 'source.model'}",
        f"data.target_vocabulary={vocab / 'target.model'}",
        "data.valid_source=null", "data.valid_target=null", "train.bleu_every_epochs=0",
        "data.test_source=null", "data.test_target=null",
    ]  # fmt: skip
    arguments = [argument for setting in settings for argument in ("--set", setting)]
    train.main(["--config", SMOKE, "--workdir", str(tmp_path)] + arguments)
    assert list((tmp_path / "logs" / "train" / "plugins" / "profile").glob("*/*.xplane.pb"))


def summary_tags(log_dir, plugin):
    """{tag: number of events} of the summaries of one TensorBoard plugin under `log_dir`."""
    counts = Counter()
    for path in log_dir.glob("events.out.tfevents.*"):
        for event in tf.compat.v1.train.summary_iterator(str(path)):
            for value in event.summary.value:
                if value.metadata.plugin_data.plugin_name == plugin:
                    counts[value.tag] += 1
    return counts


def test_the_main_job_prints_a_short_report_and_logs_attention_images(tmp_path):
    """The README's first command as a user runs it (a fresh process, no TF_CPP_MIN_LOG_LEVEL),
    on the smoke corpus for as many epochs as the default recipe: a report under 40 lines with
    no library chatter, and each epoch's attention images in TensorBoard."""
    recipe = load_config(PROJECT_ROOT / "configs" / "default.yaml")["train"]
    epochs, images = recipe["epochs"], recipe["attention_images"]
    assert images > 0
    environment = {k: v for k, v in os.environ.items() if k != "TF_CPP_MIN_LOG_LEVEL"}
    result = subprocess.run(
        [sys.executable, "-m", "pipeline.train", "--config", SMOKE, "--workdir", str(tmp_path),
         "--set", f"train.epochs={epochs}", "--set", f"train.attention_images={images}",
         "--set", "export.after_training=true"],
        capture_output=True, text=True, cwd=PROJECT_ROOT, env=environment, timeout=600,
    )  # fmt: skip
    assert result.returncode == 0, result.stderr[-3000:]
    # Lines as a terminal shows them: a progress bar redraws its line with carriage returns.
    lines = (result.stdout + result.stderr).rstrip("\n").split("\n")
    assert len(lines) < 40, "\n".join(lines)
    assert not [line for line in lines if NATIVE_LOG_LINE.match(line)], lines
    for start in ("Model: ", "Test: BLEU", "SavedModel: ", "ONNX: ", "Next:"):
        assert any(line.startswith(start) for line in lines), start
    logged = summary_tags(tmp_path / "logs" / "validation", "images")
    assert logged == {f"attention/{n}": epochs for n in range(1, images + 1)}


def test_callbacks_run_in_the_declared_order_and_an_undeclared_one_is_refused():
    shuffled = [kind.__new__(kind) for kind in reversed(training_callbacks.ORDER)]
    ordered = training_callbacks.in_order(shuffled)
    assert [type(callback) for callback in ordered] == list(training_callbacks.ORDER)
    with pytest.raises(TypeError, match="LambdaCallback has no place in callbacks.ORDER"):
        training_callbacks.in_order([keras.callbacks.LambdaCallback()])


def test_init_uniform_draws_every_trainable_weight_from_its_range():
    """`train.init_uniform`: each weight uniform in [-x, x] (mean 0, variance x^2 / 3), the
    same draw for the same seed."""

    def drawn(seed):
        model = keras.Sequential([keras.Input((8,)), keras.layers.Dense(64), keras.layers.Dense(8)])
        trainer._initialise_uniformly(model, 0.1, seed)
        return [weight.numpy() for weight in model.trainable_weights]

    weights = drawn(7)
    values = np.concatenate([weight.ravel() for weight in weights])
    assert np.abs(values).max() <= 0.1
    assert abs(values.mean()) < 0.01 and abs(values.var() - 0.01 / 3) < 0.0005
    assert not np.allclose(weights[0][:, 0], weights[0][:, 1])
    assert all(np.array_equal(a, b) for a, b in zip(weights, drawn(7), strict=True))
