"""Translation quality per configuration: an ablation table of test BLEU.

    python bench/ablation.py [--config configs/default.yaml] [--root runs/ablation]
                             [--variants NAME ...] [--beam-sizes 1 5 10]
                             [--length-penalties 0 0.6 1.0] [--seeds N ...] [--quick]

Each variant trains a model from the config with a few settings changed (`python -m
pipeline.train`, its own work directory under `--root`, so an interrupted table resumes where it
stopped; `--seeds` trains each variant once a seed, in `NAME_seedN`, and adds each variant's mean
over its seeds), then the best variant's model is decoded with each beam size and length penalty
(`python -m pipeline.evaluate`). The table prints test BLEU (cased and lowercased, sacreBLEU),
chrF, the last validation perplexity, the median training speed (target tokens per second,
from the run's TensorBoard logs; run the table alone on the machine) and training time.
`--quick` trains 100 steps a variant, under `ROOT/quick/`: a check that the table runs, not a
result.
"""

import argparse
import json
import os
import subprocess
import sys
from pathlib import Path

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")

import numpy as np  # noqa: E402
import tensorflow as tf  # noqa: E402

PROJECT_ROOT = Path(__file__).resolve().parent.parent

# name -> settings changed from the config: each attention score the layers offer (luong_dot
# needs the decoder as wide as the bidirectional encoder's memory), with and without input
# feeding.
ATTENTION_VARIANTS = {
    "bahdanau": ["model.attention=bahdanau"],
    "bahdanau_normalized": ["model.attention=bahdanau", "model.attention_normalize=true"],
    "luong_dot": [
        "model.attention=luong_dot",
        "model.decoder_units=512",
        "model.attention_scale=false",
    ],
    "luong_general": ["model.attention=luong_general", "model.attention_scale=false"],
    "luong_general_scaled": ["model.attention=luong_general", "model.attention_scale=true"],
    "luong_dot_scaled": [
        "model.attention=luong_dot",
        "model.decoder_units=512",
        "model.attention_scale=true",
    ],
    "luong_concat": ["model.attention=luong_concat"],
    "scaled_dot": ["model.attention=scaled_dot", "model.attention_qk_norm=false"],
    "multi_head": [
        "model.attention=multi_head",
        "model.attention_qk_norm=false",
        "model.attention_project_values=true",
    ],
    "scaled_dot_qk_norm": ["model.attention=scaled_dot", "model.attention_qk_norm=true"],
    "multi_head_qk_norm": [
        "model.attention=multi_head",
        "model.attention_qk_norm=true",
        "model.attention_project_values=true",
    ],
    "multi_head_qk_norm_raw_values": [
        "model.attention=multi_head",
        "model.attention_qk_norm=true",
        "model.attention_project_values=false",
    ],
    "multi_head_qk_norm_one_head": [
        "model.attention=multi_head",
        "model.attention_qk_norm=true",
        "model.attention_heads=1",
        "model.attention_project_values=true",
    ],
}
VARIANTS = {
    name + suffix: settings + feeding
    for name, settings in ATTENTION_VARIANTS.items()
    for suffix, feeding in (("", []), ("+input_feeding", ["model.input_feeding=true"]))
}
DEFAULT_VARIANTS = list(VARIANTS)


def run(command):
    print("$", " ".join(command), flush=True)
    subprocess.run(command, cwd=PROJECT_ROOT, check=True)


def train_variant(config, workdir, settings, quick):
    report_file = workdir / "test_report.json"
    if not report_file.exists():
        extra = ["train.steps_per_epoch=100", "train.epochs=1"] if quick else []
        command = [sys.executable, "-m", "pipeline.train", "--config", config]
        command += ["--workdir", str(workdir)]
        for setting in settings + extra:
            command += ["--set", setting]
        run(command)
    return json.loads(report_file.read_text())


def logged_values(workdir, split, tag):
    """The values of one TensorBoard scalar of a run (`logs/<split>`), by step."""
    values = {}
    for path in sorted((Path(workdir) / "logs" / split).glob("events.out.tfevents.*")):
        for event in tf.compat.v1.train.summary_iterator(str(path)):
            for value in event.summary.value:
                if value.tag == tag:
                    values[event.step] = float(tf.make_ndarray(value.tensor))
    return [values[step] for step in sorted(values)]


def evaluate(workdir, beam_size, length_penalty):
    command = [sys.executable, "-m", "pipeline.evaluate", "--workdir", str(workdir)]
    command += ["--split", "test", "--beam-size", str(beam_size)]
    command += ["--length-penalty", str(length_penalty)]
    run(command)
    return json.loads((workdir / "eval_test.json").read_text())


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--config", default="configs/default.yaml")
    parser.add_argument("--root", default="runs/ablation", help="one work directory a variant")
    parser.add_argument("--variants", nargs="+", default=DEFAULT_VARIANTS, choices=VARIANTS)
    parser.add_argument("--beam-sizes", nargs="+", type=int, default=[1, 5, 10])
    parser.add_argument("--length-penalties", nargs="+", type=float, default=[0.0, 0.6, 1.0])
    parser.add_argument(
        "--seeds",
        nargs="+",
        type=int,
        default=[None],
        help="train.seed values (default: the config's)",
    )
    parser.add_argument("--quick", action="store_true", help="100 steps a variant")
    args = parser.parse_args(argv)

    root = Path(args.root) / "quick" if args.quick else Path(args.root)  # never mixed with results
    rows = []
    for name in args.variants:
        for seed in args.seeds:
            label = name if seed is None else f"{name}_seed{seed}"
            settings = VARIANTS[name] + ([] if seed is None else [f"train.seed={seed}"])
            workdir = root / label
            report = train_variant(args.config, workdir, settings, args.quick)
            rows.append((label, workdir, report))

    print(f"\nconfig {args.config}; test BLEU with the config's decode settings")
    columns = ("variant", "val perplexity", "test BLEU", "lowercased", "chrF", "target tok/s")
    print("| " + " | ".join(columns) + " | training s |")
    print("|---|" + "---:|" * len(columns))
    for name, workdir, report in rows:
        perplexity = logged_values(workdir, "validation", "epoch_perplexity")
        speed = logged_values(workdir, "train", "epoch_tgt_tok/s")
        seconds = report.get("training_seconds")
        print(
            f"| {name} | {perplexity[-1]:.2f} | {report['bleu']:.2f} "
            f"| {report['bleu_lowercase']:.2f} | {report['chrf']:.2f} "
            f"| {np.median(speed):,.0f} | {seconds or 0:.0f} |"
        )
    if len(args.seeds) > 1:
        print(f"\nmean over seeds {args.seeds}")
        print("| variant | test BLEU | lowercased | chrF |")
        print("|---|---:|---:|---:|")
        for index, name in enumerate(args.variants):
            reports = [
                row[2] for row in rows[index * len(args.seeds) : (index + 1) * len(args.seeds)]
            ]
            means = [
                np.mean([report[key] for report in reports])
                for key in ("bleu", "bleu_lowercase", "chrf")
            ]
            print(f"| {name} | " + " | ".join(f"{value:.2f}" for value in means) + " |")

    best_name, best_workdir, _ = max(rows, key=lambda row: row[2]["bleu"])
    print(f"\nsearch settings on the best variant ({best_name})")
    print("| beam size | length penalty | test BLEU | lowercased | chrF |")
    print("|---:|---:|---:|---:|---:|")
    for beam_size in args.beam_sizes:
        penalties = args.length_penalties if beam_size > 1 else [0.0]
        for length_penalty in penalties:
            report = evaluate(best_workdir, beam_size, length_penalty)
            print(
                f"| {beam_size} | {length_penalty:g} | {report['bleu']:.2f} "
                f"| {report['bleu_lowercase']:.2f} | {report['chrf']:.2f} |",
                flush=True,
            )


if __name__ == "__main__":
    main()
