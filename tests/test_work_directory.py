"""One writer a work directory at a time; every damaged file named in its error; a full disk
stops a command with one line, loses nothing, and the same command resumes."""

import contextlib
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import textwrap
import threading
from concurrent.futures import ThreadPoolExecutor

import pytest

from export.runtime import OnnxTranslator
from helpers import (
    SMOKE,
    STEPS_PER_EPOCH,
    checkpoint_steps,
    node_example,
    start,
    train_command,
    wait_for_checkpoint,
)
from pipeline.config import PROJECT_ROOT
from pipeline.core.errors import UnusableFileError, UserError, WriteFailed
from pipeline.workdir import LOCK_FILE, exclusive_writer

# A process that holds DIRECTORY's writer lock until its standard input closes.
HOLDER = textwrap.dedent("""
    import sys
    from pipeline.workdir import exclusive_writer
    with exclusive_writer(sys.argv[1]):
        print("held", flush=True)
        sys.stdin.read()
""")


@contextlib.contextmanager
def lock_holder(directory):
    holder = subprocess.Popen(
        [sys.executable, "-c", HOLDER, str(directory)], cwd=PROJECT_ROOT,
        stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True,
    )  # fmt: skip
    try:
        assert holder.stdout.readline() == "held\n"
        yield holder
    finally:
        holder.kill()
        holder.wait()


# The lock.


def test_a_second_writer_is_refused_with_the_holder_named(tmp_path):
    with lock_holder(tmp_path) as holder:
        before = sorted(tmp_path.iterdir())
        with pytest.raises(UserError) as refused:
            with exclusive_writer(tmp_path):
                pytest.fail("two writers held the lock")
        assert sorted(tmp_path.iterdir()) == before
    message = str(refused.value)
    assert message.startswith(f"{tmp_path} is in use by python -c")
    assert f"host {socket.gethostname()}, pid {holder.pid}" in message


def test_a_killed_holder_leaves_no_stale_lock(tmp_path):
    with lock_holder(tmp_path):
        pass  # killed with SIGKILL: no cleanup of its own ran
    assert (tmp_path / LOCK_FILE).exists()
    with exclusive_writer(tmp_path):
        with exclusive_writer(tmp_path):  # reentrant: training's export after training
            pass


def test_wait_queues_behind_the_holder(tmp_path):
    waited, acquired = [], threading.Event()

    def writer():
        with exclusive_writer(tmp_path, wait=True, log=waited.append):
            acquired.set()

    with lock_holder(tmp_path) as holder:
        queued = threading.Thread(target=writer)
        queued.start()
        assert not acquired.wait(timeout=1.0)
        holder.stdin.close()  # the holder lets go and ends
        assert acquired.wait(timeout=30)
        queued.join()
    assert len(waited) == 1 and waited[0].startswith("Waiting for python -c")
    assert waited[0].endswith(f"to finish with {tmp_path}")


def test_readers_work_while_a_writer_holds_the_lock(exported_workdir, tmp_path):
    from pipeline import translate

    workdir = tmp_path / "run"
    shutil.copytree(exported_workdir, workdir)  # the shared one is not to change
    sentences = tmp_path / "input.de"
    sentences.write_text("Ein Hund läuft.\n")
    with lock_holder(workdir):
        translate.main(["--workdir", str(workdir), "--input", str(sentences),
                        "--output", str(tmp_path / "output.en")])  # fmt: skip
        assert OnnxTranslator(workdir / "export").translate(["Ein Hund läuft."])
    assert (tmp_path / "output.en").read_text().strip()


@pytest.mark.slow
def test_two_trainings_on_one_work_directory(tmp_path):
    """The second command started while the first trains is refused at once, or with --wait
    runs after it; the first's checkpoints and model are those of one run."""
    command = train_command(tmp_path, "--set", "train.keep_checkpoints=99")
    first = start(command)
    wait_for_checkpoint(tmp_path, 10, first)
    # Held still, with its lock, until both others have met it: however fast the machine,
    # the first is training when they start.
    first.send_signal(signal.SIGSTOP)
    try:
        queued = start([*command, "--wait"])
        # The command says it waits, then waits (a reader that never returns fails the test).
        reader = ThreadPoolExecutor(1)
        first_line = reader.submit(queued.stdout.readline).result(timeout=120)
        reader.shutdown()
        refused = subprocess.run(
            command, cwd=PROJECT_ROOT, capture_output=True, text=True, timeout=120
        )  # fmt: skip
    finally:
        first.send_signal(signal.SIGCONT)
    assert first_line.startswith("Waiting for python -m pipeline.train"), first_line
    assert refused.returncode == 2, refused.stdout + refused.stderr
    assert refused.stdout == ""
    assert refused.stderr.startswith(
        f"error: {tmp_path} is in use by python -m pipeline.train --config {SMOKE} --workdir "
    )
    assert f"(host {socket.gethostname()}, pid {first.pid}, since " in refused.stderr
    assert len(refused.stderr.splitlines()) == 1
    output, _ = first.communicate(timeout=300)
    assert first.returncode == 0, output[-2000:]
    queued_output, _ = queued.communicate(timeout=300)
    assert queued.returncode == 0, queued_output[-2000:]
    # One run's checkpoints: every 10 steps (the epochs end on them), one step counter.
    assert checkpoint_steps(tmp_path) == list(range(10, 2 * STEPS_PER_EPOCH + 1, 10))
    assert "Trained for" in output and (tmp_path / "model.keras").is_file()


# Damaged files, each named.


def damaged_copies(onnx_dir, tmp_path):
    """(copy of the export with one file damaged, the damaged file) for each file."""
    metadata = json.loads((onnx_dir / "model.json").read_text())

    def cut_short(path):
        path.write_bytes(path.read_bytes()[: len(path.read_bytes()) // 2])

    damages = {
        "model.json cut short": ("model.json", cut_short),
        "model.json without its model": (
            "model.json",
            lambda p: p.write_text(json.dumps({k: v for k, v in metadata.items() if k != "model"})),
        ),
        "model.onnx cut short": (metadata["model"], cut_short),
        "model.onnx missing": (metadata["model"], lambda p: p.unlink()),
        "source vocabulary garbled": (metadata["source_vocabulary"], lambda p: p.write_text("x")),
        "target vocabulary missing": (metadata["target_vocabulary"], lambda p: p.unlink()),
    }
    for name, (file_name, damage) in damages.items():
        copy = tmp_path / name.replace(" ", "_") / "onnx"
        shutil.copytree(onnx_dir, copy)
        damage(copy / file_name)
        yield name, copy, copy / file_name


def test_each_damaged_export_file_is_named_by_the_runtime(exported_workdir, tmp_path):
    for name, export, damaged in damaged_copies(exported_workdir / "export" / "onnx", tmp_path):
        with pytest.raises(UnusableFileError) as error:
            OnnxTranslator(export)
        assert str(error.value).startswith(f"{damaged}: "), name
        assert error.value.path == damaged
        assert len(str(error.value).splitlines()) == 1, name


def test_each_damaged_export_file_is_named_by_the_node_example(exported_workdir, tmp_path):
    node, example = node_example("node")
    for name, export, damaged in damaged_copies(exported_workdir / "export" / "onnx", tmp_path):
        result = subprocess.run(
            [node, "translate.mjs", str(export), "Ein Hund."],
            cwd=example, capture_output=True, text=True, timeout=120,
        )  # fmt: skip
        assert result.returncode == 2, (name, result.stderr)
        assert result.stderr.startswith(f"error: {damaged}: "), (name, result.stderr)


def test_a_runtime_loading_during_a_re_export_reads_one_version(
    exported_workdir, tmp_path, monkeypatch
):
    from export import runtime

    export, newer = tmp_path / "onnx", tmp_path / "newer"
    shutil.copytree(exported_workdir / "export" / "onnx", export)
    shutil.copytree(export, newer)
    metadata = json.loads((newer / "model.json").read_text())
    (newer / "model.json").write_text(json.dumps({**metadata, "max_source_length": 7}))
    read_once, limits = runtime._read_once, []

    def read_during_a_re_export(directory, int8):
        files = read_once(directory, int8)
        if not limits:  # the export's directory is replaced by a rename, as export does
            os.rename(export, tmp_path / "older")
            os.rename(newer, export)
        limits.append(files[0]["max_source_length"])
        return files

    monkeypatch.setattr(runtime, "_read_once", read_during_a_re_export)
    translator = OnnxTranslator(export)
    assert limits == [metadata["max_source_length"], 7]
    assert translator.metadata["max_source_length"] == 7


def test_damaged_work_directory_files_are_named_by_the_commands(exported_workdir, tmp_path):
    from pipeline import translate

    for file_name in ("config.yaml", "vocab/source.model", "model.keras"):
        copy = tmp_path / file_name.replace("/", "_")
        shutil.copytree(exported_workdir, copy, ignore=shutil.ignore_patterns("export"))
        (copy / file_name).write_bytes(b"\x00\xff: [")
        with pytest.raises(UnusableFileError) as error:
            translate.main.__wrapped__(["--workdir", str(copy)])
        assert str(error.value).startswith(f"{copy / file_name}: "), file_name


# A full disk.


@pytest.fixture
def small_disk(tmp_path):
    """A 64 MB tmpfs at tmp_path/disk, where the machine lets the tests mount one."""
    disk = tmp_path / "disk"
    disk.mkdir()
    mounted = subprocess.run(
        ["mount", "-t", "tmpfs", "-o", "size=64m", "tmpfs", str(disk)],
        capture_output=True, text=True,
    )  # fmt: skip
    if mounted.returncode != 0:
        pytest.skip(f"cannot mount a small filesystem here ({mounted.stderr.strip()})")
    try:
        yield disk
    finally:
        subprocess.run(["umount", "-l", str(disk)], check=False)


def fill(disk):
    """Writes a file until the disk is full; returns it."""
    filler = disk / "filler"
    with open(filler, "wb") as handle:
        with contextlib.suppress(OSError):
            while True:
                handle.write(b"\0" * (1 << 20))
                handle.flush()
    return filler


def temporary_files(directory):
    return [p for p in directory.rglob("*") if "_temp" in p.name or ".tmp-" in p.name]


@pytest.mark.slow
def test_a_disk_that_fills_during_training_stops_it_with_one_line(small_disk):
    workdir = small_disk / "run"
    process = start(train_command(workdir))
    wait_for_checkpoint(workdir, 10, process)
    filler = fill(small_disk)
    output, _ = process.communicate(timeout=300)
    assert process.returncode == 2, output[-3000:]
    last = output.strip().splitlines()[-1]
    assert last.startswith(f"error: cannot write {workdir}"), output[-3000:]
    assert last.endswith("No space left on device"), last
    assert "Traceback" not in output
    assert temporary_files(workdir) == []
    kept = checkpoint_steps(workdir)
    assert kept and kept == sorted(kept)
    filler.unlink()
    resumed = subprocess.run(
        train_command(workdir), cwd=PROJECT_ROOT, capture_output=True, text=True,
        timeout=300, env={**os.environ, "TF_CPP_MIN_LOG_LEVEL": "3"},
    )  # fmt: skip
    assert resumed.returncode == 0, resumed.stdout[-2000:] + resumed.stderr[-2000:]
    assert f"Resuming from {workdir / 'checkpoints' / f'ckpt-{kept[-1]}'}" in resumed.stdout
    assert max(checkpoint_steps(workdir)) == 120


def test_a_failed_atomic_write_names_the_file_and_keeps_the_old_one(tmp_path, monkeypatch):
    from pipeline.core import atomic_files

    target = tmp_path / "report.json"
    target.write_text("old")

    def no_space(*args):
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(atomic_files.os, "replace", no_space)
    with pytest.raises(WriteFailed) as failed:
        atomic_files.write_text_atomically(target, "new")
    assert str(failed.value) == f"cannot write {target}: No space left on device"
    assert target.read_text() == "old"
    assert sorted(tmp_path.iterdir()) == [target]
