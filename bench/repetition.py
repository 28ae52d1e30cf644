"""What `no_repeat_ngram_size` does: test BLEU and chrF, and the outputs that repeat an n-gram,
for each size asked, with an exported model in ONNX Runtime (beam and length penalty of the
export's defaults).

    python bench/repetition.py --export DIR/export [--sizes 0 2 3 4] [--split test_2016_flickr]
                               [--loop-size 3] [--show 5]

An output "repeats" when one of its word n-grams (n = `--loop-size`, on whitespace) occurs
more than once, and "stutters" when a run of two or more words comes twice in a row ("with a
tennis ball with a tennis ball"). The outputs that repeat without the option are shown beside
what each size makes of them.
"""

import argparse
import re
import sys
from pathlib import Path

PROJECT_ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(PROJECT_ROOT))

from export.runtime import OnnxTranslator  # noqa: E402
from pipeline.data.corpus import read_lines  # noqa: E402
from pipeline.decoding.evaluation import score_translations  # noqa: E402

STUTTER = re.compile(r"\b(\w+(?:\W+\w+)+)\W+\1\b")


def loops(text, size):
    words = text.split()
    grams = [tuple(words[i : i + size]) for i in range(len(words) - size + 1)]
    return len(set(grams)) < len(grams)


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--export", type=Path, required=True, help="an export directory")
    parser.add_argument("--sizes", type=int, nargs="+", default=[0, 2, 3, 4])
    parser.add_argument("--split", default="test_2016_flickr")
    parser.add_argument("--source-language", default="de")
    parser.add_argument("--target-language", default="en")
    parser.add_argument("--loop-size", type=int, default=3)
    parser.add_argument("--show", type=int, default=5, help="looping outputs to print")
    args = parser.parse_args(argv)
    data = PROJECT_ROOT / "data" / "multi30k"
    sources = read_lines(data / f"{args.split}.{args.source_language}.gz")
    references = read_lines(data / f"{args.split}.{args.target_language}.gz")
    translator = OnnxTranslator(args.export / "onnx")
    outputs = {}
    print(f"{args.split}: {len(sources)} sentences, the export's default search")
    print("\n| no_repeat_ngram_size | BLEU | lowercased | chrF | outputs that repeat | stutter |")
    print("|---:|---:|---:|---:|---:|---:|")
    for size in args.sizes:
        outputs[size] = translator.translate(sources, no_repeat_ngram_size=size)
        scores = score_translations(outputs[size], references)
        looping = sum(loops(text, args.loop_size) for text in outputs[size])
        stuttering = sum(bool(STUTTER.search(text)) for text in outputs[size])
        print(f"| {size} | {scores['bleu']:.2f} | {scores['bleu_lowercase']:.2f} | "
              f"{scores['chrf']:.2f} | {looping} | {stuttering} |", flush=True)  # fmt: skip
    first = args.sizes[0]
    looping = [i for i, text in enumerate(outputs[first]) if STUTTER.search(text)]
    for i in looping[: args.show]:
        print(f"\nsentence {i + 1}: {sources[i]}\n  reference: {references[i]}")
        for size in args.sizes:
            print(f"  {size}: {outputs[size][i]}")


if __name__ == "__main__":
    main()
