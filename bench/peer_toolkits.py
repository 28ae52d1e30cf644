"""This toolkit beside the NMT toolkits users choose: OpenNMT-tf and OpenNMT-py, on the same
data, the same model, the same SentencePiece models, the same machine and the same CPUs.

    python bench/peer_toolkits.py setup
    python bench/peer_toolkits.py speed   [--families F ...] [--threads 1 2] [--rounds 2]
                                          [--steps 300] [--window 50] [--toolkits T ...]
    python bench/peer_toolkits.py quality [--families F ...] [--minutes 30] [--threads 2]
                                          [--toolkits T ...]
    python bench/peer_toolkits.py inference [--family F] [--sentences 1000] [--rounds 2]
                                            [--threads 2] [--toolkits T ...]
    python bench/peer_toolkits.py report

Everything lands in `--root` (default `runs/peer_toolkits/`): `venvs/` (each peer installed
from PyPI, pinned, into its own venv: `PEERS`), `data/` (Multi30k German->English as plain
text, and the SentencePiece models every toolkit reads), one folder per run, and
`results.json`, which every step adds to and `report` prints as tables.

Families (`FAMILIES`): the Transformer of `configs/multi30k_de_en_transformer.yaml`, our
default recipe's attentional GRU (`configs/default.yaml`), and Luong et al.'s attentional LSTM
(bidirectional encoder, general score, input feeding; OpenNMT-py's default architecture). Each
is written in each toolkit's own configuration; where a toolkit cannot build a piece the same,
`family.differences` says what it builds instead.

- `speed`: every toolkit (or those of `--toolkits`, in their order; only their peers are
  installed) trains `--steps` steps from scratch, the toolkits taking turns within each
  round, on `--threads` CPUs (`taskset`; OpenNMT-py also gets OMP/MKL_NUM_THREADS, the
  TensorFlow toolkits read the CPU set). A run's figure is the median target tokens/s (pieces
  plus </s>, as each toolkit logs it) over its `--window`-step windows after the first.
- `quality`: each toolkit trains for the same wall time (`--minutes`, from the command's start;
  ours through `train.time_budget_hours`, which ends at an epoch end within it), keeps what it
  keeps by default (OpenNMT-tf: the mean of its last 8 checkpoints; OpenNMT-py: its last
  checkpoint; ours: the recipe's), then translates test_2016_flickr and the validation set with
  beam 5; sacreBLEU (cased, lowercased) and chrF on the raw references. A finished run is
  skipped, so the command resumes where it stopped.
- `inference`: the quality models translate the same test sentences at batch 1 and 64,
  greedy and beam 5, the systems taking turns: ours in ONNX Runtime (float32 and int8), and
  each toolkit's fastest deployment path: CTranslate2 for Transformers (ours exported, the
  peers' converted by their own converters), OpenNMT-py's `onmt_translate` for its recurrent
  models (CTranslate2 runs no RNN).

Our side is always `python -m pipeline.train --config FILE` with a configuration file written
from the shipped recipe: nothing a user could not set. `OUR_VARIANTS` (one-length batches,
mixed bfloat16, Luong et al.'s uniform initialisation, the mean of the last 3 checkpoints)
are the recipe with one setting changed, as toolkits of their own in both.
This process never imports TensorFlow or PyTorch: every toolkit runs in its own subprocess
and venv.
"""

import argparse
import dataclasses
import functools
import json
import os
import re
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

import yaml
from common import PROJECT_ROOT, alternate, make_venv

sys.path.insert(0, str(PROJECT_ROOT))

from pipeline.decoding.evaluation import score_translations  # noqa: E402

MULTI30K = PROJECT_ROOT.parent / "shared" / "data" / "multi30k"
SPLITS = {"train": "train", "valid": "val", "test": "test_2016_flickr"}
SOURCE, TARGET = "de", "en"
BEAM_SIZE = 5
OPENNMT_TF_AVERAGED = 8  # OpenNMT-tf's auto_config: the mean of the last 8 checkpoints


@dataclass(frozen=True)
class Peer:
    """A toolkit installed from PyPI into its own venv: pip's argument lists, in order."""

    name: str
    version: str
    installs: tuple

    def venv(self, root):
        return root / "venvs" / f"{self.name}-{self.version}"

    def bin(self, root, program):
        return self.venv(root) / "bin" / program


SENTENCEPIECE = "sentencepiece==0.2.1"  # its `sentencepiece` transform imports it
PEERS = {
    "opennmt-tf": Peer("opennmt-tf", "2.32.0", (("OpenNMT-tf==2.32.0", "tensorflow-cpu==2.13.1"),)),
    # torch 2.13.0 first: the CPU wheel on the machine's disk (a plain `torch` is a CUDA build).
    # It brings CTranslate2 3.24, whose converter reads its checkpoints.
    "opennmt-py": Peer(
        "opennmt-py",
        "3.0.4",
        (("torch==2.13.0",), ("OpenNMT-py==3.0.4", "torch==2.13.0", SENTENCEPIECE)),
    ),
}
TOOLKITS = ("ours", *PEERS)
# Our recipe with settings a user may change, measured for speed beside it: one-length
# batches, as OpenNMT-tf's Transformer batches (length_bucket_width 1) and OpenNMT-py's
# length-sorted pools come close to; mixed bfloat16, which neither peer trains in on a CPU;
# Luong et al.'s uniform initialisation and the mean of the last 3 checkpoints, which
# configs/default.yaml (so both recurrent families' `ours`) has set since 2026-11-28 and
# 2026-11-29: the names repeat the runs recorded with them.
OUR_VARIANTS = {
    "ours-bucket-width-1": {"train": {"bucket_width": 1}},
    "ours-mixed-bfloat16": {"train": {"precision": "mixed_bfloat16"}},
    "ours-init-uniform": {"train": {"init_uniform": 0.1}},
    "ours-average-3": {"train": {"keep_checkpoints": 3, "average_checkpoints": 3}},
}
SPEED_TOOLKITS = ("ours", *OUR_VARIANTS, *PEERS)


@dataclass(frozen=True)
class Family:
    """One model, as each toolkit builds it."""

    name: str
    recipe: str  # our shipped configuration it starts from
    model: dict  # our `model` section's changes to the recipe
    shared_vocabulary: bool
    vocab_size: int
    max_length: int
    batch: dict  # {"tokens": N} or {"sentences": N}, the recipe's batches
    differences: tuple = field(default=())  # what a peer cannot build the same


TRANSFORMER = Family(
    name="transformer",
    recipe="configs/multi30k_de_en_transformer.yaml",
    model={},
    shared_vocabulary=True,
    vocab_size=10000,
    max_length=80,
    batch={"tokens": 4096},
    differences=(
        "OpenNMT-py: no tied output projection apart from shared embeddings "
        "(share_decoder_embeddings ties it, as ours)",
    ),
)
GRU_BAHDANAU = Family(
    name="rnn_gru_bahdanau",
    recipe="configs/default.yaml",
    model={},
    shared_vocabulary=False,
    vocab_size=4000,
    max_length=60,
    batch={"sentences": 64},
    differences=(
        "OpenNMT-tf: its attentional decoder is Luong's whatever the score: the attention "
        "follows the cell step, its output is the attentional hidden state, fed back as input",
        "OpenNMT-py: the attention memory must match the decoder, so its decoder is 512 wide "
        "(ours 256); its Bahdanau score is `mlp`",
    ),
)
LSTM_LUONG = dataclasses.replace(
    GRU_BAHDANAU,
    name="rnn_lstm_luong",
    model={"cell_type": "lstm", "attention": "luong_general", "input_feeding": True,
           "decoder_units": 512},
    differences=("OpenNMT-tf: tfa's Luong attention has no learned scale on the score",),
)  # fmt: skip
FAMILIES = {f.name: f for f in (TRANSFORMER, GRU_BAHDANAU, LSTM_LUONG)}


# --- the shared parts: data, vocabularies, running and results ---------------------------


def run_logged(command, log_path, cwd=PROJECT_ROOT, env=None, timeout=None):
    """Runs `command` with its output in `log_path`; its exit status (None: stopped at the
    `timeout`, by SIGINT and then SIGKILL)."""
    log_path.parent.mkdir(parents=True, exist_ok=True)
    with open(log_path, "a", encoding="utf-8") as log:
        log.write(f"$ {' '.join(map(str, command))}\n")
        log.flush()
        process = subprocess.Popen(
            [str(part) for part in command], cwd=cwd, env=env, stdout=log,
            stderr=subprocess.STDOUT, start_new_session=True,
        )  # fmt: skip
        try:
            return process.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            os.killpg(process.pid, signal.SIGINT)
            try:
                process.wait(timeout=60)
            except subprocess.TimeoutExpired:
                os.killpg(process.pid, signal.SIGKILL)
                process.wait()
            return None


def checked(command, log_path, **kwargs):
    code = run_logged(command, log_path, **kwargs)
    if code != 0:
        sys.exit(f"{Path(command[0]).name} failed (exit {code}); see {log_path}")


def install_peers(root, toolkits=TOOLKITS):
    """The venv of each peer among `toolkits` (its variants included), made once; its
    `installed` file records what was asked, so that a changed pin installs again."""
    for peer in PEERS.values():
        if not any(toolkit.startswith(peer.name) for toolkit in toolkits):
            continue
        venv, log = peer.venv(root), root / "logs" / f"install-{peer.name}.log"
        make_venv(venv, peer.installs, run=lambda command, log=log: checked(command, log),
                  message=f"Installing {peer.name} {peer.version} into {venv}")  # fmt: skip


def data_paths(root):
    """{split: {side: plain-text path}}: Multi30k as shared, read by every toolkit."""
    return {
        split: {side: MULTI30K / f"{name}.{side}" for side in (SOURCE, TARGET)}
        for split, name in SPLITS.items()
    }


def our_environment():
    return {**os.environ, "TF_CPP_MIN_LOG_LEVEL": "2", "PYTHONPATH": str(PROJECT_ROOT)}


def pinned(command, threads):
    """`command` on the first `threads` CPUs."""
    return ["taskset", "-c", ",".join(str(i) for i in range(threads)), *command]


def our_config(family, root, overrides=None):
    """Our configuration for `family`: the recipe with the benchmark's data and vocabularies."""
    config = yaml.safe_load((PROJECT_ROOT / family.recipe).read_text(encoding="utf-8"))
    paths = data_paths(root)
    config["data"].update(
        {f"{split}_{role}": str(paths[split][side])
         for split in SPLITS for role, side in (("source", SOURCE), ("target", TARGET))}
    )  # fmt: skip
    models = vocabulary_models(family, root)
    if models["source"].exists():
        config["data"]["source_vocabulary"] = str(models["source"])
        config["data"]["target_vocabulary"] = str(models["target"])
    config["model"].update(family.model)
    config.setdefault("export", {})["after_training"] = False
    for section, values in (overrides or {}).items():
        config.setdefault(section, {}).update(values)
    return config


def write_yaml(path, content):
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(yaml.safe_dump(content, sort_keys=False), encoding="utf-8")
    return path


def vocabulary_models(family, root):
    """{"source", "target"}: the family's SentencePiece models (one file twice when shared)."""
    vocab = root / "data" / family.name / "vocab"
    if family.shared_vocabulary:
        return {"source": vocab / "shared.model", "target": vocab / "shared.model"}
    return {"source": vocab / "source.model", "target": vocab / "target.model"}


def build_vocabularies(family, root):
    """The family's SentencePiece models, built once by our toolkit from the recipe's settings
    (a one-step run whose work directory keeps them) and given to every toolkit."""
    models = vocabulary_models(family, root)
    if models["target"].exists():
        return models
    workdir = root / "data" / family.name
    config = our_config(family, root, {"train": {"epochs": 1, "steps_per_epoch": 1}})
    for key in ("valid_source", "valid_target", "test_source", "test_target"):
        config["data"][key] = None
    for key in ("early_stopping_patience", "average_checkpoints", "bleu_every_epochs"):
        config["train"].pop(key, None)
    path = write_yaml(root / "data" / f"{family.name}-vocabularies.yaml", config)
    checked([sys.executable, "-m", "pipeline.train", "--config", path, "--workdir", workdir],
            root / "logs" / f"vocabularies-{family.name}.log", env=our_environment())  # fmt: skip
    return models


def opennmt_vocabularies(family, root):
    """{"source", "target"}: each SentencePiece model's pieces, one a line, for OpenNMT (its
    own special tokens first; our <pad> <unk> <s> </s> left out, the toolkits add theirs)."""
    paths = {}
    for side, model in vocabulary_models(family, root).items():
        path = model.with_suffix(".pieces")
        if not path.exists():
            lines = model.with_suffix(".vocab").read_text(encoding="utf-8").splitlines()
            pieces = [line.split("\t")[0] for line in lines]
            path.write_text("".join(f"{p}\n" for p in pieces[4:]), encoding="utf-8")
        paths[side] = path
    return paths


def load_results(root):
    path = root / "results.json"
    return json.loads(path.read_text()) if path.exists() else {}


def save_result(root, keys, value):
    results = load_results(root)
    node = results
    for key in keys[:-1]:
        node = node.setdefault(key, {})
    node[keys[-1]] = value
    tmp = root / "results.json.tmp"
    tmp.write_text(json.dumps(results, indent=1))
    tmp.replace(root / "results.json")


# --- each toolkit: its configuration, its command, its log ---------------------------------


def ours_files(family, root, workdir, overrides):
    return write_yaml(workdir / "config.yaml", our_config(family, root, overrides))


def ours_speed_commands(family, root, workdir, steps, window, variant=None):
    overrides = {
        "data": {k: None for k in ("valid_source", "valid_target", "test_source", "test_target")},
        "train": {"epochs": steps // window, "steps_per_epoch": window, "bleu_every_epochs": 0,
                  "early_stopping_patience": None, "average_checkpoints": 0,
                  "checkpoint_every_steps": 10 * steps,
                  **OUR_VARIANTS.get(variant, {}).get("train", {})},
    }  # fmt: skip
    config = ours_files(family, root, workdir, overrides)
    return [[sys.executable, "-m", "pipeline.train", "--config", config, "--workdir", workdir]]


def ours_windows(log_text):
    """(target tokens/s, steps/s) of each epoch (one window), from the report's epoch lines."""
    found = re.findall(r"^epoch \d+/\d+: .*?([\d,]+) target tokens/s, (\d+) ms a step",
                       log_text, re.M)  # fmt: skip
    return [(float(tokens.replace(",", "")), 1000 / float(ms)) for tokens, ms in found]


def opennmt_tf_model_file(family, path):
    """OpenNMT-tf's model definition (`--model`): a Python file whose `model()` builds it."""
    if family.name == "transformer":
        body = """
    return opennmt.models.Transformer(
        source_inputter=opennmt.inputters.WordEmbedder(embedding_size=128),
        target_inputter=opennmt.inputters.WordEmbedder(embedding_size=128),
        num_layers=4, num_units=128, num_heads=4, ffn_inner_dim=256,
        dropout=0.3, attention_dropout=0.3, ffn_dropout=0.3,
        share_embeddings=opennmt.models.EmbeddingsSharingLevel.ALL,
        pre_norm=True)
"""
    else:
        gru = family.name == "rnn_gru_bahdanau"
        cell = "tf.keras.layers.GRUCell" if gru else "tf.keras.layers.LSTMCell"
        attention = "tfa.seq2seq.BahdanauAttention" if gru else "tfa.seq2seq.LuongAttention"
        decoder_units = 256 if gru else 512
        body = f"""
    return opennmt.models.SequenceToSequence(
        source_inputter=opennmt.inputters.WordEmbedder(embedding_size=256),
        target_inputter=opennmt.inputters.WordEmbedder(embedding_size=256),
        encoder=opennmt.encoders.RNNEncoder(
            num_layers=1, num_units=512, bidirectional=True, dropout=0.2,
            reducer=opennmt.layers.ConcatReducer(), cell_class={cell}),
        decoder=opennmt.decoders.AttentionalRNNDecoder(
            num_layers=1, num_units={decoder_units}, bridge_class=opennmt.layers.DenseBridge,
            attention_mechanism_class={attention},
            cell_class={cell}, dropout=0.2))
"""
    path.write_text(
        "import opennmt\nimport tensorflow as tf\nimport tensorflow_addons as tfa\n\n\n"
        f"def model():{body}",
        encoding="utf-8",
    )
    return path


# What OpenNMT-tf's catalog gives its RNN models (`_RNNBase.auto_config`); a model defined in a
# file gets nothing (its Transformer's auto_config is used as it stands).
OPENNMT_TF_RNN_PARAMS = {"optimizer": "Adam", "learning_rate": 0.0002}


def opennmt_tf_files(family, root, workdir, train, params=None):
    models = vocabulary_models(family, root)
    vocabularies = opennmt_vocabularies(family, root)
    paths = data_paths(root)
    batch_type, batch_size = next(iter(family.batch.items()))
    tokenization = {
        side: {"type": "OpenNMTTokenizer",
               "params": {"mode": "none", "sp_model_path": str(models[side])}}
        for side in ("source", "target")
    }  # fmt: skip
    config = {
        "model_dir": str(workdir / "model"),
        "data": {
            "train_features_file": str(paths["train"][SOURCE]),
            "train_labels_file": str(paths["train"][TARGET]),
            "eval_features_file": str(paths["valid"][SOURCE]),
            "eval_labels_file": str(paths["valid"][TARGET]),
            "source_vocabulary": str(vocabularies["source"]),
            "target_vocabulary": str(vocabularies["target"]),
            "source_tokenization": tokenization["source"],
            "target_tokenization": tokenization["target"],
        },
        "params": {
            "beam_width": BEAM_SIZE,
            **({} if family.name == "transformer" else OPENNMT_TF_RNN_PARAMS),
            **(params or {}),
        },
        "train": {
            "batch_type": "tokens" if batch_type == "tokens" else "examples",
            "batch_size": batch_size,
            "effective_batch_size": None,
            "maximum_features_length": family.max_length,
            "maximum_labels_length": family.max_length,
            "average_last_checkpoints": OPENNMT_TF_AVERAGED,
            "keep_checkpoint_max": OPENNMT_TF_AVERAGED,
            **train,
        },
        "eval": {"steps": None},
        "infer": {"batch_size": 32},
    }
    return (write_yaml(workdir / "data.yml", config),
            opennmt_tf_model_file(family, workdir / "model.py"))  # fmt: skip


def opennmt_tf_command(root, workdir, config, model, *task):
    return [PEERS["opennmt-tf"].bin(root, "onmt-main"), "--config", config, "--auto_config",
            "--model", model, *task]  # fmt: skip


def opennmt_tf_speed_commands(family, root, workdir, steps, window):
    config, model = opennmt_tf_files(
        family, root, workdir,
        {"max_step": steps, "save_summary_steps": window, "save_checkpoints_steps": 10 * steps},
    )  # fmt: skip
    return [opennmt_tf_command(root, workdir, config, model, "train")]


def opennmt_tf_windows(log_text):
    found = re.findall(r"Step = \d+ ; steps/s = ([\d.]+), tokens/s = \d+ \(\d+ source, "
                       r"(\d+) target\)", log_text)  # fmt: skip
    return [(float(tokens), float(steps)) for steps, tokens in found]


def opennmt_py_files(family, root, workdir, train):
    models = vocabulary_models(family, root)
    paths = data_paths(root)
    batch_type, batch_size = next(iter(family.batch.items()))
    if family.name == "transformer":
        model = {
            "encoder_type": "transformer", "decoder_type": "transformer", "enc_layers": 4,
            "dec_layers": 4, "heads": 4, "hidden_size": 128, "word_vec_size": 128,
            "transformer_ff": 256, "position_encoding": True, "dropout": [0.3],
            "attention_dropout": [0.3], "share_vocab": True, "share_embeddings": True,
            "share_decoder_embeddings": True,
        }  # fmt: skip
    else:
        gru = family.name == "rnn_gru_bahdanau"
        model = {
            "encoder_type": "brnn", "decoder_type": "rnn", "rnn_type": "GRU" if gru else "LSTM",
            "enc_layers": 1, "dec_layers": 1, "hidden_size": 512, "word_vec_size": 256,
            "global_attention": "mlp" if gru else "general", "input_feed": 0 if gru else 1,
            "bridge": True, "dropout": [0.2],
        }  # fmt: skip
    transforms = ["sentencepiece", "filtertoolong"]
    config = {
        "save_data": str(workdir / "data"),
        "src_vocab": str(workdir / "vocab.src"),
        "tgt_vocab": str(workdir / "vocab.tgt"),
        "src_vocab_size": family.vocab_size,
        "tgt_vocab_size": family.vocab_size,
        "overwrite": True,
        "data": {
            "corpus_1": {
                "path_src": str(paths["train"][SOURCE]),
                "path_tgt": str(paths["train"][TARGET]),
                "transforms": transforms,
            },
            "valid": {
                "path_src": str(paths["valid"][SOURCE]),
                "path_tgt": str(paths["valid"][TARGET]),
                "transforms": transforms,
            },
        },  # fmt: skip
        "src_subword_type": "sentencepiece",
        "tgt_subword_type": "sentencepiece",
        "src_subword_model": str(models["source"]),
        "tgt_subword_model": str(models["target"]),
        "src_seq_length": family.max_length,
        "tgt_seq_length": family.max_length,
        "bucket_size": 32768,  # the default loops a 29k-line corpus ~9 times at start-up
        "batch_type": "tokens" if batch_type == "tokens" else "sents",
        "batch_size": batch_size,
        "save_model": str(workdir / "model" / "model"),
        "seed": 1234,
        **model,
        **train,
    }
    return write_yaml(workdir / "config.yaml", config)


def opennmt_py_speed_commands(family, root, workdir, steps, window):
    config = opennmt_py_files(
        family, root, workdir,
        {"train_steps": steps, "report_every": window, "save_checkpoint_steps": 10 * steps,
         "valid_steps": 10 * steps, **OPENNMT_PY_SCHEDULES[family.name]},
    )  # fmt: skip
    return opennmt_py_commands(root, config)


def opennmt_py_commands(root, config):
    """Its vocabulary counted on the tokenised corpus (not timed), then its training."""
    peer = PEERS["opennmt-py"]
    return [
        [peer.bin(root, "onmt_build_vocab"), "-config", config, "-n_sample", "-1"],
        [peer.bin(root, "onmt_train"), "-config", config],
    ]


def opennmt_py_windows(log_text):
    """Its report lines give the window's tokens/s and the seconds since training began."""
    found = re.findall(r"Step\s+(\d+)/\s*\d+;.*?\d+/\s*(\d+) tok/s;\s+(\d+) sec", log_text)
    windows, last_step, last_second = [], 0, 0
    for step, tokens, second in found:
        step, second = int(step), int(second)
        windows.append((float(tokens), (step - last_step) / max(second - last_second, 1)))
        last_step, last_second = step, second
    return windows


# The schedules each documentation recommends for the model (OpenNMT-py's FAQ "How do I
# use the Transformer model?", its RNN defaults otherwise).
OPENNMT_PY_SCHEDULES = {
    "transformer": {
        "optim": "adam", "adam_beta2": 0.998, "decay_method": "noam", "learning_rate": 2.0,
        "warmup_steps": 8000, "max_grad_norm": 0.0, "label_smoothing": 0.1,
        "param_init": 0.0, "param_init_glorot": True, "normalization": "tokens",
    },
    "rnn_gru_bahdanau": {"optim": "adam", "learning_rate": 0.002, "max_grad_norm": 5.0,
                         "label_smoothing": 0.1},
    "rnn_lstm_luong": {"optim": "adam", "learning_rate": 0.002, "max_grad_norm": 5.0,
                       "label_smoothing": 0.1},
}  # fmt: skip


@dataclass(frozen=True)
class Toolkit:
    name: str
    speed_commands: object  # (family, root, workdir, steps, window) -> commands, the last timed
    windows: object  # log text -> target tokens/s of each window


TOOLKIT_RUNS = {
    "ours": Toolkit("ours", ours_speed_commands, ours_windows),
    **{
        variant: Toolkit(
            variant,
            lambda *args, variant=variant: ours_speed_commands(*args, variant=variant),
            ours_windows,
        )
        for variant in OUR_VARIANTS
    },
    "opennmt-tf": Toolkit("opennmt-tf", opennmt_tf_speed_commands, opennmt_tf_windows),
    "opennmt-py": Toolkit("opennmt-py", opennmt_py_speed_commands, opennmt_py_windows),
}


def environment(toolkit, threads):
    if toolkit not in PEERS:
        return our_environment()
    env = {**os.environ, "TF_CPP_MIN_LOG_LEVEL": "2", "TORCH_FORCE_NO_WEIGHTS_ONLY_LOAD": "1"}
    if toolkit == "opennmt-py":
        env.update(OMP_NUM_THREADS=str(threads), MKL_NUM_THREADS=str(threads))
    return env


# --- speed ---------------------------------------------------------------------------------


def speed(root, families, threads_list, rounds, steps, window, toolkits=SPEED_TOOLKITS):
    for family in families:
        build_vocabularies(family, root)
        for threads in threads_list:
            for index in range(rounds):
                for toolkit in toolkits:
                    run_speed(root, family, toolkit, threads, index, steps, window)


def run_speed(root, family, toolkit, threads, index, steps, window):
    keys = ["speed", family.name, f"{threads} threads", toolkit, f"round {index + 1}"]
    node = load_results(root)
    for key in keys:
        node = node.get(key, {}) if isinstance(node, dict) else {}
    if node:
        return
    workdir = root / "speed" / family.name / f"{toolkit}-{threads}t-{index + 1}"
    shutil.rmtree(workdir, ignore_errors=True)  # from scratch: ours would resume
    workdir.mkdir(parents=True)
    runner = TOOLKIT_RUNS[toolkit]
    *preparations, training = runner.speed_commands(family, root, workdir, steps, window)
    env = environment(toolkit, threads)
    for command in preparations:
        checked(pinned(command, threads), workdir / "prepare.log", env=env)
    started = time.perf_counter()
    checked(pinned(training, threads), workdir / "train.log", env=env)
    windows = speed_windows(runner, workdir)
    result = {"windows": [tokens for tokens, _ in windows],
              "steady": statistics.median(tokens for tokens, _ in windows[1:]),
              "seconds": time.perf_counter() - started}  # fmt: skip
    save_result(root, keys, result)
    print(f"{family.name}, {threads} threads, {toolkit}, round {index + 1}: "
          f"{result['steady']:,.0f} target tokens/s", flush=True)  # fmt: skip


def speed_windows(runner, workdir):
    """A speed run's (target tokens/s, steps/s) windows, from its log."""
    log = workdir / "train.log"
    windows = runner.windows(log.read_text(encoding="utf-8", errors="replace"))
    if len(windows) < 2:
        sys.exit(f"{runner.name}: fewer than 2 windows in {log}")
    return windows


def steady_steps_per_second(root, family, toolkit, threads):
    """The median steps/s of the toolkit's speed runs at `threads`, first windows left out."""
    runs = sorted((root / "speed" / family.name).glob(f"{toolkit}-{threads}t-*"))
    rates = [steps for run in runs
             for _, steps in speed_windows(TOOLKIT_RUNS[toolkit], run)[1:]]  # fmt: skip
    if not rates:
        sys.exit(f"no {threads}-thread speed run of {toolkit} on {family.name}: run `speed` first")
    return statistics.median(rates)


# --- quality -------------------------------------------------------------------------------


def quality(root, families, minutes, threads, toolkits=TOOLKITS):
    """Each toolkit in turn, in the order of `toolkits`: the peers stop at a step count, so
    only our run, which stops at a time, needs the machine to itself."""
    for family in families:
        build_vocabularies(family, root)
        for toolkit in toolkits:
            if toolkit == f"opennmt-py{FITTED}" and family is not TRANSFORMER:
                print(f"{family.name}, {toolkit}: its schedule is the recipe's already")
                continue
            keys = ["quality", family.name, toolkit]
            if load_results(root).get("quality", {}).get(family.name, {}).get(toolkit):
                print(f"{family.name}, {toolkit}: trained and scored before, skipped")
                continue
            workdir = root / "quality" / family.name / toolkit
            started = time.perf_counter()
            QUALITY_RUNS[toolkit](family, root, workdir, minutes * 60, threads)
            seconds = time.perf_counter() - started
            scores = {split: score_translations(
                          workdir.joinpath(f"{split}.translations").read_text(
                              encoding="utf-8").splitlines(),
                          data_paths(root)[split][TARGET].read_text(
                              encoding="utf-8").splitlines())
                      for split in ("valid", "test")}  # fmt: skip
            save_result(root, keys, {"training_and_translation_seconds": seconds, **scores})
            print(f"{family.name}, {toolkit}: test BLEU {scores['test']['bleu']:.2f} "
                  f"(lowercased {scores['test']['bleu_lowercase']:.2f}), "
                  f"chrF {scores['test']['chrf']:.2f}", flush=True)  # fmt: skip


def training_steps(root, family, toolkit, seconds, threads):
    """The steps a peer trains in `seconds` at its speed run's steady pace: the peers stop at
    a step count (killed in mid-run they would keep no checkpoint, and OpenNMT-tf would not
    average)."""
    return max(1, round(seconds * steady_steps_per_second(root, family, toolkit, threads)))


def ours_quality(family, root, workdir, seconds, threads, variant=None):
    """Our recipe (with `variant`'s settings) within a training-time budget
    (`train.time_budget_hours`), its epochs no limit; then beam 5 on both splits."""
    if not (workdir / "model.keras").exists():
        config = ours_files(family, root, workdir, {
            "train": {"time_budget_hours": seconds / 3600, "epochs": 1000,
                      **OUR_VARIANTS.get(variant, {}).get("train", {})}})  # fmt: skip
        checked(pinned([sys.executable, "-m", "pipeline.train", "--config", config,
                        "--workdir", workdir], threads),
                workdir / "train.log", env=our_environment())  # fmt: skip
    for split in ("valid", "test"):
        checked(pinned([sys.executable, "-m", "pipeline.translate", "--workdir", workdir,
                        "--input", data_paths(root)[split][SOURCE], "--beam-size", BEAM_SIZE,
                        "--output", workdir / f"{split}.translations"], threads),
                workdir / "translate.log", env=our_environment())  # fmt: skip


def opennmt_tf_quality(family, root, workdir, seconds, threads, fitted=False):
    """`train` for the steps of `seconds` (auto_config, or with `fitted`, its schedule
    replaced by `fitted_schedule`; it averages its last 8 checkpoints at the end), then
    `infer` with the average, beam 5, detokenised by its own tokenizer."""
    steps = training_steps(root, family, "opennmt-tf", seconds, threads)
    config, model = opennmt_tf_files(family, root, workdir, {
        "max_step": steps, "save_summary_steps": 100,
        "save_checkpoints_steps": max(1, steps // QUALITY_CHECKPOINTS)},
        fitted_schedule(family, "opennmt-tf") if fitted else {})  # fmt: skip
    env = environment("opennmt-tf", threads)
    average = opennmt_tf_average(workdir)
    if not average.exists():
        checked(pinned(opennmt_tf_command(root, workdir, config, model, "train"), threads),
                workdir / "train.log", env=env)  # fmt: skip
    for split in ("valid", "test"):
        task = ["--checkpoint_path", average, "infer",
                "--features_file", data_paths(root)[split][SOURCE],
                "--predictions_file", workdir / f"{split}.translations"]  # fmt: skip
        checked(pinned(opennmt_tf_command(root, workdir, config, model, *task), threads),
                workdir / "translate.log", env=env)  # fmt: skip


def opennmt_py_quality(family, root, workdir, seconds, threads, fitted=False):
    """`onmt_train` for the steps of `seconds` (its FAQ's schedule, or with `fitted`,
    `fitted_schedule`), then `onmt_translate` with its last checkpoint, beam 5, on
    SentencePiece pieces (decoded here)."""
    steps = training_steps(root, family, "opennmt-py", seconds, threads)
    config = opennmt_py_files(family, root, workdir, {
        "train_steps": steps, "report_every": 100, "valid_steps": 10 * steps,
        "save_checkpoint_steps": max(1, steps // QUALITY_CHECKPOINTS),
        **OPENNMT_PY_SCHEDULES[family.name],
        **(fitted_schedule(family, "opennmt-py") if fitted else {})})  # fmt: skip
    env = environment("opennmt-py", threads)
    checkpoint = workdir / "model" / f"model_step_{steps}.pt"
    if not checkpoint.exists():
        for command in opennmt_py_commands(root, config):
            checked(pinned(command, threads), workdir / "train.log", env=env)
    system = OpenNMTPySystem(root, checkpoint, vocabulary_models(family, root), threads,
                             log=workdir / "translate.log")  # fmt: skip
    for split in ("valid", "test"):
        sources = data_paths(root)[split][SOURCE].read_text(encoding="utf-8").splitlines()
        translations, _ = system.translate(sources, 32, BEAM_SIZE)
        workdir.joinpath(f"{split}.translations").write_text(
            "".join(t + "\n" for t in translations), encoding="utf-8"
        )


def fitted_schedule(family, toolkit):
    """Our recipe's schedule in the peer's terms, for a run as short as the quality budget.
    The Transformer: the documented warm-up (8,000 steps) outlasts such a run. Noam's rate
    (Vaswani et al., 2017), scale * model_dim^-0.5 * min(step^-0.5, step * warmup^-1.5),
    is our inverse_sqrt schedule when scale = peak * sqrt(model_dim * warmup); Adam's beta2
    and the gradient clipping are ours too. The recurrent families: OpenNMT-tf's catalog rate
    (2e-4) is made for runs of hundreds of thousands of steps; ours is Adam at the recipe's
    rate, decayed exponentially (decay_rate ** (step / decay_steps)), with its clipping and
    label smoothing, which OpenNMT-py's defaults already match."""
    recipe = yaml.safe_load((PROJECT_ROOT / family.recipe).read_text(encoding="utf-8"))
    train = recipe["train"]
    if family is not TRANSFORMER:  # OpenNMT-tf's; OpenNMT-py's is the recipe's already
        return {"optimizer": "Adam", "learning_rate": train["learning_rate"],
                "decay_type": "ExponentialDecay",
                "decay_params": {"decay_rate": train["decay_rate"],
                                 "decay_steps": train["decay_steps"]},
                "clip_gradients": train["clip_norm"],
                "label_smoothing": train["label_smoothing"]}  # fmt: skip
    model_dim = recipe["model"]["model_dim"]
    warmup, peak = train["warmup_steps"], train["learning_rate"]
    scale = peak * (model_dim * warmup) ** 0.5
    if toolkit == "opennmt-tf":
        return {"learning_rate": scale, "clip_gradients": train["clip_norm"],
                "decay_params": {"model_dim": model_dim, "warmup_steps": warmup},
                "optimizer_params": {"beta_1": 0.9, "beta_2": 0.999}}  # fmt: skip
    return {"learning_rate": scale, "warmup_steps": warmup, "adam_beta2": 0.999,
            "max_grad_norm": train["clip_norm"]}  # fmt: skip


QUALITY_CHECKPOINTS = 20  # the peers' checkpoints in a quality run: OpenNMT-tf averages the last 8
FITTED = "-fitted"  # a peer's quality run with `fitted_schedule`
QUALITY_RUNS = {"ours": ours_quality, "opennmt-tf": opennmt_tf_quality,
                "opennmt-py": opennmt_py_quality}  # fmt: skip
QUALITY_RUNS.update({
    peer + FITTED: lambda *args, run=QUALITY_RUNS[peer]: run(*args, fitted=True)
    for peer in PEERS
})  # fmt: skip
QUALITY_RUNS.update({
    variant: lambda *args, variant=variant: ours_quality(*args, variant=variant)
    for variant in OUR_VARIANTS
})  # fmt: skip
QUALITY_TOOLKITS = tuple(QUALITY_RUNS)


# --- inference ---------------------------------------------------------------------------


def our_export(family, root, toolkit="ours"):
    """The export directory of our quality model (`toolkit`: ours or one of `OUR_VARIANTS`),
    exported once (`python -m export`): ONNX, and CTranslate2 for the Transformer
    (CTranslate2 runs no recurrent model)."""
    ours = root / "quality" / family.name / toolkit
    formats = ["onnx", "ctranslate2"] if family is TRANSFORMER else ["onnx"]
    if not all((ours / "export" / kind).exists() for kind in formats):
        checked([sys.executable, "-m", "export", "--workdir", ours,
                 "--formats", ",".join(formats)], ours / "export.log",
                env=our_environment())  # fmt: skip
    return ours / "export"


def opennmt_tf_average(workdir):
    """Where an OpenNMT-tf run keeps the mean of its last checkpoints."""
    return workdir / "model" / "avg"


def opennmt_py_checkpoint(workdir):
    """The last checkpoint of an OpenNMT-py run, or None."""
    checkpoints = list((workdir / "model").glob("model_step_*.pt"))
    return max(checkpoints, key=lambda p: int(p.stem.rsplit("_", 1)[1]), default=None)


def ctranslate2_models(family, root):
    """{system: CTranslate2 model directory}: ours (`python -m export --formats ctranslate2`)
    and each peer's quality model that was trained, converted by the peer's own converter."""
    quality_dir = root / "quality" / family.name
    models = {"ours": our_export(family, root) / "ctranslate2"}
    for toolkit in QUALITY_TOOLKITS:
        workdir = quality_dir / toolkit
        if toolkit.startswith("opennmt-tf") and opennmt_tf_average(workdir).exists():
            if not (workdir / "ctranslate2").exists():
                task = ["--checkpoint_path", opennmt_tf_average(workdir), "export", "--output_dir",
                        workdir / "ctranslate2", "--format", "ctranslate2"]  # fmt: skip
                checked(opennmt_tf_command(root, workdir, workdir / "data.yml",
                                           workdir / "model.py", *task),
                        workdir / "export.log", env=environment("opennmt-tf", 2))  # fmt: skip
            models[toolkit] = workdir / "ctranslate2"
        checkpoint = opennmt_py_checkpoint(workdir)
        if toolkit.startswith("opennmt-py") and checkpoint:
            if not (workdir / "ctranslate2").exists():
                convert = [PEERS["opennmt-py"].bin(root, "ct2-opennmt-py-converter"),
                           "--model_path", checkpoint,
                           "--output_dir", workdir / "ctranslate2"]  # fmt: skip
                checked(convert, workdir / "export.log", env=environment("opennmt-py", 2))
            models[toolkit] = workdir / "ctranslate2"
    return models


class CTranslate2System:
    """A CTranslate2 model on SentencePiece pieces, at a batch size and compute type."""

    def __init__(self, directory, models, compute_type, threads):
        import ctranslate2
        import sentencepiece

        self.translator = ctranslate2.Translator(
            str(directory), device="cpu", compute_type=compute_type, intra_threads=threads
        )
        self.source = sentencepiece.SentencePieceProcessor(model_file=str(models["source"]))
        self.target = sentencepiece.SentencePieceProcessor(model_file=str(models["target"]))

    def translate(self, sentences, batch_size, beam_size):
        """(translations, seconds)."""
        started = time.perf_counter()
        results = self.translator.translate_batch(
            self.source.encode(sentences, out_type=str), max_batch_size=batch_size,
            beam_size=beam_size, max_decoding_length=256,
        )  # fmt: skip
        translations = [self.target.decode_pieces(r.hypotheses[0]) for r in results]
        return translations, time.perf_counter() - started


class OnnxSystem:
    """Our ONNX export in ONNX Runtime (`export.runtime.OnnxTranslator`)."""

    def __init__(self, export, int8, threads):
        from export.runtime import OnnxTranslator

        self.translators = {}
        self.make = lambda batch_size: OnnxTranslator(
            export, intra_op_threads=threads, batch_size=batch_size, int8=int8
        )

    def translate(self, sentences, batch_size, beam_size):
        """(translations, seconds)."""
        if batch_size not in self.translators:
            self.translators[batch_size] = self.make(batch_size)
        started = time.perf_counter()
        translations = self.translators[batch_size].translate(sentences, beam_size=beam_size)
        return translations, time.perf_counter() - started


class OpenNMTPySystem:
    """OpenNMT-py's own `onmt_translate` on a checkpoint (its deployment path for a recurrent
    model, which CTranslate2 cannot run), on SentencePiece pieces; the seconds are those it
    reports for its translation loop (`-report_time`), without its start-up and loading.
    `log`: a file its output is added to (default: none kept)."""

    def __init__(self, root, checkpoint, models, threads, log=None):
        import sentencepiece

        self.root, self.checkpoint, self.threads, self.log = root, checkpoint, threads, log
        self.source = sentencepiece.SentencePieceProcessor(model_file=str(models["source"]))
        self.target = sentencepiece.SentencePieceProcessor(model_file=str(models["target"]))

    def translate(self, sentences, batch_size, beam_size):
        """(translations, seconds)."""
        with tempfile.TemporaryDirectory() as scratch:
            pieces, output = Path(scratch) / "src", Path(scratch) / "out"
            pieces.write_text("".join(" ".join(self.source.encode(s, out_type=str)) + "\n"
                                      for s in sentences), encoding="utf-8")  # fmt: skip
            command = [PEERS["opennmt-py"].bin(self.root, "onmt_translate"), "-model",
                       self.checkpoint, "-src", pieces, "-output", output, "-beam_size",
                       beam_size, "-batch_size", batch_size, "-report_time"]  # fmt: skip
            log = self.log or Path(scratch) / "log"
            checked(pinned(command, self.threads), log,
                    env=environment("opennmt-py", self.threads))  # fmt: skip
            per_sentence_ms = re.findall(r"Average translation time \(ms\): ([\d.]+)",
                                         log.read_text(encoding="utf-8"))  # fmt: skip
            lines = output.read_text(encoding="utf-8").splitlines()
            translations = [self.target.decode(line.split()) for line in lines]
        return translations, float(per_sentence_ms[-1]) * len(sentences) / 1000


class OpenNMTTfSystem:
    """OpenNMT-tf's own `infer` on the averaged checkpoint of a quality run (its deployment
    path for a recurrent model, which CTranslate2 cannot run); the seconds are those it
    reports for its prediction loop (`--log_prediction_time`), without its start-up and
    loading but with the tracing of its graph at the first batch."""

    def __init__(self, root, workdir, threads):
        self.root, self.workdir, self.threads = root, workdir, threads

    def translate(self, sentences, batch_size, beam_size):
        """(translations, seconds)."""
        with tempfile.TemporaryDirectory() as scratch:
            source, output = Path(scratch) / "src", Path(scratch) / "out"
            source.write_text("".join(s + "\n" for s in sentences), encoding="utf-8")
            search = write_yaml(
                Path(scratch) / "search.yml",
                {"params": {"beam_width": beam_size}, "infer": {"batch_size": batch_size}},
            )
            command = [PEERS["opennmt-tf"].bin(self.root, "onmt-main"), "--config",
                       self.workdir / "data.yml", search, "--auto_config", "--model",
                       self.workdir / "model.py", "--checkpoint_path",
                       opennmt_tf_average(self.workdir), "infer", "--features_file", source,
                       "--predictions_file", output, "--log_prediction_time"]  # fmt: skip
            log = Path(scratch) / "log"
            checked(pinned(command, self.threads), log,
                    env=environment("opennmt-tf", self.threads))  # fmt: skip
            seconds = re.findall(r"Total prediction time \(s\): ([\d.]+)",
                                 log.read_text(encoding="utf-8"))  # fmt: skip
            translations = output.read_text(encoding="utf-8").splitlines()
        return translations, float(seconds[-1])


def inference_systems(family, root, threads, toolkits=None):
    """{name: system} of the family's quality models that were trained, by each toolkit's
    fastest deployment path: ours and our variants' in ONNX Runtime (float32, int8) and, for
    the Transformer, every model through CTranslate2 (float32, int8); a recurrent OpenNMT-py
    model through its own `onmt_translate`, a recurrent OpenNMT-tf model through its own
    `infer`. `toolkits` (default: all) limits them to those toolkits' models."""

    def wanted(toolkit):
        return toolkits is None or toolkit in toolkits

    models = vocabulary_models(family, root)
    systems = {}
    for toolkit in ("ours", *OUR_VARIANTS):
        trained = (root / "quality" / family.name / toolkit / "model.keras").exists()
        if wanted(toolkit) and trained:
            onnx = our_export(family, root, toolkit) / "onnx"
            systems[f"{toolkit}, ONNX Runtime float32"] = OnnxSystem(onnx, False, threads)
            systems[f"{toolkit}, ONNX Runtime int8"] = OnnxSystem(onnx, True, threads)
    if family is TRANSFORMER:
        for toolkit, path in ctranslate2_models(family, root).items():
            if wanted(toolkit):
                for kind in ("float32", "int8"):
                    systems[f"{toolkit}, CTranslate2 {kind}"] = CTranslate2System(
                        path, models, kind, threads
                    )
        return systems
    for toolkit in QUALITY_TOOLKITS:
        workdir = root / "quality" / family.name / toolkit
        checkpoint = opennmt_py_checkpoint(workdir)
        if toolkit.startswith("opennmt-py") and checkpoint and wanted(toolkit):
            systems[f"{toolkit}, onmt_translate"] = OpenNMTPySystem(
                root, checkpoint, models, threads
            )
        averaged = opennmt_tf_average(workdir).is_dir()
        if toolkit.startswith("opennmt-tf") and averaged and wanted(toolkit):
            systems[f"{toolkit}, infer"] = OpenNMTTfSystem(root, workdir, threads)
    return systems


def inference(root, family, sentences_count, rounds, threads, toolkits=None):
    """Each system translates the same test sentences at batch 1 and 64, greedy and beam 5,
    the systems taking turns in each round; sentences/s (median of the rounds) and BLEU.
    `toolkits` (default: all) limits the systems to those toolkits' models; rows measured
    before for other systems are kept."""
    os.sched_setaffinity(0, range(threads))
    systems = inference_systems(family, root, threads, toolkits)
    keys = ["inference", family.name, f"{threads} threads"]
    kept = [row for row in load_results(root).get("inference", {}).get(family.name, {})
            .get(f"{threads} threads", []) if row["system"] not in systems]  # fmt: skip
    paths = data_paths(root)["test"]
    sources = paths[SOURCE].read_text(encoding="utf-8").splitlines()[:sentences_count]
    references = paths[TARGET].read_text(encoding="utf-8").splitlines()[:sentences_count]
    settings = [(batch, beam) for batch in (1, 64) for beam in (1, BEAM_SIZE)]
    rates = {(name, *setting): [] for name in systems for setting in settings}
    scores, words = {}, {}

    def measure(name, system, batch, beam):
        system.translate(sources[:batch], batch, beam)  # warm-up
        hypotheses, seconds = system.translate(sources, batch, beam)
        rates[name, batch, beam].append(len(sources) / seconds)
        scores[name, batch, beam] = score_translations(hypotheses, references)
        words[name, batch, beam] = sum(len(h.split()) for h in hypotheses) / len(hypotheses)
        rows = [  # saved after each measurement: a stopped run keeps what it measured
            {"system": name, "batch": batch, "beam": beam, "sentences_per_s": rate,
             "bleu": scores[name, batch, beam]["bleu"],
             "bleu_lowercase": scores[name, batch, beam]["bleu_lowercase"],
             "words_per_translation": words[name, batch, beam]}
            for (name, batch, beam), rate in rates.items() if rate
        ]  # fmt: skip
        save_result(root, keys, kept + rows)

    alternate(rounds, {  # within a round, the systems take turns at each batch size and beam
        (name, batch, beam): functools.partial(measure, name, system, batch, beam)
        for batch, beam in settings for name, system in systems.items()
    })  # fmt: skip


# --- report --------------------------------------------------------------------------------


def report(root):
    results = load_results(root)
    for family, by_threads in results.get("speed", {}).items():
        print(f"\n### {family}: training target tokens/s (steady state, median of windows)\n")
        ours = ("ours", *OUR_VARIANTS)
        pairs = [(o, p) for o in ours for p in PEERS]
        print("| threads | " + " | ".join(SPEED_TOOLKITS) + " | " +
              " | ".join(f"{o} / {p}" for o, p in pairs) + " |")  # fmt: skip
        print("|---" * (1 + len(SPEED_TOOLKITS) + len(pairs)) + "|")
        for threads, by_toolkit in by_threads.items():
            medians, cells = {}, []
            for toolkit in SPEED_TOOLKITS:
                runs = [r["steady"] for r in by_toolkit.get(toolkit, {}).values()]
                medians[toolkit] = statistics.median(runs) if runs else None
                cells.append(", ".join(f"{r:,.0f}" for r in runs) or "-")
            ratios = [
                f"{medians[o] / medians[p]:.2f}x" if medians[o] and medians[p] else "-"
                for o, p in pairs
            ]
            print(f"| {threads} | " + " | ".join(cells) + " | " + " | ".join(ratios) + " |")
    for family, by_toolkit in results.get("quality", {}).items():
        print(f"\n### {family}: equal training time, beam {BEAM_SIZE}\n")
        print("| toolkit | test BLEU | lowercased | chrF | validation BLEU |")
        print("|---|---:|---:|---:|---:|")
        for toolkit, result in by_toolkit.items():
            test, valid = result["test"], result["valid"]
            print(f"| {toolkit} | {test['bleu']:.2f} | {test['bleu_lowercase']:.2f} | "
                  f"{test['chrf']:.2f} | {valid['bleu']:.2f} |")  # fmt: skip
    for family, by_threads in results.get("inference", {}).items():
        for threads, rows in by_threads.items():
            print(f"\n### {family}: translating test_2016_flickr, {threads}\n")
            print("| system | batch | beam | sentences/s (each round) | median | BLEU | words |")
            print("|---|---:|---:|---|---:|---:|---:|")
            for row in rows:
                each = ", ".join(f"{r:,.1f}" for r in row["sentences_per_s"])
                median = statistics.median(row["sentences_per_s"])
                print(f"| {row['system']} | {row['batch']} | {row['beam']} | {each} | "
                      f"{median:,.1f} | {row['bleu']:.2f} | "
                      f"{row.get('words_per_translation', 0):.1f} |")  # fmt: skip


def main(argv=None):
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--root", type=Path, default=PROJECT_ROOT / "runs" / "peer_toolkits")
    sub = parser.add_subparsers(dest="command", required=True)
    sub.add_parser("setup", help="install the peers, build the vocabularies")
    speed_parser = sub.add_parser("speed", help="training throughput, toolkits in turn")
    speed_parser.add_argument("--families", nargs="+", default=list(FAMILIES), choices=FAMILIES)
    speed_parser.add_argument("--threads", nargs="+", type=int, default=[1, 2])
    speed_parser.add_argument("--rounds", type=int, default=2)
    speed_parser.add_argument("--steps", type=int, default=300)
    speed_parser.add_argument("--window", type=int, default=50)
    speed_parser.add_argument(
        "--toolkits",
        nargs="+",
        default=list(SPEED_TOOLKITS),
        choices=SPEED_TOOLKITS,
        help="the order they take turns in",
    )
    quality_parser = sub.add_parser("quality", help="BLEU after equal training time")
    quality_parser.add_argument("--families", nargs="+", default=list(FAMILIES), choices=FAMILIES)
    quality_parser.add_argument("--minutes", type=float, default=30)
    quality_parser.add_argument("--threads", type=int, default=2)
    quality_parser.add_argument("--toolkits", nargs="+", default=list(TOOLKITS),
                                choices=QUALITY_TOOLKITS,
                                help=f"the order they train in ({FITTED}: the peer with our "
                                     "recipe's schedule; for the recurrent families, "
                                     "OpenNMT-tf only)")  # fmt: skip
    inference_parser = sub.add_parser("inference", help="translation speed of quality's models")
    inference_parser.add_argument("--family", default="transformer", choices=FAMILIES)
    inference_parser.add_argument("--sentences", type=int, default=1000)
    inference_parser.add_argument("--rounds", type=int, default=2)
    inference_parser.add_argument("--threads", type=int, default=2)
    inference_parser.add_argument("--toolkits", nargs="+", choices=QUALITY_TOOLKITS,
                                  help="only their models (default: all trained)")  # fmt: skip
    sub.add_parser("report", help="print the tables of results.json")
    args = parser.parse_args(argv)
    root = args.root.resolve()
    root.mkdir(parents=True, exist_ok=True)
    if args.command == "setup":
        install_peers(root)
        for family in FAMILIES.values():
            build_vocabularies(family, root)
    elif args.command == "speed":
        install_peers(root, args.toolkits)
        speed(root, [FAMILIES[f] for f in args.families], args.threads, args.rounds,
              args.steps, args.window, args.toolkits)  # fmt: skip
        report(root)
    elif args.command == "quality":
        install_peers(root, args.toolkits)
        quality(root, [FAMILIES[f] for f in args.families], args.minutes, args.threads,
                args.toolkits)  # fmt: skip
        report(root)
    elif args.command == "inference":
        inference(
            root, FAMILIES[args.family], args.sentences, args.rounds, args.threads, args.toolkits
        )
        report(root)
    elif args.command == "report":
        report(root)


if __name__ == "__main__":
    main()
