"""Hardening: hostile text in every runtime, bad files, interrupted work, threads, divergence
and safe loading."""

import json
import os
import re
import shutil
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import keras
import numpy as np
import pytest
import tensorflow as tf

from export.runtime import OnnxTranslator
from helpers import (
    SMOKE,
    STEPS_PER_EPOCH,
    checkpoint_steps,
    real_sentences,
    start,
    train_command,
    wait_for_checkpoint,
)
from pipeline import train, translate
from pipeline.config import PROJECT_ROOT, load_config
from pipeline.core.errors import UserError
from pipeline.training import callbacks as training_callbacks
from pipeline.training import trainer
from pipeline.workdir import LOCK_FILE, load_trained

HOSTILE = [
    "",
    "   \t ",
    "Hund " * 2000,  # 10,000 characters
    "\x01\x02 Kontroll\x7fzeichen \x1b[31m",
    "😀🐶 Ein Hund 日本語 كلب ΣΩ",
    "Xyzzyqwerty Blorfnak Zzzzq",
    "Ein Hund läuft über eine Wiese.",
]
EMPTY = {0, 1}
CAP = 20  # decode.max_length_cap of the smoke config


@pytest.fixture(scope="module")
def workdir(exported_workdir):
    return exported_workdir


@pytest.fixture(scope="module")
def saved_model(workdir):
    return tf.saved_model.load(str(workdir / "export" / "saved_model" / "translator" / "1"))


@pytest.fixture(scope="module")
def onnx_translator(workdir):
    return OnnxTranslator(workdir / "export")


def serve(saved_model, sentences):
    outputs = saved_model.signatures["serving_default"](sentences=tf.constant(sentences, tf.string))
    return [t.decode() for t in outputs["translations"].numpy()]


def check_outputs(translations):
    assert len(translations) == len(HOSTILE)
    for index, text in enumerate(translations):
        assert (text == "") == (index in EMPTY), (index, text)
        assert len(text.split()) <= CAP


# Text input.


def test_hostile_text_through_pipeline_translate(workdir, tmp_path, capsys):
    path = tmp_path / "hostile.txt"
    path.write_text("".join(line + "\n" for line in HOSTILE), encoding="utf-8")
    translate.main(["--workdir", str(workdir), "--input", str(path)])
    check_outputs(capsys.readouterr().out.split("\n")[: len(HOSTILE)])


def test_hostile_text_through_serving_default_and_the_runtime(saved_model, onnx_translator):
    served = serve(saved_model, HOSTILE)
    check_outputs(served)
    check_outputs(onnx_translator.translate(HOSTILE))
    assert serve(saved_model, []) == [] and onnx_translator.translate([]) == []


def test_a_batch_of_a_thousand(saved_model, onnx_translator):
    sentences = real_sentences(1000)
    served = serve(saved_model, sentences)
    assert len(served) == 1000 and all(served)
    assert len(onnx_translator.translate(sentences)) == 1000


def test_beam_search_signature_takes_any_ids(saved_model):
    def search(ids, **options):
        typed = {k: tf.constant(v, tf.int32) for k, v in options.items()}
        return {k: v.numpy() for k, v in saved_model.beam_search(tf.constant(ids), **typed).items()}

    empty_batch = search(np.zeros((0, 5), np.int32))
    assert empty_batch["ids"].shape[:2] == (0, 1)
    blank = search([[0, 0, 0], [30, 40, 0]])
    assert blank["lengths"][0, 0] == 0 and blank["scores"][0, 0] == 0
    assert not blank["ids"][0].any() and blank["lengths"][1, 0] > 0
    # Ids outside the vocabulary read as <unk> (1).
    np.testing.assert_array_equal(search([[30, 99999, -7]])["ids"], search([[30, 1, 1]])["ids"])
    assert search([[30, 40]], beam_size=0)["ids"].shape[1] == 1
    assert search([[30, 40]], beam_size=100_000, n_best=2)["ids"].shape[1] == 2
    long = search(np.full((1, 5000), 30, np.int32))
    assert long["attention"].shape[-1] == 250 and long["ids"].shape[-1] <= CAP


def test_the_onnx_graph_takes_any_ids_and_the_runtime_names_what_it_refuses(onnx_translator):
    def run_graph(ids, **options):  # the graph alone, as another ONNX Runtime user runs it
        feeds = {"source_ids": np.asarray(ids, np.int32),
                 **{k: np.asarray(v, np.int32) for k, v in options.items()}}  # fmt: skip
        names = [output.name for output in onnx_translator.session.get_outputs()]
        return dict(zip(names, onnx_translator.session.run(names, feeds)))

    out = run_graph([[30, 99999, -7], [0, 0, 0]])
    reference = onnx_translator.search([[30, 1, 1], [0, 0, 0]])
    np.testing.assert_array_equal(out["ids"][0], reference["ids"][0])
    assert out["lengths"][1, 0] == 0
    assert run_graph([[30, 40]], beam_size=100_000, n_best=2)["ids"].shape[1] == 2
    # OnnxTranslator holds a request to what the commands accept, naming the argument.
    size = onnx_translator.source.get_piece_size()
    for ids, options, says in [
        ([[30, size]], {}, f"source_ids: id {size} is outside the vocabulary (0 to {size - 1})"),
        ([[30, -7]], {}, "source_ids: id -7"),
        ([[30], [40, 41]], {}, "source_ids: the rows differ in length"),
        ([30, 40], {}, "source_ids must be a matrix"),
        ([], {}, "source_ids has no rows"),
        ([[30]], {"beam_size": -1}, "beam_size must be at least 1"),
        ([[30]], {"beam_size": 2.5}, "beam_size must be an integer"),
        ([[30]], {"beam_size": 2, "n_best": 3}, "n_best (3) cannot exceed beam_size (2)"),
        ([[30]], {"beam_size": 100, "n_best": 70}, "n_best (70) cannot exceed 64"),
        ([[30]], {"length_penalty": float("nan")}, "length_penalty must be a finite number"),
        ([[30]], {"max_length": -1}, "max_length must be at least 0"),
        ([[30]], {"no_repeat_ngram_size": -2}, "no_repeat_ngram_size must be at least 0"),
    ]:
        with pytest.raises(ValueError) as refused:
            onnx_translator.search(ids, **options)
        assert says in str(refused.value), (ids, options)
    with pytest.raises(ValueError, match="target_prefix: id 99999"):
        onnx_translator.search([[30]], target_prefix=[[99999]])
    with pytest.raises(ValueError, match="beam_size must be at least 1"):
        onnx_translator.translate(["Ein Hund."], beam_size=0)
    # The graph clips the beam, and n_best widens the default beam, as in pipeline.translate.
    assert onnx_translator.search([[30, 40]], beam_size=100_000, n_best=2)["ids"].shape[1] == 2
    assert onnx_translator.search([[30, 40]], n_best=7)["ids"].shape[1] == 7


# Configuration and files.


def corpus_config(tmp_path, source_lines, target_lines):
    (tmp_path / "train.de").write_bytes(source_lines)
    (tmp_path / "train.en").write_bytes(target_lines)
    config = tmp_path / "config.yaml"
    config.write_text("data:\n  train_source: train.de\n  train_target: train.en\n")
    return config


@pytest.mark.parametrize(
    "source,target,message",
    [
        (None, b"a\n", "train.de"),
        (b"", b"", "is empty"),
        (b"a\nb\n", b"a\n", "must be aligned line by line"),
        (b"a\n\xff\xfe\n", b"a\nb\n", "train.de:2"),
    ],
)
def test_bad_corpora_stop_with_one_line(tmp_path, capsys, source, target, message):
    config = corpus_config(tmp_path, source or b"", target)
    if source is None:
        (tmp_path / "train.de").unlink()
    with pytest.raises(SystemExit) as exit_info:
        train.main(["--config", str(config), "--workdir", str(tmp_path / "run")])
    assert exit_info.value.code == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and message in err[0] and err[0].startswith("error: ")


@pytest.mark.parametrize(
    "source,target,overrides,message",
    [
        (b"ein Hund\n" * 50, b"a dog\n" * 50, ["data.max_source_length=1"], "sampled training"),
        (b"\xff\n" * 5, b"a\n" * 5, ["data.skip_bad_lines=true"], "every line is bad"),
    ],
)
def test_training_data_with_nothing_usable_stops_with_one_line(
    tmp_path, capsys, source, target, overrides, message
):
    config = corpus_config(tmp_path, source, target)
    settings = [arg for override in overrides for arg in ("--set", override)]
    with pytest.raises(SystemExit) as exit_info:
        train.main(["--config", str(config), "--workdir", str(tmp_path / "run"), *settings])
    assert exit_info.value.code == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and message in err[0], err


def copy_workdir(workdir, tmp_path):
    copy = tmp_path / "copy"
    shutil.copytree(workdir, copy, ignore=shutil.ignore_patterns("export"))
    return copy


def snapshot(directory):
    """Every file's content, but the writer lock's note of its last holder."""
    return {
        p: p.read_bytes() for p in Path(directory).rglob("*") if p.is_file() and p.name != LOCK_FILE
    }


def test_a_vocabulary_of_another_model_is_refused(workdir, tmp_path, capsys):
    copy = copy_workdir(workdir, tmp_path)
    other = copy / "vocab" / "target.model"
    from pipeline.data.tokenizer import train_sentencepiece

    train_sentencepiece(real_sentences(500, "val"), 200, "unigram", other)
    before = snapshot(copy)
    with pytest.raises(SystemExit) as exit_info:
        translate.main(["--workdir", str(copy)])
    assert exit_info.value.code == 2
    assert "does not belong to this model" in capsys.readouterr().err
    with pytest.raises(SystemExit) as exit_info:  # resuming training: the checkpoint won't fit
        train.main(["--config", str(SMOKE), "--workdir", str(copy),
                    "--set", "train.steps_per_epoch=40", "--set", "train.bleu_every_epochs=0",
                    "--set", "data.test_source=null", "--set", "data.test_target=null",
                    "--set", "export.after_training=true", "--set", "train.epochs=3"])  # fmt: skip
    assert exit_info.value.code == 2
    assert "cannot restore this checkpoint" in capsys.readouterr().err
    after = snapshot(copy)
    assert {p: b for p, b in after.items() if "logs" not in p.parts} == {
        p: b for p, b in before.items() if "logs" not in p.parts
    }


def test_damaged_checkpoint_and_model_are_refused(workdir, tmp_path, capsys):
    copy = copy_workdir(workdir, tmp_path)
    latest = tf.train.latest_checkpoint(str(copy / "checkpoints"))
    data = Path(latest + ".data-00000-of-00001")
    data.write_bytes(data.read_bytes()[:1000])
    (copy / "model.keras").write_bytes(b"PK\x03\x04 not really a zip")
    before = snapshot(copy)
    with pytest.raises(SystemExit) as exit_info:
        translate.main(["--workdir", str(copy)])
    assert exit_info.value.code == 2
    err = capsys.readouterr().err.strip()
    assert "model.keras: cannot load the model" in err and len(err.splitlines()) == 1
    with pytest.raises(SystemExit) as exit_info:
        train.main(["--config", str(SMOKE), "--workdir", str(copy),
                    "--set", "train.steps_per_epoch=40", "--set", "train.bleu_every_epochs=0",
                    "--set", "data.test_source=null", "--set", "data.test_target=null",
                    "--set", "export.after_training=true", "--set", "train.epochs=3"])  # fmt: skip
    assert exit_info.value.code == 2
    err = capsys.readouterr().err.strip()
    assert latest in err and "damaged" in err and len(err.splitlines()) == 1
    changed = {p for p, b in snapshot(copy).items() if before.get(p) != b}
    assert all("logs" in p.parts for p in changed), changed


# Safety.


def test_yaml_is_safe_loaded(tmp_path):
    config = tmp_path / "evil.yaml"
    marker = tmp_path / "pwned"
    config.write_text(f"data: !!python/object/apply:os.system ['touch {marker}']\n")
    with pytest.raises(UserError, match="invalid YAML"):
        load_config(config)
    assert not marker.exists()


def test_a_model_file_that_would_run_code_is_refused(workdir, tmp_path):
    copy = copy_workdir(workdir, tmp_path)
    inputs = keras.Input((3,))
    evil = keras.Model(inputs, keras.layers.Lambda(lambda x: x * 2)(inputs))
    evil.save(copy / "model.keras")
    with pytest.raises(UserError, match="cannot load the model"):
        load_trained(copy)


def test_nothing_is_unpickled_or_unsafely_loaded():
    sources = [
        p for folder in ("layers", "pipeline", "export", "tools", "bench")
        for p in (PROJECT_ROOT / folder).rglob("*.py")
    ]  # fmt: skip
    text = "\n".join(p.read_text() for p in sources)
    for pattern in ("import pickle", "allow_pickle=True", "yaml.load(", "safe_mode=False",
                    "yaml.unsafe_load"):  # fmt: skip
        assert pattern not in text, pattern
    # torch only ever loads tensors (a pretrained checkpoint's pytorch_model.bin), no objects.
    for call in re.findall(r"torch\.load\((?:[^()]|\([^()]*\))*\)", text):
        assert "weights_only=True" in call, call


# Threads.


def test_runtimes_give_the_same_results_from_eight_threads(saved_model, onnx_translator):
    sentences = real_sentences(48)
    groups = [sentences[i::8] for i in range(8)]
    expected_onnx = [onnx_translator.translate(g) for g in groups]
    expected_saved = [serve(saved_model, g) for g in groups]
    results = {}

    def work(index):
        for _ in range(3):
            results[("onnx", index)] = onnx_translator.translate(groups[index])
            results[("saved", index)] = serve(saved_model, groups[index])

    threads = [threading.Thread(target=work, args=(i,)) for i in range(8)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert [results[("onnx", i)] for i in range(8)] == expected_onnx
    assert [results[("saved", i)] for i in range(8)] == expected_saved


# Numerical faults.


def test_a_non_finite_loss_stops_training_and_keeps_the_last_good_checkpoint(tmp_path):
    x = np.ones((16, 4), np.float32)
    y = np.ones((16, 1), np.float32)
    y[10] = np.inf  # batch 6 (of 2 rows) poisons the loss
    model = keras.Sequential([keras.Input((4,)), keras.layers.Dense(1)])
    model.compile(optimizer="sgd", loss="mse")
    completed = tf.Variable(0, dtype=tf.int64)
    checkpoint = tf.train.Checkpoint(model=model, epochs=completed)
    manager = tf.train.CheckpointManager(checkpoint, str(tmp_path), max_to_keep=5)
    checkpointer = training_callbacks.CheckpointEveryNSteps(manager, completed, every_steps=2)
    callbacks = [training_callbacks.StopOnNonFiniteLoss(manager), checkpointer]
    with pytest.raises(training_callbacks.TrainingDiverged, match="the loss is inf at step 6"):
        model.fit(x, y, batch_size=2, shuffle=False, verbose=0, callbacks=callbacks)
    assert manager.latest_checkpoint.endswith("ckpt-4")
    checkpoint.restore(manager.latest_checkpoint)
    assert all(np.isfinite(w).all() for w in model.get_weights())


def test_divergence_stops_the_command_with_one_line(tmp_path, capsys):
    with pytest.raises(SystemExit) as exit_info:
        train.main(["--config", str(SMOKE), "--workdir", str(tmp_path),
                    "--set", "train.learning_rate=1e38", "--set", "train.clip_norm=null",
                    "--set", "train.bleu_every_epochs=0"])  # fmt: skip
    assert exit_info.value.code == 2
    assert "training diverged" in capsys.readouterr().err
    assert not (tmp_path / "model.keras").exists()


def test_a_signal_between_the_two_fits_of_a_resumed_epoch_is_caught():
    """A run resumed mid-epoch fits the rest of that epoch, then the other epochs: a SIGTERM
    between the two fits saves a checkpoint and stops, as within one (it once killed the
    process there)."""
    saved, stray = [], []

    class Checkpointer:
        def save(self):
            saved.append("ckpt-7")
            return saved[-1]

    # Were the callback's handlers gone between the fits, this one would see the signal.
    previous = signal.signal(signal.SIGTERM, lambda signum, frame: stray.append(signum))
    callback = training_callbacks.StopOnSignal(Checkpointer(), log=lambda message: None)
    try:
        callback.on_train_begin()
        callback.on_train_end()  # the rest of the resumed epoch
        signal.raise_signal(signal.SIGTERM)
        callback.on_train_begin()  # the other epochs
        with pytest.raises(training_callbacks.TrainingInterrupted) as interrupted:
            callback.on_epoch_begin(1)
    finally:
        callback.restore_handlers()
        signal.signal(signal.SIGTERM, previous)
    assert interrupted.value.checkpoint == "ckpt-7" and saved == ["ckpt-7"] and not stray


def test_a_signal_at_an_epochs_last_step_lets_the_epoch_end_first(tmp_path):
    """A signal during an epoch's last step stops after that epoch's end: its checkpoint
    counts the epoch as done, so the resumed run does not train it again (it once did)."""
    steps_per_epoch = 4
    model = keras.Sequential([keras.Input((2,)), keras.layers.Dense(1)])
    model.compile(optimizer="sgd", loss="mse")
    completed_epochs = tf.Variable(0, dtype=tf.int64)
    manager = tf.train.CheckpointManager(
        tf.train.Checkpoint(model=model, optimizer=model.optimizer, epochs=completed_epochs),
        str(tmp_path), max_to_keep=5,
    )  # fmt: skip
    checkpointer = training_callbacks.CheckpointEveryNSteps(manager, completed_epochs, 100)

    class SignalAtLastStep(keras.callbacks.Callback):
        def on_train_batch_end(self, batch, logs=None):
            if batch + 1 == steps_per_epoch:
                signal.raise_signal(signal.SIGTERM)

    stopper = training_callbacks.StopOnSignal(checkpointer, log=lambda message: None)
    features, targets = np.ones((8, 2), "float32"), np.ones((8, 1), "float32")
    try:
        with pytest.raises(training_callbacks.TrainingInterrupted) as interrupted:
            model.fit(
                features, targets, batch_size=2, epochs=3, steps_per_epoch=steps_per_epoch,
                callbacks=[SignalAtLastStep(), checkpointer, stopper], verbose=0,
            )  # fmt: skip
    finally:
        stopper.restore_handlers()
    assert interrupted.value.checkpoint.endswith(f"ckpt-{steps_per_epoch}")
    assert int(completed_epochs.numpy()) == 1
    work = trainer._remaining_work(steps_per_epoch, 3, 1, steps_per_epoch, log=print)
    assert work == [(1, 3, steps_per_epoch)]


# Interrupted work (subprocesses; slow).


def finish(workdir):
    result = subprocess.run(
        train_command(workdir), cwd=PROJECT_ROOT, capture_output=True, text=True, timeout=300,
        env={**os.environ, "TF_CPP_MIN_LOG_LEVEL": "3"},
    )  # fmt: skip
    assert result.returncode == 0, result.stdout[-2000:] + result.stderr[-2000:]
    return result.stdout


def resume_then_signal(workdir, signum):
    """Runs the training command again and sends `signum` once it has saved its first new
    checkpoint inside an epoch; returns the output of the interrupted run and that
    checkpoint's step."""
    interrupted_at = max(checkpoint_steps(workdir))
    periodic = interrupted_at // 10 * 10 + 10
    if periodic % STEPS_PER_EPOCH == 0:  # a signal during validation would stop at this step
        periodic += 10
    process = start(train_command(workdir))
    wait_for_checkpoint(workdir, periodic, process)
    process.send_signal(signum)
    output, _ = process.communicate(timeout=120)
    assert f"Resuming from {workdir / 'checkpoints' / f'ckpt-{interrupted_at}'}" in output
    assert process.returncode == 128 + signum, output[-2000:]
    return output, periodic


@pytest.mark.slow
def test_killed_interrupted_and_terminated_training_resumes_each_time(tmp_path):
    """One run stopped three ways in turn: SIGKILL at a random moment loses at most the steps
    since the last checkpoint; SIGINT and SIGTERM save a checkpoint of the step they
    interrupt and exit; each rerun of the same command resumes, and the last one finishes."""
    process = start(train_command(tmp_path))
    wait_for_checkpoint(tmp_path, 10, process)
    began = time.monotonic()
    wait_for_checkpoint(tmp_path, 30, process)
    # A random moment within about ten steps, but never past the checkpoint of step 50: a
    # machine that speeds up must not reach the end before the last run.
    step_seconds = (time.monotonic() - began) / 20
    kill_at = time.monotonic() + np.random.default_rng().uniform(0.0, 10 * step_seconds)
    while time.monotonic() < kill_at and 50 not in checkpoint_steps(tmp_path):
        time.sleep(0.01)
    process.kill()
    process.wait()
    for signum in (signal.SIGINT, signal.SIGTERM):
        output, periodic = resume_then_signal(tmp_path, signum)
        saved = max(checkpoint_steps(tmp_path))
        # The step interrupted: the periodic one itself when the signal came during its
        # callbacks, a later one otherwise; steps remain either way.
        assert periodic <= saved < 2 * STEPS_PER_EPOCH
        assert f"saved {tmp_path / 'checkpoints' / f'ckpt-{saved}'}. Run the same command" in output
        assert not (tmp_path / "model.keras").exists()
    output = finish(tmp_path)
    assert f"Resuming from {tmp_path / 'checkpoints' / f'ckpt-{saved}'}" in output
    assert "continues at line" in output  # the stream goes on where the last run stopped
    assert "Trained for" in output and max(checkpoint_steps(tmp_path)) == 120


@pytest.mark.slow
def test_an_export_killed_midway_leaves_the_previous_one_intact(workdir, tmp_path):
    output = tmp_path / "out"
    shutil.copytree(workdir / "export", output)  # the export training wrote: version 1
    before = snapshot(output)
    process = start([sys.executable, "-m", "export", "--workdir", str(workdir),
                     "--output", str(output)])  # fmt: skip
    deadline = time.monotonic() + 120
    model_dir = output / "saved_model" / "translator"
    while not any(p.name.startswith(".2.tmp-") for p in model_dir.iterdir()):
        assert process.poll() is None and time.monotonic() < deadline
        time.sleep(0.02)
    process.kill()
    process.wait()
    assert sorted(p.name for p in model_dir.iterdir() if not p.name.startswith(".")) == ["1"]
    assert snapshot(output / "onnx") == {p: b for p, b in before.items() if "onnx" in p.parts}
    assert json.loads((output / "onnx" / "model.json").read_text())["format_version"] == 1
