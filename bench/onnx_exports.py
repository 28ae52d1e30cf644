"""Exports of one model side by side in ONNX Runtime: before/after a change to the export.

    python bench/onnx_exports.py --exports BEFORE/onnx AFTER/onnx --tsv test.tsv
                                 [--beam-sizes 1 5] [--rounds 3] [--sentences N]

Each export (float weights, and `model.int8.onnx` where the export has one) translates the
first `--sentences` sources of a source<TAB>reference file at batch 64 (length-sorted), the
exports taking turns `--rounds` times, after one warm-up batch. Prints sentences/s of every
round, their median as a multiple of the first export's, and BLEU/chrF with sacreBLEU, so that
a change to the search or the export is a ratio measured in one run. No TensorFlow is
imported (ONNX Runtime and TensorFlow in one process have crashed here, `../shared/STACK.md`).
"""

import argparse
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from export.runtime import OnnxTranslator  # noqa: E402
from pipeline.decoding.evaluation import score_translations  # noqa: E402

BATCH_SIZE = 64


def read_tsv(path, limit):
    rows = [line.split("\t")[:2] for line in Path(path).read_text("utf-8").splitlines()]
    rows = rows[:limit] if limit else rows
    return [source for source, _ in rows], [reference for _, reference in rows]


def translators(exports):
    """(label, translator) for each export, float then int8 where it has an int8 model."""
    found = []
    for index, export in enumerate(exports):
        float_model = OnnxTranslator(export, batch_size=BATCH_SIZE)
        found.append((f"{index}: {export}", float_model))
        if float_model.metadata.get("int8_model"):
            int8_model = OnnxTranslator(export, batch_size=BATCH_SIZE, int8=True)
            found.append((f"{index}: {export} int8", int8_model))
    return found


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--exports", nargs="+", type=Path, required=True)
    parser.add_argument("--tsv", type=Path, required=True, help="source<TAB>reference lines")
    parser.add_argument("--beam-sizes", nargs="+", type=int, default=[1, 5])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--sentences", type=int, default=0, help="0: all")
    args = parser.parse_args(argv)
    sources, references = read_tsv(args.tsv, args.sentences)
    runtimes = translators(args.exports)
    rates = {(label, beam): [] for label, _ in runtimes for beam in args.beam_sizes}
    outputs = {}
    for _ in range(args.rounds):
        for label, translator in runtimes:
            for beam in args.beam_sizes:
                translator.translate(sources[:BATCH_SIZE], beam_size=beam)  # warm-up
                start = time.perf_counter()
                outputs[label, beam] = translator.translate(sources, beam_size=beam)
                rates[label, beam].append(len(sources) / (time.perf_counter() - start))
    print(f"{len(sources)} sentences, batch {BATCH_SIZE}, {args.rounds} rounds in turn")
    print("| export | beam | sentences/s (each round) | median | x first | BLEU | chrF |")
    print("|---|---:|---|---:|---:|---:|---:|")
    for beam in args.beam_sizes:
        first = None
        for label, _ in runtimes:
            median = statistics.median(rates[label, beam])
            first = first or median
            score = score_translations(outputs[label, beam], references)
            each = ", ".join(f"{r:,.0f}" for r in rates[label, beam])
            print(f"| {label} | {beam} | {each} | {median:,.1f} | {median / first:.2f} | "
                  f"{score['bleu']:.2f} | {score['chrf']:.2f} |")  # fmt: skip


if __name__ == "__main__":
    main()
