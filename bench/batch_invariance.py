"""Does a sentence's translation depend on its batch-mates? The exported model, both runtimes.

    python bench/batch_invariance.py --workdir runs/default [--sentences N] [--seed S]

Decodes the test split with ONNX Runtime (`export.runtime`) and the SavedModel's
`beam_search` signature (through the session loader that TF Serving uses), greedy and beam 5
with its n-best list, three ways: length-sorted batches of 64 (the reference), one sentence
at a time, and batches of 64 in a shuffled order. Prints, for each, how many sentences'
n-best ids differ from the reference, the largest score difference, and the test BLEU of the
best hypotheses. Expects `python -m export --workdir DIR` to have run.
"""

import argparse
import json
import os
from pathlib import Path

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")

import numpy as np  # noqa: E402
import tensorflow as tf  # noqa: E402
import tensorflow_text  # noqa: E402, F401  (the SavedModel's tokenizer ops)
from decoding_runtimes import SessionRuntime, export_directory, latest_version  # noqa: E402

from export.runtime import OnnxTranslator  # noqa: E402
from export.signature import SOURCE_IDS  # noqa: E402
from pipeline.data.corpus import read_split  # noqa: E402
from pipeline.data.tokenizer import EOS_ID, PAD_ID  # noqa: E402
from pipeline.decoding.evaluation import score_translations  # noqa: E402
from pipeline.workdir import load_trained  # noqa: E402


class OnnxSearch:
    name = "ONNX Runtime"

    def __init__(self, export_dir):
        self.translator = OnnxTranslator(export_dir)

    def __call__(self, batch, **options):
        return self.translator.search(batch, **options)


class SessionSearch(SessionRuntime):
    """The `beam_search` signature with any of its options, through the session loader."""

    def __call__(self, batch, **options):
        feeds = {self.inputs[SOURCE_IDS]: batch}
        feeds.update({self.inputs[name]: value for name, value in options.items()})
        return self.session.run(self.outputs, feeds)


def decode(runtime, source_ids, order, batch_size, beam_size, n_best):
    """Each sentence's n-best ids (`[n_best, len]`, trailing padding dropped) and scores,
    decoding `source_ids` in `order` by batches of `batch_size`."""
    results = [None] * len(source_ids)
    for start in range(0, len(order), batch_size):
        indices = order[start : start + batch_size]
        batch = np.zeros((len(indices), max(1, max(len(source_ids[i]) for i in indices))), np.int32)
        for row, index in enumerate(indices):
            batch[row, : len(source_ids[index])] = source_ids[index]
        output = runtime(batch, beam_size=beam_size, n_best=n_best)
        for row, index in enumerate(indices):
            ids = output["ids"][row]
            width = int(np.max(np.nonzero(ids.any(axis=0))[0], initial=-1)) + 1
            results[index] = (ids[:, :width], output["scores"][row])
    return results


def differences(results, reference):
    differing = sum(
        1
        for (ids, _), (ref, _) in zip(results, reference)
        if ids.shape != ref.shape or not np.array_equal(ids, ref)
    )
    score_diff = max(float(np.max(np.abs(s - r))) for (_, s), (_, r) in zip(results, reference))
    return differing, score_diff


def main():
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--workdir", type=Path, default=Path("runs/default"))
    parser.add_argument("--sentences", type=int, default=1000)
    parser.add_argument("--seed", type=int, default=0, help="of the shuffled order")
    args = parser.parse_args()

    config, _, source_tokenizer, target_tokenizer = load_trained(args.workdir)
    test = read_split(config["data"], "test")
    sentences, references = test.sources[: args.sentences], test.targets[: args.sentences]
    limit = config["decode"]["max_source_length"]
    source_ids = [ids[:limit] for ids in source_tokenizer.processor.encode(sentences)]
    export_dir = export_directory(config, args.workdir)
    runtimes = [
        OnnxSearch(export_dir / "onnx"),
        SessionSearch(latest_version(export_dir, config["export"]["model_name"])),
    ]
    by_length = np.argsort([len(ids) for ids in source_ids], kind="stable")
    shuffled = np.random.default_rng(args.seed).permutation(len(source_ids))
    orders = {"batch 64": (by_length, 64), "batch 1": (by_length, 1), "shuffled 64": (shuffled, 64)}
    print(f"# {args.workdir}: {len(sentences)} test sentences")
    print("| runtime | search | decoded as | n-best ≠ batch 64 | max score diff | BLEU |")
    print("|---|---|---|---:|---:|---:|")
    for runtime in runtimes:
        for beam_size, n_best in ((1, 1), (5, 5)):
            search = "greedy" if beam_size == 1 else f"beam {beam_size}, {n_best}-best"
            reference = None
            for name, (order, batch_size) in orders.items():
                results = decode(runtime, source_ids, order, batch_size, beam_size, n_best)
                reference = reference or results
                differing, score_diff = differences(results, reference)
                best = [ids[0][ids[0] != PAD_ID].tolist() for ids, _ in results]
                best = [ids[: ids.index(EOS_ID)] if EOS_ID in ids else ids for ids in best]
                texts = target_tokenizer.detokenize(tf.ragged.constant(best, dtype=tf.int32))
                bleu = score_translations([t.decode() for t in texts.numpy()], references)["bleu"]
                row = [runtime.name, search, name, f"{differing}/{len(results)}",
                       f"{score_diff:.2g}", bleu]  # fmt: skip
                print("| " + " | ".join(map(str, row)) + " |", flush=True)
    print(json.dumps({"workdir": str(args.workdir), "sentences": len(sentences)}))


if __name__ == "__main__":
    main()
