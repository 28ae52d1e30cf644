"""Wall time and peak memory of the commands a user runs on a trained model, here and in
another checkout.

    python bench/command_time.py --workdir W --ref-tree DIR [--rounds R] [--sentences N]
        [--commands translate,evaluate,export,import] [--checkpoint C]

Runs, as fresh processes from each tree's root in turns: `python -m pipeline.translate` on the
first N sentences of the model's validation source (what a command spends before and while
it translates: TensorFlow's start, loading the model, tracing the search), `python -m
pipeline.evaluate` on the same split, and `python -m export --formats saved_model,onnx`
into a scratch folder, and with `--checkpoint` `python -m pipeline.import_model C` into one
(`--commands` picks some). Prints each command's median seconds and
median peak resident memory a tree, and their ratios (the reference tree's over this
tree's: above 1, this tree is faster or smaller). `DIR` is another checkout, e.g. `git
worktree add DIR HEAD~1`, with this interpreter's packages.
"""

import argparse
import functools
import gzip
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from common import PROJECT_ROOT, alternate, machine

from pipeline.config import load_config


def commands(workdir, source, scratch, checkpoint):
    """{name: the arguments after `python -m`}."""
    return {
        "translate": ["pipeline.translate", "--workdir", workdir, "--input", source],
        "evaluate": ["pipeline.evaluate", "--workdir", workdir, "--split", "valid"],
        "export": ["export", "--workdir", workdir, "--output", scratch, "--formats",
                   "saved_model,onnx"],
        "import": ["pipeline.import_model", checkpoint, "--workdir", scratch],
    }  # fmt: skip


def timed(tree, arguments, scratch):
    """(seconds, peak resident MB) of `python -m ARGUMENTS` run from `tree`."""
    shutil.rmtree(scratch, ignore_errors=True)
    started = time.perf_counter()
    process = subprocess.Popen([sys.executable, "-m", *map(str, arguments)], cwd=tree,
                               stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)  # fmt: skip
    stderr = process.stderr.read()
    _, status, usage = os.wait4(process.pid, 0)
    seconds = time.perf_counter() - started
    if os.waitstatus_to_exitcode(status) != 0:
        raise SystemExit(f"{' '.join(map(str, arguments))} failed in {tree}:\n"
                         f"{stderr.decode()[-2000:]}")  # fmt: skip
    return seconds, usage.ru_maxrss / 1024


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--workdir", type=Path, required=True, help="a trained work directory")
    parser.add_argument("--ref-tree", type=Path, required=True, help="the checkout to compare")
    parser.add_argument("--rounds", type=int, default=3, help="turns of every command and tree")
    parser.add_argument("--sentences", type=int, default=100, help="sentences to translate")
    parser.add_argument("--commands", type=lambda text: text.split(","),
                        default=["translate", "evaluate", "export"])  # fmt: skip
    parser.add_argument("--checkpoint", type=Path,
                        help="import: a checkpoint directory (Hugging Face layout)")  # fmt: skip
    args = parser.parse_args()
    if "import" in args.commands and args.checkpoint is None:
        parser.error("--commands import needs --checkpoint")
    print(machine(model=True))
    data = load_config(args.workdir / "config.yaml", saved=True)["data"]
    with tempfile.TemporaryDirectory() as temp:
        source = Path(temp) / "source.txt"
        if {"translate", "evaluate"} & set(args.commands):
            with gzip.open(data["valid_source"], "rt", encoding="utf-8") as lines:
                source.write_text("".join(line for _, line in zip(range(args.sentences), lines)))
        scratch = Path(temp) / "export"
        trees = {"this tree": PROJECT_ROOT, "reference": args.ref_tree.resolve()}
        checkpoint = args.checkpoint and args.checkpoint.resolve()
        for name, arguments in commands(
            args.workdir.resolve(), source, scratch, checkpoint
        ).items():
            if name not in args.commands:
                continue
            sides = {tree: functools.partial(timed, root, arguments, scratch)
                     for tree, root in trees.items()}  # fmt: skip
            runs = alternate(args.rounds, sides).values()
            (ours, our_mb), (theirs, their_mb) = (
                [statistics.median(values) for values in zip(*results)] for results in runs
            )
            print(f"{name}: this tree {ours:.1f} s, {our_mb:,.0f} MB; reference {theirs:.1f} s, "
                  f"{their_mb:,.0f} MB; {theirs / ours:.2f}x the time, {their_mb / our_mb:.2f}x "
                  f"the memory (median of {args.rounds})")  # fmt: skip


if __name__ == "__main__":
    main()
