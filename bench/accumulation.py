"""What gradient accumulation costs: target tokens/s and peak memory of N micro-batches of B
tokens accumulated into one update, against one batch of N x B tokens and against batches of
B tokens without accumulation.

    python bench/accumulation.py [--config configs/multi30k_de_en_transformer.yaml]
        [--micro-batch-tokens 1024] [--parts 4] [--updates 60] [--rounds 2] [--quick]

Each variant trains a fresh model for two epochs in a fresh process (`bench/peak_memory.py`'s
training child: no validation, test or export); the figure is the second epoch's target
tokens/s (tracing and the first batches left out) and the process's peak RSS. The variants
take turns in each round. The batches of B tokens alone run N times as many steps, so that
every variant sees the same tokens.
"""

import argparse
import functools
import json
import subprocess
import sys
from pathlib import Path
from statistics import median

BENCH = Path(__file__).resolve().parent
PROJECT_ROOT = BENCH.parent
sys.path.insert(0, str(BENCH))

from common import alternate  # noqa: E402
from training_speed import epoch_rates  # noqa: E402

RECIPE = PROJECT_ROOT / "configs" / "multi30k_de_en_transformer.yaml"


def variants(tokens, parts):
    """name -> (its overrides, its steps an epoch per update of the others)."""
    return {
        f"{parts} x {tokens:,} accumulated": ([f"train.batch_tokens={tokens}",
                                               f"train.accumulate_steps={parts}"], 1),
        f"{parts * tokens:,} in one batch": ([f"train.batch_tokens={parts * tokens}"], 1),
        f"{tokens:,}, no accumulation": ([f"train.batch_tokens={tokens}"], parts),
    }  # fmt: skip


def train(config, steps, overrides):
    """(target tokens/s of the second epoch, peak RSS in MiB) of one training child."""
    command = [sys.executable, str(BENCH / "peak_memory.py"), "--child", "train", "--config",
               str(config), "--steps", str(steps), "--set", "train.epochs=2",
               *[a for o in overrides for a in ("--set", o)]]  # fmt: skip
    output = subprocess.run(command, capture_output=True, text=True, cwd=PROJECT_ROOT)
    if output.returncode:
        raise RuntimeError(f"{overrides}: exit {output.returncode}\n{output.stderr[-2000:]}")
    peak = json.loads(output.stdout.strip().splitlines()[-1])["peak_rss_mib"]
    return epoch_rates(output.stdout)[-1], peak


def main():
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--config", type=Path, default=RECIPE)
    parser.add_argument("--micro-batch-tokens", type=int, default=1024)
    parser.add_argument("--parts", type=int, default=4, help="micro-batches an update")
    parser.add_argument("--updates", type=int, default=60, help="updates an epoch")
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--quick", action="store_true", help="the smoke Transformer, 5 updates")
    args = parser.parse_args()
    if args.quick:
        args.config = PROJECT_ROOT / "configs" / "smoke_transformer.yaml"
        args.updates, args.rounds, args.micro_batch_tokens = 5, 1, 256
    runs = variants(args.micro_batch_tokens, args.parts)

    def measured(name, overrides, steps):
        rate, peak = train(args.config, args.updates * steps, overrides)
        print(f"{name}: {rate:,.0f} target tokens/s, {peak:,.0f} MiB", flush=True)
        return rate, peak

    figures = alternate(args.rounds, {
        name: functools.partial(measured, name, overrides, steps)
        for name, (overrides, steps) in runs.items()
    })  # fmt: skip
    print(f"\n{args.config.name}, {args.updates} updates an epoch, second epoch's rate\n")
    print("| variant | target tokens/s (each round) | median | peak RSS (MiB) |")
    print("|---|---|---:|---:|")
    for name, each in figures.items():
        rates = ", ".join(f"{rate:,.0f}" for rate, _ in each)
        print(
            f"| {name} | {rates} | {median(r for r, _ in each):,.0f} | "
            f"{max(p for _, p in each):,.0f} |"
        )


if __name__ == "__main__":
    main()
