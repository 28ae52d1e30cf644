"""Does data ever stall training? The training stream alone against the model training on it.

    python bench/input_pipeline.py [--config configs/default.yaml] [--batches 600] [--steps 150]
                                   [--rounds 2]

Builds the recipe's training stream exactly as `pipeline.train` does (corpus scan, vocabularies
from the sample, tokenisation in the stream's parallel map, filtering, shuffling, bucketing),
then alternates, `--rounds` times: iterating `--batches` batches with no model (after a warm-up
that fills the shuffle buffer), and training the recipe's model for `--steps` steps on a fresh
stream (after 20 untimed steps that trace the step). Prints batches/s and target tokens/s of
each, and their ratio: how many times faster than training the input pipeline delivers.
"""

import argparse
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")
from common import PROJECT_ROOT, alternate

sys.path.insert(0, str(PROJECT_ROOT))

import keras  # noqa: E402
import tensorflow as tf  # noqa: E402

from pipeline.config import load_config  # noqa: E402
from pipeline.data.corpus import scan_training_corpora  # noqa: E402
from pipeline.data.dataset import StreamCounters, batching_options, make_training_stream  # noqa: E402
from pipeline.data.tokenizer import prepare_tokenizers  # noqa: E402
from pipeline.model_types.builder import build_model  # noqa: E402
from pipeline.training.optimizers import make_optimizer  # noqa: E402

WARMUP_STEPS = 20


def target_tokens(labels):
    return int(tf.math.count_nonzero(labels))


def iterate(make_stream, batches):
    """(batches/s, target tokens/s) of the stream alone."""
    iterator = iter(make_stream())
    next(iterator)  # the shuffle buffer fills
    start, tokens = time.perf_counter(), 0
    for _ in range(batches):
        tokens += target_tokens(next(iterator)[1])
    seconds = time.perf_counter() - start
    return batches / seconds, tokens / seconds


class StepTimer(keras.callbacks.Callback):
    def on_train_batch_end(self, batch, logs=None):
        if batch + 1 == WARMUP_STEPS:
            self.start = time.perf_counter()

    def on_train_end(self, logs=None):
        self.seconds = time.perf_counter() - self.start


def train(config, tokenizers, make_stream, steps):
    """(steps/s, target tokens/s) of training on the stream, step tracing excluded."""
    model = build_model(config, tokenizers[0].vocab_size, tokenizers[1].vocab_size)
    model.compile(optimizer=make_optimizer(config["train"]))
    counted = make_stream().take(WARMUP_STEPS + steps)
    tokens = sum(target_tokens(labels) for _, labels in counted.skip(WARMUP_STEPS))
    timer = StepTimer()
    model.fit(counted, epochs=1, steps_per_epoch=WARMUP_STEPS + steps, callbacks=[timer],
              shuffle=False, verbose=0)  # fmt: skip
    return steps / timer.seconds, tokens / timer.seconds


def main():
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--config", type=Path, default=PROJECT_ROOT / "configs" / "default.yaml")
    parser.add_argument("--batches", type=int, default=600)
    parser.add_argument("--steps", type=int, default=150)
    parser.add_argument("--rounds", type=int, default=2)
    args = parser.parse_args()
    config = load_config(args.config)
    data, train_config = config["data"], config["train"]
    keras.utils.set_random_seed(train_config["seed"])  # before the tokenizers: it drops them
    corpora, source_sample, target_sample = scan_training_corpora(
        data, data["vocab_sample_size"], train_config["seed"], log=lambda _: None
    )
    with tempfile.TemporaryDirectory() as workdir:
        tokenizers = prepare_tokenizers(
            workdir, data, {"source": source_sample, "target": target_sample}, lambda _: None
        )

    def make_stream():
        dataset, _ = make_training_stream(
            corpora, *tokenizers, data, batching_options(config),
            StreamCounters(corpora, [0] * len(corpora)), train_config["shuffle_buffer"],
            train_config["seed"],
        )  # fmt: skip
        return dataset

    results = alternate(args.rounds, {
        "input pipeline alone": lambda: iterate(make_stream, args.batches),
        "training": lambda: train(config, tokenizers, make_stream, args.steps),
    })  # fmt: skip
    print(f"# {args.config.name}: {corpora[0].name}, batch {train_config['batch_size']}; "
          f"medians of {args.rounds} alternating rounds")  # fmt: skip
    print("| | batches/s | target tokens/s |\n|---|---:|---:|")
    medians = {}
    for name, rates in results.items():
        medians[name] = [statistics.median(column) for column in zip(*rates)]
        print(f"| {name} | {medians[name][0]:,.1f} | {medians[name][1]:,.0f} |")
    ratio = medians["input pipeline alone"][0] / medians["training"][0]
    print(f"\nThe input pipeline delivers batches {ratio:.1f}x as fast as training consumes them "
          f"(goal: at least 5x): {'PASS' if ratio >= 5 else 'FAIL'}")  # fmt: skip


if __name__ == "__main__":
    main()
