"""The time `python -m export` takes here and in another checkout, alternating.

    python bench/export_time.py --workdir TRAINED --ref-tree DIR [--formats onnx] [--rounds 3]

Each round exports the trained work directory once with this tree and once with `--ref-tree`
(e.g. `git worktree add DIR HEAD~1`), each a fresh process into a temporary folder, and
prints every run's wall time (the process's whole life: imports, loading, tracing,
conversion, writing), their medians and this tree's median as a fraction of the other's.
"""

import argparse
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from statistics import median

PROJECT_ROOT = Path(__file__).resolve().parent.parent


def export_seconds(tree, workdir, formats):
    with tempfile.TemporaryDirectory() as output:
        command = [sys.executable, "-m", "export", "--workdir", str(workdir),
                   "--output", output, "--formats", formats]  # fmt: skip
        start = time.perf_counter()
        subprocess.run(command, cwd=tree, check=True, capture_output=True)
        return time.perf_counter() - start


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--workdir", type=Path, required=True, help="a trained work directory")
    parser.add_argument("--ref-tree", type=Path, required=True, help="the checkout to compare")
    parser.add_argument("--formats", default="onnx", help="as `python -m export --formats`")
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args(argv)
    trees = {"this tree": PROJECT_ROOT, str(args.ref_tree): args.ref_tree}
    seconds = {name: [] for name in trees}
    for _ in range(args.rounds):
        for name, tree in trees.items():
            seconds[name].append(export_seconds(tree, args.workdir.resolve(), args.formats))
    print(f"# python -m export --formats {args.formats}, {args.rounds} rounds alternating")
    print("| tree | seconds | median |")
    print("|---|---|---:|")
    for name, runs in seconds.items():
        print(f"| {name} | {', '.join(f'{s:.1f}' for s in runs)} | {median(runs):.1f} |")
    ours, theirs = (median(runs) for runs in seconds.values())
    print(f"\nthis tree / {args.ref_tree}: {ours / theirs:.3f} of the time ({theirs / ours:.2f}x)")


if __name__ == "__main__":
    main()
