"""Exports of one model side by side in ONNX Runtime: before/after a change to the export.

    python bench/onnx_exports.py --exports BEFORE/onnx AFTER/onnx --tsv test.tsv
                                 [--beam-sizes 1 5] [--batch-sizes 64] [--rounds 3] [--sentences N]

Each export (float weights, and `model.int8.onnx` where the export has one) translates the
first `--sentences` sources of a source<TAB>reference file at each batch size (length-sorted
batches), the exports taking turns `--rounds` times, after one warm-up batch. Prints
sentences/s of every round, their median as a multiple of the first export's, and BLEU/chrF
with sacreBLEU, so that a change to the search or the export is a ratio measured in one run.
No TensorFlow is imported (ONNX Runtime and TensorFlow in one process have crashed here,
`../shared/STACK.md`).
"""

import argparse
import functools
import statistics
import sys
from pathlib import Path

from common import PROJECT_ROOT, alternate, per_second

sys.path.insert(0, str(PROJECT_ROOT))

from export.runtime import OnnxTranslator  # noqa: E402
from pipeline.decoding.evaluation import score_translations  # noqa: E402

DEFAULT_BATCH_SIZES = [64]


def read_tsv(path, limit):
    rows = [line.split("\t")[:2] for line in Path(path).read_text("utf-8").splitlines()]
    rows = rows[:limit] if limit else rows
    return [source for source, _ in rows], [reference for _, reference in rows]


def translators(exports):
    """(label, translator) for each export, float then int8 where it has an int8 model."""
    found = []
    for index, export in enumerate(exports):
        float_model = OnnxTranslator(export)
        found.append((f"{index}: {export}", float_model))
        if float_model.metadata.get("int8_model"):
            int8_model = OnnxTranslator(export, int8=True)
            found.append((f"{index}: {export} int8", int8_model))
    return found


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--exports", nargs="+", type=Path, required=True)
    parser.add_argument("--tsv", type=Path, required=True, help="source<TAB>reference lines")
    parser.add_argument("--beam-sizes", nargs="+", type=int, default=[1, 5])
    parser.add_argument("--batch-sizes", nargs="+", type=int, default=DEFAULT_BATCH_SIZES)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--sentences", type=int, default=0, help="0: all")
    args = parser.parse_args(argv)
    sources, references = read_tsv(args.tsv, args.sentences)
    runtimes = translators(args.exports)
    settings = [(batch, beam) for batch in args.batch_sizes for beam in args.beam_sizes]
    outputs = {}

    def rate(label, translator, batch, beam):
        translator.batch_size = batch
        translator.translate(sources[:batch], beam_size=beam)  # warm-up

        def translate():
            outputs[label, batch, beam] = translator.translate(sources, beam_size=beam)
            return len(sources)

        return per_second(translate)

    rates = alternate(args.rounds, {
        (label, batch, beam): functools.partial(rate, label, translator, batch, beam)
        for label, translator in runtimes for batch, beam in settings
    })  # fmt: skip
    print(f"{len(sources)} sentences, {args.rounds} rounds in turn")
    print("| export | batch | beam | sentences/s (each round) | median | x first | BLEU | chrF |")
    print("|---|---:|---:|---|---:|---:|---:|---:|")
    for batch, beam in settings:
        first = None
        for label, _ in runtimes:
            median = statistics.median(rates[label, batch, beam])
            first = first or median
            score = score_translations(outputs[label, batch, beam], references)
            each = ", ".join(f"{r:,.1f}" for r in rates[label, batch, beam])
            print(f"| {label} | {batch} | {beam} | {each} | {median:,.1f} | {median / first:.2f} "
                  f"| {score['bleu']:.2f} | {score['chrf']:.2f} |")  # fmt: skip


if __name__ == "__main__":
    main()
