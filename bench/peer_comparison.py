"""This toolkit side by side with the TensorFlow tutorial "NMT with attention" (the peer in
`../shared/peers/tf_tutorial_nmt.py`), on the same data and machine, in one run.

    python bench/peer_comparison.py --root DIR [--steps 400] [--rounds 2] [--precision P]
                                    [--quality] [--decode-rounds 3] [--decode-only] [--quick]

Data: the peer's split of Tatoeba spa-eng (its README): test = the last 2,000 of
`numpy.random.default_rng(0).permutation(118964)`, validation the 1,280 before them, training
the rest; written as Spanish<TAB>English TSVs for this toolkit.

Our side is the peer's model size in this toolkit (`OUR_MODEL`: bidirectional GRU 256 summed,
one-head multi-head cross-attention without QK-norm, with value projection as Keras' layer
has, GRU 256 decoder, zero bridge, no input
feeding, dropout 0, 5k/5k SentencePiece vocabularies), batch 64, otherwise the toolkit's
defaults.

1. Training speed: each side trains `--steps` steps from scratch, the two alternating, for
   `--rounds` rounds. A side's figure is the median over its 100-step windows after the first
   (the first holds tracing): seconds a step, sentences/s (64 a step on both sides), and target
   tokens/s in its own tokens (the peer's words and [END]; our SentencePiece pieces and </s>).
   Sentences/s is the comparable figure: both consume the same corpus 64 sentences a step.
2. With `--quality`: the peer trains on its own schedule (early stopping, patience 3); ours
   trains for the same wall time (its step count from the speed of step 1). Both export (the
   peer's greedy SavedModel; our ONNX model) and translate the 2,000 test sentences, the sides
   alternating `--decode-rounds` times: sentences/s at batch 64 (median of the rounds) and ms
   for one sentence alone (median over the first 20), BLEU (cased, lowercased) and chrF with
   sacreBLEU on the raw references. Ours: ONNX Runtime greedy and beam 5, with float and with
   int8 weights (`model.int8.onnx`), one batch at a time on every CPU and `INTER_THREADS`
   batches at once (`OnnxTranslator(inter_threads=...)`), each still of 64 sentences.
3. `--decode-only` repeats step 2's decoding (ours exported again, with this tree's code) on the
   models an earlier `--quality` run left in ROOT/quality: a change to the search or the
   export against the same peer, without training again.

Each training runs in a subprocess; this process never imports TensorFlow (ONNX Runtime and
TensorFlow in one process have crashed here, `../shared/STACK.md`).
"""

import argparse
import functools
import json
import os
import re
import shutil
import statistics
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import yaml
from common import PROJECT_ROOT, alternate

sys.path.insert(0, str(PROJECT_ROOT))

from pipeline.decoding.evaluation import score_translations  # noqa: E402

PEER = PROJECT_ROOT.parent / "shared" / "peers" / "tf_tutorial_nmt.py"
SPA_ENG = PROJECT_ROOT.parent / "shared" / "data" / "spa-eng" / "spa.txt"
SPA_ENG_LINES = 118_964
TEST_SIZE, VALID_SIZE = 2000, 1280
BATCH_SIZE = 64
WINDOW = 100  # steps per timing window, on both sides
INTER_THREADS = 2  # our runtime's batches at once, each on one CPU, in the rows that say so
OUR_MODEL = {
    "cell_type": "gru", "embedding_dim": 256, "encoder_units": 256, "bidirectional": True,
    "merge_mode": "sum", "decoder_units": 256, "attention": "multi_head", "attention_heads": 1,
    "attention_units": 256, "attention_qk_norm": False, "attention_project_values": True,
    "input_feeding": False, "bridge": "zero", "dropout": 0.0,
}  # fmt: skip
ENVIRONMENT = {**os.environ, "TF_CPP_MIN_LOG_LEVEL": "3", "PYTHONPATH": str(PROJECT_ROOT)}


def split_corpus(data_dir):
    """The peer's split of spa.txt, as Spanish<TAB>English TSVs in `data_dir`; their paths."""
    data_dir.mkdir(parents=True, exist_ok=True)
    paths = {split: data_dir / f"{split}.tsv" for split in ("train", "valid", "test")}
    if all(p.exists() for p in paths.values()):
        return paths
    lines = SPA_ENG.read_text(encoding="utf-8").splitlines()
    assert len(lines) == SPA_ENG_LINES, f"{SPA_ENG}: {len(lines)} lines"
    pairs = [line.split("\t")[:2] for line in lines]  # English, Spanish
    order = np.random.default_rng(0).permutation(SPA_ENG_LINES)
    splits = {
        "test": order[-TEST_SIZE:],
        "valid": order[-(TEST_SIZE + VALID_SIZE) : -TEST_SIZE],
        "train": order[: -(TEST_SIZE + VALID_SIZE)],
    }
    for split, indices in splits.items():
        rows = "".join(f"{pairs[i][1]}\t{pairs[i][0]}\n" for i in indices)
        paths[split].write_text(rows, encoding="utf-8")
    return paths


def write_our_config(root, paths, precision):
    config = {
        "data": {
            "train_tsv": str(paths["train"]), "valid_tsv": str(paths["valid"]),
            "source_vocab_size": 5000, "target_vocab_size": 5000,
        },
        "model": OUR_MODEL,
        "train": {"batch_size": BATCH_SIZE, "bleu_every_epochs": 0, "precision": precision},
    }  # fmt: skip
    path = root / "ours.yaml"
    path.write_text(yaml.safe_dump(config, sort_keys=False), encoding="utf-8")
    return path


def run(command, log_path):
    """Runs `command`, its output to `log_path`; the output, or an exit naming the log."""
    with open(log_path, "w", encoding="utf-8") as log:
        code = subprocess.run(
            command, cwd=PROJECT_ROOT, env=ENVIRONMENT, stdout=log, stderr=subprocess.STDOUT
        ).returncode
    output = Path(log_path).read_text(encoding="utf-8", errors="replace")
    if code:
        sys.exit(f"{' '.join(map(str, command))} failed (exit {code}); see {log_path}")
    return output


def json_lines(output):
    return [json.loads(line) for line in output.splitlines() if line.startswith("{")]


def train_peer(workdir, steps, max_seconds=None):
    """The peer's own `train`: its window figures and summary."""
    workdir.mkdir(parents=True, exist_ok=True)
    command = [sys.executable, str(PEER), "train", "--workdir", str(workdir),
               "--data", str(SPA_ENG), "--window", str(WINDOW)]  # fmt: skip
    if steps:
        command += ["--steps-per-epoch", str(WINDOW), "--epochs", str(steps // WINDOW)]
    if max_seconds:
        command += ["--max-seconds", str(max_seconds)]
    records = json_lines(run(command, workdir / "train.log"))
    windows = [r for r in records if "window" in r and not r.get("partial")]
    summary = next(r for r in records if "train_seconds" in r)
    return windows, summary


def epoch_figures(output):
    """(seconds a step, target tok/s) of each epoch, from its line in the training's report
    ("epoch 2/4: loss ..., 7,600 target tokens/s, 80 ms a step, 9 s"): the step time is the
    mean of the epoch's steps after its first, without the epoch's end (checkpoint,
    validation)."""
    lines = re.findall(r"^epoch \d+/\d+: .*?([\d,]+) target tokens/s, (\d+) ms a step", output,
                       flags=re.MULTILINE)  # fmt: skip
    return [(int(ms) / 1000, float(tok_per_s.replace(",", ""))) for tok_per_s, ms in lines]


def train_ours(config_path, workdir, steps_per_epoch, epochs, vocabularies=None, validate=True):
    """`python -m pipeline.train` from scratch: (seconds a step, target tok/s) of each epoch
    and the run's training seconds."""
    command = [sys.executable, "-m", "pipeline.train", "--config", str(config_path),
               "--workdir", str(workdir), "--set", f"train.steps_per_epoch={steps_per_epoch}",
               "--set", f"train.epochs={epochs}"]  # fmt: skip
    if vocabularies:
        command += ["--set", f"data.source_vocabulary={vocabularies[0]}",
                    "--set", f"data.target_vocabulary={vocabularies[1]}"]  # fmt: skip
    if not validate:
        command += ["--set", "data.valid_tsv=null"]
    workdir.parent.mkdir(parents=True, exist_ok=True)
    output = run(command, workdir.parent / f"{workdir.name}.log")
    training_seconds = float(re.search(r"Trained for (\d+) s", output).group(1))
    return epoch_figures(output), training_seconds


def median_windows(figures):
    """The median of per-window figures, the first window (tracing) left out when others exist."""
    return statistics.median(figures[1:] or figures)


def speed_round(root, config_path, vocabularies, steps, index):
    # From scratch on both sides: a work directory left by an earlier run would be resumed.
    for side in ("peer", "ours"):
        shutil.rmtree(root / "speed" / f"{side}_{index}", ignore_errors=True)
    peer_windows, _ = train_peer(root / "speed" / f"peer_{index}", steps)
    peer_step = median_windows([w["seconds"] / w["steps"] for w in peer_windows])
    peer_tokens = median_windows([w["tgt_tok_per_s"] for w in peer_windows])
    ours, _ = train_ours(
        config_path,
        root / "speed" / f"ours_{index}",
        WINDOW,
        steps // WINDOW,
        vocabularies,
        validate=False,
    )
    our_step = median_windows([step for step, _ in ours])
    our_tokens = median_windows([tokens for _, tokens in ours])
    return {
        "peer": {"step_s": peer_step, "sentences_per_s": BATCH_SIZE / peer_step,
                 "tgt_tok_per_s": peer_tokens},
        "ours": {"step_s": our_step, "sentences_per_s": BATCH_SIZE / our_step,
                 "tgt_tok_per_s": our_tokens},
    }  # fmt: skip


def print_speed(rounds):
    print("\n| round | peer s/step | ours s/step | peer sent/s | ours sent/s | ratio (sent/s) "
          "| peer tgt tok/s | ours tgt tok/s | ratio (own tokens) |")  # fmt: skip
    print("|---:|---:|---:|---:|---:|---:|---:|---:|---:|")
    for i, r in enumerate(rounds, 1):
        peer, ours = r["peer"], r["ours"]
        print(
            f"| {i} | {peer['step_s']:.4f} | {ours['step_s']:.4f} | "
            f"{peer['sentences_per_s']:,.0f} | {ours['sentences_per_s']:,.0f} | "
            f"{ours['sentences_per_s'] / peer['sentences_per_s']:.2f}x | "
            f"{peer['tgt_tok_per_s']:,.0f} | {ours['tgt_tok_per_s']:,.0f} | "
            f"{ours['tgt_tok_per_s'] / peer['tgt_tok_per_s']:.2f}x |"
        )


def references(path):
    return [line.split("\t")[1] for line in path.read_text(encoding="utf-8").splitlines()]


def sources(path):
    return [line.split("\t")[0] for line in path.read_text(encoding="utf-8").splitlines()]


def decode_ours(translator, sentences, beam_size, single_runs):
    """(hypotheses, seconds for all at batch 64, median ms for one sentence alone)."""
    translator.translate(sentences[:BATCH_SIZE], beam_size=beam_size)  # warm-up
    start = time.perf_counter()
    hypotheses = translator.translate(sentences, beam_size=beam_size)
    seconds = time.perf_counter() - start
    single = []
    for sentence in sentences[:single_runs]:
        start = time.perf_counter()
        translator.translate([sentence], beam_size=beam_size)
        single.append(1000 * (time.perf_counter() - start))
    return hypotheses, seconds, statistics.median(single)


def train_both(root, config_path, vocabularies, speed_rounds, quick):
    """Both sides trained for the peer's own schedule's wall time, and exported."""
    peer_dir, our_dir = root / "quality" / "peer", root / "quality" / "ours"
    _, peer_summary = train_peer(peer_dir, steps=None, max_seconds=60 if quick else None)
    seconds = peer_summary["train_seconds"]
    our_step = statistics.median(r["ours"]["step_s"] for r in speed_rounds)
    steps = max(WINDOW, int(seconds / our_step))
    epochs = 10
    _, our_seconds = train_ours(config_path, our_dir, -(-steps // epochs), epochs, vocabularies)
    run([sys.executable, str(PEER), "export", "--workdir", str(peer_dir), "--data", str(SPA_ENG)],
        peer_dir / "export.log")  # fmt: skip
    print(f"\nTraining: peer {seconds:.0f} s ({peer_summary['steps']} steps, "
          f"{peer_summary['stopped']}); ours {our_seconds:.0f} s ({steps} steps)")  # fmt: skip


def decode_both(root, paths, decode_rounds, quick):
    """The peer's exported greedy and our ONNX exports decode the test set, the sides in turn;
    a table row per system. Ours is exported first, with this tree's code."""
    from export.runtime import OnnxTranslator

    peer_dir, our_dir = root / "quality" / "peer", root / "quality" / "ours"
    run([sys.executable, "-m", "export", "--workdir", str(our_dir), "--formats", "onnx"],
        root / "quality" / "export.log")  # fmt: skip
    test_sources, test_references = sources(paths["test"]), references(paths["test"])
    limit = 200 if quick else None
    if limit:
        test_sources, test_references = test_sources[:limit], test_references[:limit]
    runtimes = [(int8, inter) for inter in (1, INTER_THREADS) for int8 in (False, True)]
    translators = {
        (int8, inter): OnnxTranslator(our_dir / "export" / "onnx", int8=int8, inter_threads=inter)
        for int8, inter in runtimes
    }
    searches = (("greedy", 1), ("beam 5", 5))
    ours = {
        f"ours {search}{' int8' if int8 else ''}"
        f"{f', {inter} batches at once' if inter > 1 else ''} (ONNX Runtime)": (int8, inter, beam)
        for int8, inter in runtimes
        for search, beam in searches
    }
    scores = {}

    def peer_side():
        command = [sys.executable, str(PEER), "evaluate", "--workdir", str(peer_dir),
                   "--data", str(SPA_ENG)] + (["--limit", str(limit)] if limit else [])  # fmt: skip
        peer = json_lines(run(command, peer_dir / "evaluate.log"))[-1]
        scores["peer greedy (SavedModel)"] = peer
        return peer["sentences_per_s"], peer["single_sentence_ms_median"]

    def our_side(name, int8, inter, beam):
        translator = translators[int8, inter]
        hypotheses, total, single_ms = decode_ours(translator, test_sources, beam, 20)
        scores[name] = score_translations(hypotheses, test_references)
        return len(test_sources) / total, single_ms

    rows = alternate(decode_rounds, {  # the sides in turn
        "peer greedy (SavedModel)": peer_side,
        **{name: functools.partial(our_side, name, *setting) for name, setting in ours.items()},
    })  # fmt: skip
    print(f"\nTest: {len(test_sources)} sentences, batch {BATCH_SIZE}; "
          f"medians of {decode_rounds} rounds, the sides in turn")  # fmt: skip
    print("| system | sentences/s (each round) | median | ms for one sentence | BLEU | "
          "lowercased | chrF |")  # fmt: skip
    print("|---|---|---:|---:|---:|---:|---:|")
    peer_rate = statistics.median(r for r, _ in rows["peer greedy (SavedModel)"])
    for name, figures in rows.items():
        rate = statistics.median(r for r, _ in figures)
        single = statistics.median(s for _, s in figures)
        each = ", ".join(f"{r:,.0f}" for r, _ in figures)
        score = scores[name]
        ratio = "" if name.startswith("peer") else f" ({rate / peer_rate:.2f}x)"
        print(f"| {name} | {each} | {rate:,.1f}{ratio} | {single:.1f} | {score['bleu']:.2f} | "
              f"{score['bleu_lowercase']:.2f} | {score['chrf']:.2f} |")  # fmt: skip


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--root", type=Path, required=True, help="work folder (kept)")
    parser.add_argument("--steps", type=int, default=400, help="training steps per side and round")
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--precision", default="float32", help="our train.precision")
    parser.add_argument("--quality", action="store_true", help="also train to the end, decode")
    parser.add_argument("--decode-rounds", type=int, default=3)
    parser.add_argument(
        "--decode-only",
        action="store_true",
        help="no training: decode with ROOT/quality's models, trained by an earlier --quality",
    )
    parser.add_argument("--quick", action="store_true", help="a minute's check of the script")
    args = parser.parse_args(argv)
    if args.quick:
        args.steps, args.rounds, args.decode_rounds = 2 * WINDOW, 1, 1
    root = args.root.resolve()
    paths = split_corpus(root / "data")
    if args.decode_only:
        decode_both(root, paths, args.decode_rounds, args.quick)
        return
    config_path = write_our_config(root, paths, args.precision)
    vocab_dir = root / "vocabularies"
    if not (vocab_dir / "vocab" / "target.model").exists():  # built once, not timed
        train_ours(config_path, vocab_dir, 1, 1, validate=False)
    vocabularies = [vocab_dir / "vocab" / f"{side}.model" for side in ("source", "target")]
    print(f"Training speed: {args.steps} steps a side per round, batch {BATCH_SIZE}, "
          f"our precision {args.precision}; medians over {WINDOW}-step windows")  # fmt: skip
    rounds = []
    for index in range(args.rounds):
        rounds.append(speed_round(root, config_path, vocabularies, args.steps, index))
        print(f"round {index + 1}: {json.dumps(rounds[-1])}", flush=True)
    print_speed(rounds)
    if args.quality:
        train_both(root, config_path, vocabularies, rounds, args.quick)
        decode_both(root, paths, args.decode_rounds, args.quick)


if __name__ == "__main__":
    main()
