"""Wall time of the commands a user runs on a trained model, here and in another checkout.

    python bench/command_time.py --workdir W --ref-tree DIR [--rounds R] [--sentences N]

Runs, as fresh processes from each tree's root in turns: `python -m pipeline.translate` on the
first N sentences of the model's validation source (what a command spends before and while
it translates: TensorFlow's start, loading the model, tracing the search), `python -m
pipeline.evaluate` on the same split, and `python -m export --formats saved_model,onnx`
into a scratch folder. Prints each command's median seconds a tree and their ratio (the
reference tree's time over this tree's: above 1, this tree is faster). `DIR` is another
checkout, e.g. `git worktree add DIR HEAD~1`, with this interpreter's packages.
"""

import argparse
import functools
import gzip
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from common import PROJECT_ROOT, alternate, machine

from pipeline.config import load_config


def commands(workdir, source, scratch):
    """{name: the arguments after `python -m`}."""
    return {
        "translate": ["pipeline.translate", "--workdir", workdir, "--input", source],
        "evaluate": ["pipeline.evaluate", "--workdir", workdir, "--split", "valid"],
        "export": ["export", "--workdir", workdir, "--output", scratch, "--formats",
                   "saved_model,onnx"],
    }  # fmt: skip


def timed(tree, arguments, scratch):
    shutil.rmtree(scratch, ignore_errors=True)
    started = time.perf_counter()
    subprocess.run([sys.executable, "-m", *map(str, arguments)], cwd=tree, check=True,
                   capture_output=True)  # fmt: skip
    return time.perf_counter() - started


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--workdir", type=Path, required=True, help="a trained work directory")
    parser.add_argument("--ref-tree", type=Path, required=True, help="the checkout to compare")
    parser.add_argument("--rounds", type=int, default=3, help="turns of every command and tree")
    parser.add_argument("--sentences", type=int, default=100, help="sentences to translate")
    args = parser.parse_args()
    print(machine(model=True))
    data = load_config(args.workdir / "config.yaml")["data"]
    with tempfile.TemporaryDirectory() as temp:
        source = Path(temp) / "source.txt"
        with gzip.open(data["valid_source"], "rt", encoding="utf-8") as lines:
            source.write_text("".join(line for _, line in zip(range(args.sentences), lines)))
        scratch = Path(temp) / "export"
        trees = {"this tree": PROJECT_ROOT, "reference": args.ref_tree.resolve()}
        for name, arguments in commands(args.workdir.resolve(), source, scratch).items():
            sides = {tree: functools.partial(timed, root, arguments, scratch)
                     for tree, root in trees.items()}  # fmt: skip
            ours, theirs = (statistics.median(times)
                            for times in alternate(args.rounds, sides).values())  # fmt: skip
            print(f"{name}: this tree {ours:.1f} s, reference {theirs:.1f} s, "
                  f"{theirs / ours:.2f}x (median of {args.rounds})")  # fmt: skip


if __name__ == "__main__":
    main()
