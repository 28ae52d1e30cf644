"""Training on corpora of growing size: time to the first step, wall time and peak RSS of a
30-step run of the default model, from 150,000 to 20,000,000 sentence pairs.

    python bench/data_scale.py [--pairs 150000 600000 2400000 20000000] [--repeats R]
                               [--corpus-dir DIR] [--shared DIR] [--ref-tree DIR] [--keep]
                               [--build-only]

Corpora cycle the bundled Multi30k German-English and Tatoeba Spanish-English training pairs
in a fixed shuffled order, written once to `--corpus-dir` as gzip shards of at most 2,500,000
pairs (`N/train.src-00000.gz`, ...). Each run is a fresh `python -m pipeline.train` process with
a fresh work directory (vocabularies built every time, vocabulary 8000/8000, batch 64, no
validation, test or export). Wall time is the whole process's; peak RSS is its `ru_maxrss`,
which Linux starts at this script's own peak (tens of MB), small next to training's. The
first step's time is what the trainer prints. `--ref-tree` runs another checkout the same way,
alternating run for run, on single-file copies of the corpora (older code reads no globs).
"""

import argparse
import functools
import gzip
import os
import random
import re
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import yaml
from common import PROJECT_ROOT, alternate

SHARD_PAIRS = 2_500_000
FIRST_STEP = re.compile(r"First training step after ([0-9.]+) s")


def read_pairs(shared):
    """(source, target) byte lines: Multi30k de-en, then Tatoeba es-en, in a seeded shuffle."""
    data = shared / "data"
    sources = (data / "multi30k" / "train.de").read_bytes().splitlines()
    targets = (data / "multi30k" / "train.en").read_bytes().splitlines()
    for line in (data / "spa-eng" / "spa.txt").read_bytes().splitlines():
        english, spanish = line.split(b"\t")
        sources.append(spanish)
        targets.append(english)
    order = list(range(len(sources)))
    random.Random(0).shuffle(order)
    return [sources[i] for i in order], [targets[i] for i in order]


def write_shard(path, lines, start, count):
    """Lines start .. start + count of the endless cycle of `lines`, a block at a time."""
    with gzip.open(path, "wb", compresslevel=1) as file:
        while count:
            offset = start % len(lines)
            block = lines[offset : offset + count]
            file.write(b"\n".join(block) + b"\n")
            start, count = start + len(block), count - len(block)


def build_corpus(directory, pairs, source_lines, target_lines):
    partial = directory.with_name(f"{directory.name}.partial")  # a killed build is not reused
    shutil.rmtree(partial, ignore_errors=True)
    partial.mkdir(parents=True)
    for shard, start in enumerate(range(0, pairs, SHARD_PAIRS)):
        count = min(SHARD_PAIRS, pairs - start)
        write_shard(partial / f"train.src-{shard:05d}.gz", source_lines, start, count)
        write_shard(partial / f"train.tgt-{shard:05d}.gz", target_lines, start, count)
    partial.rename(directory)


def build_single_copy(directory):
    """One file per side for code that reads no globs: gzip members concatenate."""
    single, partial = directory / "single", directory / "single.partial"
    if single.is_dir():
        return single
    shutil.rmtree(partial, ignore_errors=True)
    partial.mkdir()
    for side in ("src", "tgt"):
        with open(partial / f"train.{side}.gz", "wb") as out:
            for shard in sorted(directory.glob(f"train.{side}-*.gz")):
                with open(shard, "rb") as file:
                    shutil.copyfileobj(file, out, 16 << 20)
    partial.rename(single)
    return single


def corpus_mb(directory):
    return sum(path.stat().st_size for path in directory.glob("train.*-*.gz")) / 1e6


def write_config(path, source, target, model):
    config = {
        "data": {
            "train_source": str(source), "train_target": str(target),
            "source_vocab_size": 8000, "target_vocab_size": 8000,
            "max_source_length": 60, "max_target_length": 60,
        },
        "model": model,
        "train": {
            "batch_size": 64, "epochs": 1, "steps_per_epoch": 30,
            "checkpoint_every_steps": 1000, "early_stopping_patience": None,
            "bleu_every_epochs": 0,
        },
        "export": {"after_training": False},
    }  # fmt: skip
    path.write_text(yaml.safe_dump(config, sort_keys=False), encoding="utf-8")


def run_training(tree, source, target, model, keep):
    """(first step s or None, wall s, peak RSS MB) of one training process; None if it fails."""
    scratch = Path(tempfile.mkdtemp(prefix="data_scale-"))
    write_config(scratch / "config.yaml", source, target, model)
    command = [sys.executable, "-m", "pipeline.train", "--config", str(scratch / "config.yaml"),
               "--workdir", str(scratch / "run")]  # fmt: skip
    start = time.perf_counter()
    process = subprocess.Popen(
        command, cwd=tree, env={**os.environ, "TF_CPP_MIN_LOG_LEVEL": "3"},
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
    )  # fmt: skip
    output = process.stdout.read()
    # wait4, not Popen.wait: its rusage carries the child's peak RSS.
    _, status, usage = os.wait4(process.pid, 0)
    wall = time.perf_counter() - start
    process.returncode = os.waitstatus_to_exitcode(status)
    if keep:
        print(f"kept {scratch}")
    else:
        shutil.rmtree(scratch, ignore_errors=True)
    if process.returncode:
        tail = "\n".join(output.splitlines()[-30:])
        print(f"{tree}: {source}: exit {process.returncode}\n{tail}", flush=True)
        return None
    first_step = FIRST_STEP.search(output)
    return float(first_step.group(1)) if first_step else None, wall, usage.ru_maxrss / 1024


def print_table(label, runs, sizes):
    """Median first step and wall time, max RSS per size, then the issue's two checks."""
    rows = {}
    for pairs in sizes:
        done = [run for run in runs[pairs] if run]
        if done:
            first_steps = [run[0] for run in done if run[0] is not None]
            first_step = statistics.median(first_steps) if first_steps else None
            wall = statistics.median(run[1] for run in done)
            rows[pairs] = first_step, wall, max(run[2] for run in done)
    print(f"\n### {label}\n")
    print("| pairs | corpus MB (gz) | first step (s) | wall time (s) | peak RSS (MB) "
          "| wall / smallest | RSS / smallest |")  # fmt: skip
    print("|---:|---:|---:|---:|---:|---:|---:|")
    if not rows:
        return
    base = rows[min(rows)]
    for pairs, (first_step, wall, rss) in rows.items():
        first = "n/a" if first_step is None else f"{first_step:.1f}"
        print(f"| {pairs:,} | {sizes[pairs]:,.1f} | {first} | {wall:.1f} | {rss:,.0f} "
              f"| {wall / base[1]:.2f} | {rss / base[2]:.2f} |")  # fmt: skip
    if len(rows) > 1:
        ratio = rows[max(rows)][2] / base[2]
        verdict = "PASS" if ratio <= 1.3 else "FAIL"
        print(f"\npeak RSS {max(rows):,} / {min(rows):,} pairs: {ratio:.2f}x (<= 1.3x): {verdict}")
    if 150_000 in rows and 2_400_000 in rows:
        ratio = rows[2_400_000][1] / rows[150_000][1]
        verdict = "PASS" if ratio <= 2.5 else "FAIL"
        print(f"wall time 2,400,000 / 150,000 pairs: {ratio:.2f}x (<= 2.5x): {verdict}")


def main():
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--pairs", type=int, nargs="+",
                        default=[150_000, 600_000, 2_400_000, 20_000_000])  # fmt: skip
    parser.add_argument("--repeats", type=int, default=1, help="runs per size (median, max RSS)")
    parser.add_argument("--corpus-dir", type=Path, default=Path("/tmp/seq2seq_data_scale"))
    parser.add_argument("--shared", type=Path, default=PROJECT_ROOT.parent / "shared")
    parser.add_argument("--ref-tree", type=Path, help="another checkout to run alternately")
    parser.add_argument("--keep", action="store_true", help="keep the work directories")
    parser.add_argument("--build-only", action="store_true", help="build the corpora, run none")
    args = parser.parse_args()

    lines = None  # read only when a size needs building
    for pairs in args.pairs:
        directory = args.corpus_dir / str(pairs)
        took = "cached"
        if not directory.is_dir():
            start = time.perf_counter()
            lines = lines or read_pairs(args.shared)
            build_corpus(directory, pairs, *lines)
            took = f"built in {time.perf_counter() - start:.1f} s"
        if args.ref_tree:
            build_single_copy(directory)
        print(f"{pairs:,} pairs: {directory} ({corpus_mb(directory):,.1f} MB, {took})", flush=True)
    if args.build_only:
        return

    model = yaml.safe_load((PROJECT_ROOT / "configs" / "default.yaml").read_text())["model"]
    trees = {"current tree": (PROJECT_ROOT, "train.{}-*.gz")}
    if args.ref_tree:
        trees[f"reference tree {args.ref_tree}"] = (args.ref_tree.resolve(), "single/train.{}.gz")

    def measured(label, tree, pattern, pairs):
        directory = args.corpus_dir.resolve() / str(pairs)
        paths = [directory / pattern.format(side) for side in ("src", "tgt")]
        run = run_training(tree, *paths, model, args.keep)
        outcome = f"{run[1]:.1f} s, {run[2]:,.0f} MB" if run else "failed"
        print(f"{label}, {pairs:,} pairs: {outcome}", flush=True)
        return run

    measured_runs = alternate(args.repeats, {
        (pairs, label): functools.partial(measured, label, tree, pattern, pairs)
        for pairs in args.pairs for label, (tree, pattern) in trees.items()
    })  # fmt: skip
    runs = {label: {pairs: measured_runs[pairs, label] for pairs in args.pairs}
            for label in trees}  # fmt: skip
    sizes = {pairs: corpus_mb(args.corpus_dir / str(pairs)) for pairs in args.pairs}
    for label, by_size in runs.items():
        print_table(label, by_size, sizes)


if __name__ == "__main__":
    main()
