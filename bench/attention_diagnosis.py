"""Attention at initialisation and over the first steps of training, per attention variant.

    python bench/attention_diagnosis.py --vocab-from runs/default [--steps 400] [--every 100]
        [--variants NAME ...] [--config configs/default.yaml]

Each variant (`bench/ablation.py`'s VARIANTS: the config with a few settings changed) is built
with the config's seed and trained for `--steps` steps on the config's training data (its
optimizer and schedule, batches of `train.batch_size` length-bucketed pairs), with the
vocabularies of `--vocab-from` (a trained work directory). At step 0 and every `--every` steps
it is measured on one fixed batch of 64 validation pairs, teacher-forced, in training mode
for gradients and in inference mode otherwise:

- score spread: the standard deviation of a query's pre-softmax scores over its real source
  positions, averaged over queries (a layer without one score per position prints "-");
- entropy: each attention distribution's entropy as a fraction of log(source length)
  (1: uniform, 0: one-hot), averaged over real target positions; peak: its largest weight;
- gradient norms of the batch's loss reaching the attention layer, the attentional layer W_c
  (`attentional`), the decoder's recurrent layers and the encoder;
- loss: the training loss averaged over the last `--every` steps.

Prints one JSON line per measurement and a table. Run alone on the machine: it also prints
training tokens/s per variant.
"""

import argparse
import json
import os
import time
from pathlib import Path

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")

import keras  # noqa: E402
import numpy as np  # noqa: E402
import tensorflow as tf  # noqa: E402
from ablation import VARIANTS  # noqa: E402

from pipeline.config import PROJECT_ROOT, load_config  # noqa: E402
from pipeline.data.corpus import read_split  # noqa: E402
from pipeline.data.dataset import batching_options, encode_corpus, make_dataset  # noqa: E402
from pipeline.data.tokenizer import PAD_ID, Tokenizer, vocabulary_paths  # noqa: E402
from pipeline.model_types.builder import build_model  # noqa: E402
from pipeline.training.optimizers import make_optimizer  # noqa: E402

PROBE_SIZE = 64


class ScoreRecorder:
    """Wraps an attention layer's `score` to keep what it returns (eager calls only)."""

    def __init__(self, attention):
        self.scores = []
        if not hasattr(type(attention), "score") or "attend" in vars(type(attention)):
            return  # a layer that overrides `attend` (several heads) has no single score
        original = attention.score

        def recording(query, memory_cache):
            scores = original(query, memory_cache)
            self.scores.append(scores)
            return scores

        attention.score = recording


def _probe_batch(config, tokenizers):
    """The first `PROBE_SIZE` validation pairs, padded: (inputs, labels)."""
    encoded = encode_corpus(
        read_split(config["data"], "valid"), *tokenizers, config["data"], "probe", log=lambda _: 0
    )
    dataset = make_dataset(encoded, PROBE_SIZE, bucket_width=1000, max_length=1000)
    return next(iter(dataset))


def _attention_statistics(model, recorder, inputs):
    recorder.scores.clear()
    _, weights = model.forward(inputs, training=False)
    weights = weights.numpy().astype(np.float64)
    source_mask = inputs["source_ids"].numpy() != PAD_ID  # [batch, src]
    target_mask = inputs["target_input_ids"].numpy() != PAD_ID  # [batch, tgt]
    source_lengths = source_mask.sum(1)
    entropy = -(weights * np.log(np.where(weights > 0, weights, 1.0))).sum(-1)  # [batch, tgt]
    normaliser = np.log(np.maximum(source_lengths, 2))[:, None]
    rows = target_mask & (source_lengths[:, None] > 1)
    statistics = {
        "entropy": float((entropy / normaliser)[rows].mean()),
        "peak": float(weights.max(-1)[rows].mean()),
    }
    if recorder.scores:
        # Fused: one [batch, tgt, src] tensor; stepwise: one [batch, 1, src] per step.
        scores = np.concatenate([s.numpy() for s in recorder.scores], axis=1).astype(np.float64)
        masked = np.where(source_mask[:, None, :], scores, np.nan)
        spread = np.nanstd(masked, axis=-1)
        statistics["score_spread"] = float(spread[rows].mean())
    return statistics


def _gradient_norms(model, inputs, labels):
    with tf.GradientTape() as tape:
        logits, _ = model.forward(inputs, training=True)
        loss = model.compute_loss(y=labels, y_pred=logits)
    decoder = model.decoder
    groups = {
        "attention": decoder.attention.trainable_variables,
        "attentional": decoder.attention_projection.trainable_variables,
        "decoder_rnn": [v for layer in decoder.recurrent_layers for v in layer.trainable_variables],
        "encoder": model.encoder.trainable_variables,
    }
    flat = [v for variables in groups.values() for v in variables]
    gradients = dict(zip((id(v) for v in flat), tape.gradient(loss, flat)))
    return {
        f"grad_{name}": float(tf.linalg.global_norm([gradients[id(v)] for v in variables]))
        for name, variables in groups.items()
    }


def diagnose(name, settings, config_path, vocab_workdir, steps, every):
    config = load_config(config_path, settings)
    keras.utils.set_random_seed(config["train"]["seed"])  # first: it drops tokenizers' resources
    tokenizers = [Tokenizer(path) for path in vocabulary_paths(vocab_workdir)]
    model = build_model(config, tokenizers[0].vocab_size, tokenizers[1].vocab_size)
    optimizer = make_optimizer(config["train"])
    model.compile(optimizer=optimizer)
    recorder = ScoreRecorder(model.decoder.attention)
    inputs, labels = _probe_batch(config, tokenizers)
    encoded = encode_corpus(
        read_split(config["data"], "train"), *tokenizers, config["data"], "train", log=lambda _: 0
    )
    options = batching_options(config)
    batches = iter(make_dataset(encoded, **options).shuffle(10_000, seed=1).repeat())
    rows, losses, tokens, seconds = [], [], 0, 0.0
    for step in range(steps + 1):
        if step % every == 0:
            row = {"variant": name, "step": step, "parameters": model.count_params()}
            row |= _attention_statistics(model, recorder, inputs)
            row |= _gradient_norms(model, inputs, labels)
            if losses:
                row["loss"] = float(np.mean(losses[-every:]))
                row["target_tokens_per_s"] = round(tokens / seconds)
            print(json.dumps(row), flush=True)
            rows.append(row)
        if step == steps:
            break
        batch_inputs, batch_labels = next(batches)
        start = time.perf_counter()
        logs = model.train_on_batch(batch_inputs, batch_labels, return_dict=True)
        seconds += time.perf_counter() - start
        tokens += int(np.sum(batch_labels.numpy() != PAD_ID))
        losses.append(logs["loss"])
    return rows


def main():
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--config", default=str(PROJECT_ROOT / "configs" / "default.yaml"))
    parser.add_argument("--vocab-from", type=Path, required=True, metavar="WORKDIR")
    parser.add_argument("--steps", type=int, default=400)
    parser.add_argument("--every", type=int, default=100)
    parser.add_argument("--variants", nargs="+", default=list(VARIANTS), choices=list(VARIANTS))
    args = parser.parse_args()
    table = []
    for name in args.variants:
        settings = VARIANTS[name]
        table += diagnose(name, settings, args.config, args.vocab_from, args.steps, args.every)
    columns = ["variant", "step", "score_spread", "entropy", "peak", "grad_attention",
               "grad_attentional", "grad_decoder_rnn", "grad_encoder", "loss",
               "target_tokens_per_s"]  # fmt: skip
    print("\n| " + " | ".join(columns) + " |")
    print("|---|" + "---:|" * (len(columns) - 1))
    for row in table:
        cells = [row.get(c, "-") for c in columns]
        print(
            "| " + " | ".join(f"{c:.3g}" if isinstance(c, float) else str(c) for c in cells) + " |"
        )


if __name__ == "__main__":
    main()
