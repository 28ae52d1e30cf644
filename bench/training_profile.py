"""Where a training step's time goes: TensorFlow's profiler over a few steps, summed by op type
and by the part of the model each op belongs to.

    python bench/training_profile.py [--config configs/default.yaml] [--steps 20]
                                     [--set SECTION.KEY=VALUE ...] [--vocab-from WORKDIR]
                                     [--top 25]

Trains a fresh model in a temporary work directory for 10 warm-up steps and `--steps` profiled
ones (`train.profile_steps`), then reads the trace with xprof (`pip install xprof`, not a
dependency of the toolkit) and prints self-time shares: per op type, per model part (the first
names of the op's Keras scope: encoder, decoder, output projection, optimizer...) and the
`--top` single ops. `--vocab-from` reuses a trained work directory's vocabularies, skipping
SentencePiece. Run it alone on the machine; shares are comparable between runs, times less so.
"""

import argparse
import collections
import glob
import json
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")
os.environ.setdefault("GLOG_minloglevel", "2")  # xprof's conversion chatter

PROJECT_ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(PROJECT_ROOT))

from pipeline.training.trainer import PROFILE_AFTER  # noqa: E402
from pipeline.workdir import LOG_DIR  # noqa: E402

# Op-name scopes that say nothing about the model part.
NOISE_SCOPES = {"", "functional", "while", "body", "cond", "StatefulPartitionedCall", "gradients"}


def profile(config, steps, settings, vocab_from, workdir):
    if vocab_from:
        shutil.copytree(Path(vocab_from) / "vocab", workdir / "vocab")
    command = [sys.executable, "-m", "pipeline.train", "--config", config]
    command += ["--workdir", str(workdir)]
    run_settings = [
        "train.epochs=1", f"train.steps_per_epoch={PROFILE_AFTER + steps}",
        f"train.profile_steps={steps}", "train.attention_images=0", "train.bleu_every_epochs=0",
        "data.test_source=null", "data.test_target=null", "data.test_tsv=null",
        "train.early_stopping_patience=null",
    ]  # fmt: skip
    for setting in run_settings + settings:
        command += ["--set", setting]
    subprocess.run(command, cwd=PROJECT_ROOT, check=True)
    (trace,) = glob.glob(str(workdir / LOG_DIR / "train" / "plugins" / "profile" / "*" / "*.pb"))
    return trace


def op_rows(trace):
    """(op type, op name, self-time in microseconds) of every TensorFlow op in the trace."""
    from xprof.convert import raw_to_tool_data

    data, _ = raw_to_tool_data.xspace_to_tool_data([trace], "framework_op_stats", {})
    table = json.loads(data)[0]
    columns = [column["id"] for column in table["cols"]]
    for row in table["rows"]:
        cells = dict(zip(columns, (cell["v"] for cell in row["c"]), strict=True))
        if cells["type"] != "IDLE":
            yield cells["type"], cells["operation"], cells["total_self_time"]


def model_part(name):
    """The op's first two meaningful scopes: 'encoder/forward_gru', 'decoder/...', 'Adam'."""
    scopes = [s for s in name.split("/")[:-1] if s not in NOISE_SCOPES and not s.isdigit()]
    scopes = [s for s in scopes if not s.startswith(("while_", "StatefulPartitionedCall"))]
    return "/".join(scopes[:2]) or "(top level)"


def print_shares(title, totals, total, top):
    print(f"\n| {title} | self-time (ms) | share |")
    print("|---|---:|---:|")
    for key, micros in sorted(totals.items(), key=lambda item: -item[1])[:top]:
        print(f"| {key} | {micros / 1000:.1f} | {100 * micros / total:.1f}% |")


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--config", default=str(PROJECT_ROOT / "configs" / "default.yaml"))
    parser.add_argument("--steps", type=int, default=20)
    parser.add_argument("--set", action="append", default=[], metavar="SECTION.KEY=VALUE")
    parser.add_argument("--vocab-from", metavar="WORKDIR")
    parser.add_argument("--top", type=int, default=25)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="training_profile_") as scratch:
        trace = profile(args.config, args.steps, args.set, args.vocab_from, Path(scratch))
        rows = list(op_rows(trace))
    total = sum(micros for _, _, micros in rows)
    by_type, by_part, by_op = (collections.Counter() for _ in range(3))
    for op_type, name, micros in rows:
        by_type[op_type] += micros
        by_part[model_part(name)] += micros
        by_op[f"{name} ({op_type})"] += micros
    per_step = total / 1000 / args.steps
    print(f"\n{args.steps} steps profiled: {per_step:.1f} ms of op self-time a step")
    print_shares("op type", by_type, total, args.top)
    print_shares("model part", by_part, total, args.top)
    print_shares("op", by_op, total, args.top)


if __name__ == "__main__":
    main()
