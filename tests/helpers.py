"""Small shared builders for the tests."""

import fcntl
import gzip
import hashlib
import os
import shutil
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import pytest
import tensorflow as tf

import layers
from pipeline.config import PROJECT_ROOT
from pipeline.workdir import load_trained

PAD, UNK, BOS, EOS = 0, 1, 2, 3

# Every attention layer configuration the tests cover, for queries and a memory of 8 features.
ATTENTION_FACTORIES = {
    "bahdanau": lambda: layers.BahdanauAttention(6),
    "bahdanau_normalized": lambda: layers.BahdanauAttention(6, normalize=True),
    "luong_dot": lambda: layers.LuongAttention("dot"),
    "luong_general": lambda: layers.LuongAttention("general"),
    "luong_general_scaled": lambda: layers.LuongAttention("general", scale=True),
    "luong_concat": lambda: layers.LuongAttention("concat", units=5),
    "scaled_dot": lambda: layers.ScaledDotProductAttention(),
    "scaled_dot_projected": lambda: layers.ScaledDotProductAttention(4, project_values=True),
    "multi_head": lambda: layers.MultiHeadCrossAttention(num_heads=2, key_dim=4),
    "scaled_dot_qk_norm": lambda: layers.ScaledDotProductAttention(4, qk_norm=True),
    "multi_head_qk_norm": lambda: layers.MultiHeadCrossAttention(2, 4, qk_norm=True),
    "multi_head_one_qk_norm": lambda: layers.MultiHeadCrossAttention(1, 4, qk_norm=True),
    "multi_head_raw_values": lambda: layers.MultiHeadCrossAttention(
        2, 4, qk_norm=True, project_values=False
    ),
}


def reversal_data(rng, n, vocab_size=20, max_len=8):
    """Random token sequences and their reversals, in the RecurrentSeq2Seq input format."""
    source = np.zeros((n, max_len), np.int32)
    target_in = np.zeros((n, max_len + 1), np.int32)
    target_out = np.zeros((n, max_len + 1), np.int32)
    for i in range(n):
        length = rng.integers(1, max_len + 1)
        tokens = rng.integers(4, vocab_size, size=length)
        source[i, :length] = tokens
        target_in[i, 0] = BOS
        target_in[i, 1 : length + 1] = tokens[::-1]
        target_out[i, :length] = tokens[::-1]
        target_out[i, length] = EOS
    return {"source_ids": source, "target_input_ids": target_in}, target_out


def real_sentences(n, split="test_2016_flickr", language="de"):
    """The first `n` sentences of a bundled Multi30k split, in `language`."""
    path = PROJECT_ROOT / "data" / "multi30k" / f"{split}.{language}.gz"
    with gzip.open(path, "rt", encoding="utf-8") as lines:
        return [next(lines).rstrip("\n") for _ in range(n)]


def node_example(name):
    """(node, the directory of `examples/<name>`) with its locked packages installed; skips the
    test where node or npm is missing or the packages cannot be installed."""
    node, npm = shutil.which("node"), shutil.which("npm")
    if not node or not npm:
        pytest.skip("node and npm are needed for the JavaScript examples")
    example = PROJECT_ROOT / "examples" / name
    # One install, however many pytest-xdist workers ask at once: `npm ci` empties
    # node_modules before filling it, so a test must not run beside another's install.
    with open(node_modules_lock(example), "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        # npm writes its hidden lockfile once the packages are in place.
        if not (example / "node_modules" / ".package-lock.json").is_file():
            install = subprocess.run(
                [npm, "ci", "--ignore-scripts", "--no-audit", "--no-fund"],
                cwd=example, capture_output=True, text=True, timeout=600,
            )  # fmt: skip
            if install.returncode != 0:
                pytest.skip(f"npm could not install the example's packages: "
                            f"{install.stderr[-500:]}")  # fmt: skip
    return node, example


def node_modules_lock(example):
    """The lock file (outside the project) that one install of `example`'s packages holds."""
    digest = hashlib.sha256(str(example).encode()).hexdigest()[:16]
    return Path(tempfile.gettempdir()) / f"seq2seq-npm-{digest}.lock"


def run_python(code, *args, expect_status=0):
    """Runs `code` in a fresh interpreter in the project root; returns its stdout."""
    result = subprocess.run(
        [sys.executable, "-c", code, *map(str, args)],
        capture_output=True,
        text=True,
        cwd=PROJECT_ROOT,
        env={**os.environ, "TF_CPP_MIN_LOG_LEVEL": "3"},
        timeout=300,
    )
    assert result.returncode == expect_status, result.stderr[-3000:]
    return result.stdout


def search_saved_model(loaded, source_ids, **options):
    """The `beam_search` function; in Python, unlike TF Serving, only the restored function
    (not `signatures["beam_search"]`) fills in omitted inputs from their defaults."""
    inputs = {k: tf.constant(v) for k, v in options.items()}
    outputs = loaded.beam_search(tf.constant(source_ids), **inputs)
    return {name: value.numpy() for name, value in outputs.items()}


def search_onnx(session, source_ids, **options):
    feeds = {"source_ids": np.asarray(source_ids, np.int32)}
    feeds.update({k: np.asarray(v) for k, v in options.items()})
    names = [output.name for output in session.get_outputs()]
    return dict(zip(names, session.run(names, feeds)))


def padded_ids(workdir, sentences):
    _, _, source_tokenizer, _ = load_trained(workdir)
    return source_tokenizer.tokenize(tf.constant(sentences)).to_tensor(0).numpy()


# Training commands in subprocesses (the tests of interrupted and concurrent work).


SMOKE = PROJECT_ROOT / "configs" / "smoke.yaml"
STEPS_PER_EPOCH = 60


def train_command(workdir, *overrides):
    """The smoke recipe, 2 epochs of `STEPS_PER_EPOCH` steps, a checkpoint every 10, no test
    set to translate at the end (what these tests check ends before it)."""
    return [
        sys.executable, "-m", "pipeline.train", "--config", str(SMOKE), "--workdir", str(workdir),
        "--set", f"train.steps_per_epoch={STEPS_PER_EPOCH}", "--set", "train.epochs=2",
        "--set", "train.checkpoint_every_steps=10", "--set", "train.keep_checkpoints=20",
        "--set", "train.bleu_every_epochs=0", "--set", "data.test_source=null",
        "--set", "data.test_target=null", *overrides,
    ]  # fmt: skip


def free_port():
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def start(command):
    """`command` in the project root, its output on `stdout`, TensorFlow's log quiet."""
    return subprocess.Popen(
        command, cwd=PROJECT_ROOT, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
        env={**os.environ, "TF_CPP_MIN_LOG_LEVEL": "3"},
    )  # fmt: skip


def checkpoint_steps(workdir):
    state = tf.train.get_checkpoint_state(str(workdir / "checkpoints"))
    return [int(p.rsplit("-", 1)[1]) for p in state.all_model_checkpoint_paths] if state else []


def wait_for_checkpoint(workdir, step, process, timeout=240):
    """Waits until the manager has recorded `step`'s checkpoint (its save has returned, so
    training is past that step's callbacks), not merely until its files appear."""
    deadline = time.monotonic() + timeout
    while step not in checkpoint_steps(workdir):
        assert process.poll() is None, process.stdout.read()
        assert time.monotonic() < deadline, "no checkpoint in time"
        time.sleep(0.05)
