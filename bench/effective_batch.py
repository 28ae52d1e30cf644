"""The Transformer recipe at OpenNMT-tf's effective batch (its `auto_config`: 25,000 tokens an
update) against the recipe's own batch of 4,096 tokens, for the same training time.

    python bench/effective_batch.py [--root runs/effective_batch] [--hours 0.6]
        [--accumulate 6] [--quick]

Each variant is `python -m pipeline.train` on `configs/multi30k_de_en_transformer.yaml` with
`train.time_budget_hours` set (a run ends at the last epoch end within it). The large batch
accumulates `--accumulate` micro-batches of the recipe's 4,096 tokens through
`train.effective_batch_tokens` (6 x 4,096 = 24,576, the multiple nearest OpenNMT-tf's 25,000)
and divides the warm-up's steps by the same factor, so that both warm up over the same epochs;
everything else (peak learning rate, the mean of the last checkpoints, the search) is the
recipe's. Printed: updates, epochs, training time and test_2016_flickr BLEU (cased,
lowercased) and chrF from each run's report. A finished run is skipped, so the command resumes.
"""

import argparse
import json
import re
import subprocess
import sys
from pathlib import Path

import yaml

PROJECT_ROOT = Path(__file__).resolve().parent.parent
RECIPE = PROJECT_ROOT / "configs" / "multi30k_de_en_transformer.yaml"
QUICK_RECIPE = PROJECT_ROOT / "configs" / "smoke_transformer.yaml"


def variants(train, accumulate):
    """name -> the recipe's overrides for that variant."""
    large = train["batch_tokens"] * accumulate
    return {
        f"{train['batch_tokens']:,} tokens an update (the recipe)": [],
        f"{large:,} tokens an update ({accumulate} x {train['batch_tokens']:,} accumulated)": [
            f"train.effective_batch_tokens={large}",
            f"train.warmup_steps={round(train['warmup_steps'] / accumulate)}",
        ],
    }


def train_once(config, workdir, hours, overrides, quick):
    """The run's stdout, from its log when it finished before."""
    log = workdir.with_suffix(".log")
    if (workdir / "test_report.json").exists() and log.exists():
        return log.read_text()
    settings = [f"train.time_budget_hours={hours}", "export.after_training=false", *overrides]
    if quick:
        settings += ["train.batch_tokens=256", "train.epochs=2"]
    command = [sys.executable, "-m", "pipeline.train", "--config", str(config), "--workdir",
               str(workdir), *[a for s in settings for a in ("--set", s)]]  # fmt: skip
    print("$", " ".join(command), flush=True)
    with open(log, "w") as out:
        subprocess.run(command, cwd=PROJECT_ROOT, stdout=out, stderr=subprocess.STDOUT, check=True)
    return log.read_text()


def figures(stdout, workdir):
    report = json.loads((workdir / "test_report.json").read_text())
    epochs = re.findall(r"^epoch (\d+)/", stdout, flags=re.M)
    steps = int(re.search(r"^Epochs of ([\d,]+) steps", stdout, flags=re.M)[1].replace(",", ""))
    return {"updates": steps * len(epochs), "epochs": len(epochs), **report}


def main():
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--root", type=Path, default=PROJECT_ROOT / "runs" / "effective_batch")
    parser.add_argument("--hours", type=float, default=0.6, help="each run's training time")
    parser.add_argument("--accumulate", type=int, default=6, help="micro-batches an update")
    parser.add_argument("--quick", action="store_true", help="the smoke Transformer, 2 epochs")
    args = parser.parse_args()
    config = QUICK_RECIPE if args.quick else RECIPE
    train = yaml.safe_load(config.read_text())["train"]
    if args.quick:
        train = {**train, "batch_tokens": 256, "warmup_steps": train.get("warmup_steps", 0)}
    args.root.mkdir(parents=True, exist_ok=True)
    rows = []
    for index, (name, overrides) in enumerate(variants(train, args.accumulate).items()):
        workdir = args.root.resolve() / f"variant_{index}"
        rows.append((name, figures(train_once(config, workdir, args.hours, overrides,
                                              args.quick), workdir)))  # fmt: skip
    print(f"\n{config.name}, {args.hours} h of training each\n")
    print("| batch | updates | epochs | training time | BLEU | lowercased | chrF |")
    print("|---|---:|---:|---:|---:|---:|---:|")
    for name, f in rows:
        print(
            f"| {name} | {f['updates']:,} | {f['epochs']} | {f['training_seconds'] / 60:.1f} min"
            f" | {f['bleu']:.2f} | {f['bleu_lowercase']:.2f} | {f['chrf']:.2f} |"
        )


if __name__ == "__main__":
    main()
