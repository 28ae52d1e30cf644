"""Decoding speed and agreement of the three runtimes of a trained, exported model.

    python bench/decoding_runtimes.py --workdir runs/default [--quick] [--sentences N]
        [--baseline-export DIR]

For greedy (beam 1) and beam 5, at batch 1 and batch 64 (length-sorted), on the test split:
the Keras model in process (`pipeline.decoding.search.beam_search` in a `tf.function`), the exported
SavedModel through the session loader that TF Serving uses, and ONNX Runtime
(`export.runtime`). Prints sentences per second, milliseconds per sentence, and how many
sentences' token ids differ from the SavedModel's (with the largest score difference), the
test BLEU of the sentences decoded, and each runtime's speed as a multiple of the session
path's. An export with `model.int8.onnx` adds ONNX Runtime with int8 weights, one with
`ctranslate2/` CTranslate2 with float32 and int8 weights (`CTranslate2Runtime`). Each figure is
the best of `--repeats` timings, the runtimes taking turns. Expects `python -m export
--workdir DIR` to have run (DIR/export). `--baseline-export` adds another export of the same
model (the previous commit's, say) to the turns: a before/after ratio measured in one run.
"""

import argparse
import json
import os
import time
from pathlib import Path

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")

import numpy as np  # noqa: E402
import tensorflow as tf  # noqa: E402
import tensorflow_text  # noqa: E402, F401  (the SavedModel's tokenizer ops)
from common import alternate, machine  # noqa: E402

from export.runtime import OnnxTranslator  # noqa: E402
from export.signature import BEAM_SEARCH, SOURCE_IDS  # noqa: E402
from pipeline.core.graph_function import graph_function  # noqa: E402
from pipeline.data.corpus import read_split  # noqa: E402
from pipeline.data.length_batches import length_sorted_batches  # noqa: E402
from pipeline.data.tokenizer import PAD_ID  # noqa: E402
from pipeline.decoding.evaluation import score_translations  # noqa: E402
from pipeline.decoding.search import beam_search, decode_length_limits  # noqa: E402
from pipeline.workdir import load_trained  # noqa: E402


def batches_of(source_ids, batch_size):
    """Length-sorted, right-padded int32 batches."""
    for indices in length_sorted_batches([len(ids) for ids in source_ids], batch_size):
        rows = [source_ids[i] for i in indices]
        batch = np.zeros((len(rows), max(1, max(map(len, rows)))), np.int32)
        for r, ids in enumerate(rows):
            batch[r, : len(ids)] = ids
        yield indices, batch


class KerasRuntime:
    name = "Keras in process"

    def __init__(self, model, decode):
        def search(source_ids, beam_size, length_penalty):
            limits = decode_length_limits(
                source_ids, PAD_ID, decode["max_length_ratio"], decode["max_length_offset"],
                decode["max_length_cap"],
            )  # fmt: skip
            ids, _, scores, _ = beam_search(
                model, source_ids, limits, beam_size, 1, length_penalty,
                decode["length_penalty_type"],
            )  # fmt: skip
            return ids[:, 0], scores[:, 0]

        self._search = graph_function(
            search,
            input_signature=[
                tf.TensorSpec([None, None], tf.int32),
                tf.TensorSpec([], tf.int32),
                tf.TensorSpec([], tf.float32),
            ],
        )
        self.length_penalty = decode["length_penalty"]

    def __call__(self, batch, beam_size):
        ids, scores = self._search(batch, beam_size, self.length_penalty)
        return ids.numpy(), scores.numpy()


class SessionRuntime:
    name = "SavedModel, session loader"

    def __init__(self, saved_model_dir, label=""):
        self.name = f"{SessionRuntime.name}{label}"
        self.graph = tf.Graph()
        self.session = tf.compat.v1.Session(graph=self.graph)
        with self.graph.as_default():
            meta = tf.compat.v1.saved_model.loader.load(
                self.session, ["serve"], str(saved_model_dir)
            )
        signature = meta.signature_def[BEAM_SEARCH]
        self.inputs = {name: info.name for name, info in signature.inputs.items()}
        self.outputs = {name: signature.outputs[name].name for name in ("ids", "scores")}

    def __call__(self, batch, beam_size):
        feeds = {self.inputs[SOURCE_IDS]: batch, self.inputs["beam_size"]: beam_size}
        out = self.session.run(self.outputs, feeds)
        return out["ids"][:, 0], out["scores"][:, 0]


class OnnxRuntime:
    def __init__(self, export_dir, int8=False, label=""):
        self.translator = OnnxTranslator(export_dir, int8=int8)
        self.name = ("ONNX Runtime, int8" if int8 else "ONNX Runtime") + label

    def __call__(self, batch, beam_size):
        out = self.translator.search(batch, beam_size=beam_size)
        return out["ids"][:, 0], out["scores"][:, 0]


class CTranslate2Runtime:
    """The export's `ctranslate2/` directory (`python -m export --formats ...,ctranslate2`, a
    Transformer), tokens in and out through the SentencePiece pieces. CTranslate2 takes one
    length limit a batch: each batch's longest of ours (the same at batch 1). Its length
    penalty divides by |Y|^alpha, our "average" penalty; with our default (GNMT) it decodes
    without one, so its beam-5 ids may differ from ours where the penalty decides, and its
    scores (log P, no penalty) are not our ranking scores: its score difference says nothing."""

    def __init__(self, directory, source, target, decode, compute_type):
        import ctranslate2

        self.translator = ctranslate2.Translator(
            str(directory), device="cpu", compute_type=compute_type, intra_threads=os.cpu_count()
        )
        self.name = f"CTranslate2, {compute_type}"
        self.source_pieces = [source.id_to_piece(i) for i in range(source.get_piece_size())]
        self.target = target
        self.decode = decode
        average = decode["length_penalty_type"] == "average"
        self.length_penalty = decode["length_penalty"] if average else 0.0

    def __call__(self, batch, beam_size):
        limits = decode_length_limits(
            batch, PAD_ID, self.decode["max_length_ratio"], self.decode["max_length_offset"],
            self.decode["max_length_cap"],
        ).numpy()  # fmt: skip
        results = self.translator.translate_batch(
            [[self.source_pieces[i] for i in row if i != PAD_ID] for row in batch],
            beam_size=beam_size, length_penalty=self.length_penalty, min_decoding_length=0,
            max_decoding_length=int(limits.max()), max_input_length=0, return_end_token=True,
            return_scores=True,
        )  # fmt: skip
        ids = np.full((len(batch), int(limits.max())), PAD_ID, np.int32)
        for row, result in enumerate(results):
            hypothesis = [self.target.piece_to_id(piece) for piece in result.hypotheses[0]]
            ids[row, : len(hypothesis)] = hypothesis
        return ids, np.array([result.scores[0] for result in results], np.float32)


def export_directory(config, workdir):
    return Path(config["export"]["directory"] or Path(workdir) / "export")


def latest_version(export_dir, model_name):
    """The newest SavedModel version directory of an export."""
    versions = Path(export_dir) / "saved_model" / model_name
    return max((p for p in versions.iterdir() if p.name.isdigit()), key=lambda p: int(p.name))


def measure(runtimes, source_ids, batch_size, beam_size, repeats):
    """For each runtime, the best of `repeats` timings (seconds for all sentences, after one
    warm-up batch) and each sentence's ids and score. Repeats take the runtimes in turn, so
    that a passing load on this shared machine weighs on all of them alike; the best is the
    figure least disturbed by it."""
    batches = list(batches_of(source_ids, batch_size))
    for runtime in runtimes:
        runtime(batches[0][1], beam_size)  # tracing, graph optimisation, allocation
    results = [[None] * len(source_ids) for _ in runtimes]

    def timed(r):
        start = time.perf_counter()
        for indices, batch in batches:
            ids, scores = runtimes[r](batch, beam_size)
            for row, index in enumerate(indices):
                results[r][index] = (ids[row], float(scores[row]))
        return time.perf_counter() - start

    timings = alternate(repeats, {r: lambda r=r: timed(r) for r in range(len(runtimes))})
    return [min(seconds, default=float("inf")) for seconds in timings.values()], results


def compare(results, reference):
    """Sentences whose ids differ (padding aside: runtimes may pad to other widths), and the
    largest score difference."""
    differing = sum(
        1
        for (ids, _), (ref, _) in zip(results, reference)
        if not np.array_equal(ids[ids != PAD_ID], ref[ref != PAD_ID])
    )
    score_diff = max(abs(s - r) for (_, s), (_, r) in zip(results, reference))
    return differing, score_diff


def main():
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--workdir", type=Path, default=Path("runs/default"))
    parser.add_argument("--sentences", type=int, default=1000, help="batch-64 sentences")
    parser.add_argument("--batch1-sentences", type=int, default=100)
    parser.add_argument("--repeats", type=int, default=3, help="timings per figure (best kept)")
    parser.add_argument("--quick", action="store_true", help="100 and 20 sentences, 1 repeat")
    parser.add_argument(
        "--baseline-export", type=Path, metavar="DIR",
        help="another export of the same model (e.g. by the previous commit: python -m export "
        "--output DIR): its SavedModel and ONNX model are timed too, in turns with these",
    )  # fmt: skip
    args = parser.parse_args()
    if args.quick:
        args.sentences, args.batch1_sentences, args.repeats = 100, 20, 1

    config, model, source_tokenizer, target_tokenizer = load_trained(args.workdir)
    export_dir = export_directory(config, args.workdir)
    test = read_split(config["data"], "test")
    sentences = test.sources[: args.sentences]
    limit = config["decode"]["max_source_length"]
    source_ids = [ids[:limit] for ids in source_tokenizer.processor.encode(sentences)]

    references = test.targets[: args.sentences]
    runtimes = [
        SessionRuntime(latest_version(export_dir, config["export"]["model_name"])),
        KerasRuntime(model, config["decode"]),
        OnnxRuntime(export_dir),
    ]
    if json.loads((export_dir / "onnx" / "model.json").read_text()).get("int8_model"):
        runtimes.append(OnnxRuntime(export_dir, int8=True))
    if (export_dir / "ctranslate2").is_dir():
        runtimes += [
            CTranslate2Runtime(
                export_dir / "ctranslate2",
                source_tokenizer.processor,
                target_tokenizer.processor,
                config["decode"],
                compute_type,
            )  # fmt: skip
            for compute_type in ("float32", "int8")
        ]
    if args.baseline_export:
        model_name = config["export"]["model_name"]
        runtimes += [
            SessionRuntime(latest_version(args.baseline_export, model_name), " (baseline)"),
            OnnxRuntime(args.baseline_export, label=" (baseline)"),
        ]
    print(f"# {machine()}, tensorflow {tf.__version__}")
    print(
        f"# {args.workdir}, {len(sentences)} test sentences ({args.batch1_sentences} at batch "
        f"1), best of {args.repeats}"
    )
    rows = []
    for beam_size in (1, 5):
        for batch_size in (1, 64):
            subset = source_ids[: args.batch1_sentences] if batch_size == 1 else source_ids
            timings, outputs = measure(runtimes, subset, batch_size, beam_size, args.repeats)
            reference = outputs[0]
            for runtime, seconds, results in zip(runtimes, timings, outputs):
                differing, score_diff = compare(results, reference)
                translations = target_tokenizer.detokenize(tf.ragged.constant(
                    [ids.tolist() for ids, _ in results], dtype=tf.int32
                )).numpy()  # fmt: skip
                quality = score_translations(
                    [t.decode() for t in translations], references[: len(subset)]
                )
                row = {
                    "runtime": runtime.name,
                    "search": "greedy" if beam_size == 1 else f"beam {beam_size}",
                    "batch": batch_size,
                    "sentences": len(subset),
                    "sentences_per_s": round(len(subset) / seconds, 1),
                    "ms_per_sentence": round(1000 * seconds / len(subset), 2),
                    "ids_differing": differing,
                    "max_score_diff": float(f"{score_diff:.2g}"),
                    "bleu": quality["bleu"],
                }
                rows.append(row)
                print(json.dumps(row), flush=True)
    print(
        "\n| search | batch | runtime | sent/s | ms/sent | x session path | ids ≠ SavedModel "
        "| max score diff | BLEU |"
    )
    print("|---|---:|---|---:|---:|---:|---:|---:|---:|")
    for r in rows:
        session = next(
            s for s in rows
            if (s["search"], s["batch"], s["runtime"])
            == (r["search"], r["batch"], SessionRuntime.name)
        )  # fmt: skip
        speedup = r["sentences_per_s"] / session["sentences_per_s"]
        print(
            f"| {r['search']} | {r['batch']} | {r['runtime']} | {r['sentences_per_s']} | "
            f"{r['ms_per_sentence']} | {speedup:.2f} | {r['ids_differing']}/{r['sentences']} | "
            f"{r['max_score_diff']} | {r['bleu']} |"
        )


if __name__ == "__main__":
    main()
