"""Training speed: target tokens per second, seconds per epoch, FLOPs per target token and the
share of the CPU's peak that training reaches.

    python bench/training_speed.py [--config configs/default.yaml] [--steps 150] [--variants N]
                                   [--quick]
    python bench/training_speed.py --ref-tree DIR [--steps N] [--rounds R]
                                   [--set SECTION.KEY=VALUE ...]

Each variant (attention type x input feeding, and XLA) trains `--steps` steps of a fresh
model in a subprocess (`python -m pipeline.train`); the figure is the `target tokens/s` of its
report's epoch line (non-padding target tokens per second, first step's tracing included). FLOPs are
counted from the configuration (see `training_flops_per_target_token`); the peak is measured
as the FLOP/s of a 4096 x 4096 float32 matmul on this machine, which is within a few percent of
the theoretical peak of the AMD EPYC (Zen 4) here: 2 cores x 2 FMA pipes x 8 float32 lanes x 2
FLOPs = 64 FLOP/cycle, ~224 GFLOP/s at 3.5 GHz.

With `--ref-tree DIR` (another checkout, e.g. `git worktree add DIR HEAD~1`) it trains the
recipe's own model (changed by `--set`) in this tree and in DIR in turn, `--rounds` times, and
prints their ratio.
"""

import argparse
import os
import re
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from statistics import median

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")
PROJECT_ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(PROJECT_ROOT))

from common import alternate  # noqa: E402

from pipeline.config import load_config  # noqa: E402

VARIANTS = [
    ("luong_general", False, False),
    ("luong_general", True, False),
    ("luong_dot", False, False),
    ("luong_concat", False, False),
    ("bahdanau", False, False),
    ("bahdanau", True, False),
    ("scaled_dot", False, False),
    ("multi_head", False, False),
    ("luong_general", False, True),  # XLA
]
GATES = {"gru": 3, "lstm": 4, "simple_rnn": 1}


def recurrent_macs(cell, inputs, units):
    return GATES[cell] * units * (inputs + units)


def attention_macs(model, query, memory, source_len):
    """(per target token, per source token) multiply-adds of the attention."""
    kind, units = model["attention"], model["attention_units"]
    context = source_len * memory
    if kind == "luong_dot":
        return source_len * query + context, 0
    if kind in ("luong_general", "scaled_dot"):
        return source_len * query + context, memory * query
    if kind in ("luong_concat", "bahdanau"):
        return query * units + source_len * units + context, memory * units
    if kind == "multi_head":  # key_dim = query / heads per head, values projected to memory
        return query * query + source_len * (query + memory) + memory * query, 2 * memory * query
    return 0, 0


def training_flops_per_target_token(config, source_per_target, mean_source_len):
    """Forward multiply-adds per token from the layer sizes, x 2 FLOPs, x 3 for training
    (the backward pass costs about twice the forward). Embedding lookups, element-wise ops
    and the softmax are left out: they are small next to the matrix products."""
    model, vocab = config["model"], config["data"]["target_vocab_size"]
    cell, directions = model["cell_type"], 2 if model["bidirectional"] else 1
    per_source, inputs = 0, model["embedding_dim"]
    for _ in range(model["encoder_layers"]):
        per_source += directions * recurrent_macs(cell, inputs, model["encoder_units"])
        concat = model["bidirectional"] and model["merge_mode"] == "concat"
        inputs = model["encoder_units"] * (2 if concat else 1)
    memory, units = inputs, model["decoder_units"]
    attention_dim = model["attention_vector_size"] or units
    with_attention = model["attention"] != "none"
    per_target = 0
    inputs = model["embedding_dim"] + (attention_dim if model["input_feeding"] else 0)
    for _ in range(model["decoder_layers"]):
        per_target += recurrent_macs(cell, inputs, units)
        inputs = units
    readout = units
    if with_attention:
        target_part, source_part = attention_macs(model, units, memory, mean_source_len)
        per_target += target_part + (memory + units) * attention_dim
        per_source += source_part
        readout = attention_dim
    per_target += readout * vocab
    return 3 * 2 * (per_target + source_per_target * per_source)


def corpus_lengths(config):
    """Training pairs, and mean source and target lengths in SentencePiece pieces (from
    vocabularies trained on the first 5,000 pairs)."""
    import sentencepiece

    from pipeline.data.corpus import read_split
    from pipeline.data.tokenizer import train_sentencepiece

    data = config["data"]
    corpus = read_split(data, "train")
    lengths = []
    with tempfile.TemporaryDirectory() as tmp:
        for side, lines in (("source", corpus.sources), ("target", corpus.targets)):
            sample = lines[:5000]
            path = Path(tmp) / f"{side}.model"
            train_sentencepiece(sample, data[f"{side}_vocab_size"], data["subword_model"], path)
            processor = sentencepiece.SentencePieceProcessor(model_file=str(path))
            lengths.append(sum(len(ids) for ids in processor.encode(sample)) / len(sample))
    return len(corpus), lengths[0], lengths[1] + 1  # targets end with </s>


def matmul_peak():
    import tensorflow as tf

    a, b = tf.random.normal([4096, 4096]), tf.random.normal([4096, 4096])
    product = tf.function(lambda: tf.matmul(a, b))
    product().numpy()
    best = min(_timed(lambda: product().numpy()) for _ in range(5))
    return 2 * 4096**3 / best


def _timed(fn):
    start = time.perf_counter()
    fn()
    return time.perf_counter() - start


def train_rate(config_path, steps, overrides, tree=PROJECT_ROOT, epochs=1):
    """The final `tgt_tok/s` of each of `epochs` epochs of `steps` steps of
    `python -m pipeline.train` run in `tree` (the rate restarts every epoch, so a second
    epoch's leaves out the start: tracing, the first batches), or the first's alone."""
    with tempfile.TemporaryDirectory() as workdir:
        command = [
            sys.executable, "-m", "pipeline.train", "--config", str(config_path),
            "--workdir", workdir, "--set", f"train.steps_per_epoch={steps}",
            "--set", f"train.epochs={epochs}", "--set", "data.test_source=null",
            "--set", "data.test_target=null", "--set", "export.after_training=false",
            "--set", "train.bleu_every_epochs=0", "--set", "data.valid_source=null",
            "--set", "data.valid_target=null", "--set", "train.early_stopping_patience=null",
            *[arg for o in overrides for arg in ("--set", o)],
        ]  # fmt: skip
        output = subprocess.run(
            command, capture_output=True, text=True, cwd=tree, check=True
        ).stdout
    rates = epoch_rates(output)
    return rates if epochs > 1 else rates[0]


def epoch_rates(output):
    """Each epoch's target tokens/s in a training's output: its report line ("epoch 1/2: ...,
    7,600 target tokens/s, ..."), or in a tree from before that line, the last redraw of
    Keras' progress bar ("... - tgt_tok/s: 7600.1")."""
    report = re.findall(r"^epoch \d+/\d+: .*?([\d,]+) target tokens/s", output, re.MULTILINE)
    if report:
        return [float(rate.replace(",", "")) for rate in report]
    return [float(re.findall(r"tgt_tok/s: ([\d.]+)", epoch)[-1])
            for epoch in re.split(r"Epoch \d+/\d+", output)[1:]]  # fmt: skip


def main():
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--config", type=Path, default=PROJECT_ROOT / "configs" / "default.yaml")
    parser.add_argument("--steps", type=int, default=150)
    parser.add_argument("--quick", action="store_true", help="40 steps, two variants")
    parser.add_argument(
        "--variants", type=int, default=len(VARIANTS), help="run the first N variants only"
    )
    parser.add_argument(
        "--ref-tree", type=Path, help="compare the recipe with another checkout, alternating"
    )
    parser.add_argument("--rounds", type=int, default=3, help="alternations with --ref-tree")
    parser.add_argument("--set", action="append", default=[], metavar="SECTION.KEY=VALUE",
                        help="with --ref-tree: a change to the recipe, in both trees")  # fmt: skip
    args = parser.parse_args()
    variants = VARIANTS[: 2 if args.quick else args.variants]
    steps = 40 if args.quick else args.steps
    if args.ref_tree:
        return compare_trees(args.config, steps, args.ref_tree, args.rounds, args.set)

    base = load_config(args.config)
    pairs, source_len, target_len = corpus_lengths(base)
    peak = matmul_peak()
    print(f"# {args.config.name}, {steps} steps a variant; mean lengths: source {source_len:.1f}, "
          f"target {target_len:.1f} pieces; matmul peak {peak / 1e9:.0f} GFLOP/s")  # fmt: skip
    print("| attention | input feeding | XLA | tgt tok/s | epoch s (est.) | MFLOP/tok | "
          "GFLOP/s | share of peak |")  # fmt: skip
    print("|---|---|---|---:|---:|---:|---:|---:|")
    for attention, feeding, xla in variants:
        overrides = [f"model.attention={attention}", f"model.input_feeding={str(feeding).lower()}",
                     f"train.jit_compile={str(xla).lower()}"]  # fmt: skip
        if attention == "luong_dot":  # dot needs the decoder as wide as the memory
            overrides.append(f"model.decoder_units={2 * base['model']['encoder_units']}")
        config = load_config(args.config, overrides)
        flops = training_flops_per_target_token(config, source_len / target_len, source_len)
        rate = train_rate(args.config, steps, overrides)
        epoch_tokens = pairs * target_len
        achieved = rate * flops
        print(
            f"| {attention} | {'yes' if feeding else 'no'} | {'yes' if xla else 'no'} | "
            f"{rate:,.0f} | {epoch_tokens / rate:,.0f} | {flops / 1e6:.1f} | "
            f"{achieved / 1e9:.1f} | {100 * achieved / peak:.1f}% |",
            flush=True,
        )


def compare_trees(config_path, steps, ref_tree, rounds, overrides=()):
    """The recipe's training rate here and in `ref_tree` (e.g. a `git worktree` of the previous
    commit), run after run in turn, two epochs a run, and their ratios: the first epoch's rate
    includes the run's start, the second's is steady training."""
    rates = alternate(rounds, {
        name: lambda tree=tree: train_rate(config_path, steps, overrides, tree, epochs=2)
        for name, tree in (("this tree", PROJECT_ROOT), (str(ref_tree), ref_tree))
    })  # fmt: skip
    changes = f" with {' '.join(overrides)}" if overrides else ""
    print(f"# {config_path.name}{changes}, 2 epochs of {steps} steps a run, {rounds} rounds "
          "alternating")  # fmt: skip
    print("| tree | epoch 1 tgt tok/s | median | epoch 2 tgt tok/s | median |")
    print("|---|---|---:|---|---:|")
    medians = {}
    for name, runs in rates.items():
        cells = []
        for epoch in range(2):
            values = [run[epoch] for run in runs]
            medians.setdefault(name, []).append(median(values))
            cells.append(f"{', '.join(f'{v:,.0f}' for v in values)} | {median(values):,.0f}")
        print(f"| {name} | {' | '.join(cells)} |")
    ours, theirs = medians.values()
    print(f"\nthis tree / {ref_tree}: epoch 1 {ours[0] / theirs[0]:.3f}, "
          f"epoch 2 {ours[1] / theirs[1]:.3f}")  # fmt: skip


if __name__ == "__main__":
    main()
