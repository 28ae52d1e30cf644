"""Evaluate a trained model: BLEU and chrF (sacreBLEU) and perplexity on a split.

    python -m pipeline.evaluate --workdir DIR [--split test|valid|FILE] [--beam-size N]

FILE is a TSV of source<TAB>reference. The report is printed and written to
DIR/eval_<split>.json.
"""

import argparse
import json
import sys
from pathlib import Path

from pipeline.errors import UserError, report_user_errors


def parse_args(argv):
    parser = argparse.ArgumentParser(
        prog="python -m pipeline.evaluate",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--workdir", type=Path, required=True, help="a trained work directory")
    parser.add_argument("--split", default="test", help="test, valid (or val), or a TSV file")
    parser.add_argument("--beam-size", type=int, help="default: the decode section of the config")
    parser.add_argument("--length-penalty", type=float, help="alpha")
    parser.add_argument("--batch-size", type=int)
    return parser.parse_args(argv)


def _corpus(config, split):
    from pipeline.corpus import read_split, read_tsv

    name = {"val": "valid"}.get(split, split)
    if name in ("test", "valid"):
        corpus = read_split(config["data"], name)
        if corpus is None:
            raise UserError(f"the configuration has no {name} data (data.{name}_source)")
        return name, corpus
    return Path(split).name, read_tsv(split)


def translate_split(loaded, split, beam_size=None, length_penalty=None, batch_size=None):
    """Translate a split with a trained model, `load_trained`'s (config, model, source
    tokenizer, target tokenizer), and its decode settings (overridden where given).

    Returns (name, corpus, hypotheses, options): `name` is the split's name.
    """
    from tqdm import tqdm

    from pipeline.translation import SearchOptions, Translator

    config, model, source_tokenizer, target_tokenizer = loaded
    name, corpus = _corpus(config, split)
    options = SearchOptions.from_config(
        config["decode"], beam_size=beam_size, length_penalty=length_penalty
    )
    translator = Translator(
        model, source_tokenizer, target_tokenizer, options,
        batch_size or config["decode"]["batch_size"],
    )  # fmt: skip
    with tqdm(total=len(corpus), unit="sent", file=sys.stderr, desc=f"translating {name}") as bar:
        hypotheses = translator.translate_best(corpus.sources, progress=bar.update)
    return name, corpus, hypotheses, options


@report_user_errors
def main(argv=None):
    args = parse_args(sys.argv[1:] if argv is None else argv)
    if args.beam_size is not None and args.beam_size < 1:
        raise UserError(f"--beam-size must be at least 1, got {args.beam_size}")
    from pipeline.atomic_files import write_text_atomically
    from pipeline.evaluation import corpus_perplexity, score_translations
    from pipeline.workdir import load_trained

    loaded = load_trained(args.workdir)
    config, model, source_tokenizer, target_tokenizer = loaded
    name, corpus, hypotheses, options = translate_split(
        loaded, args.split, args.beam_size, args.length_penalty, args.batch_size
    )
    report = score_translations(hypotheses, corpus.targets)

    perplexity = corpus_perplexity(
        model, corpus, source_tokenizer, target_tokenizer, config, name,
        log=lambda message: print(message, file=sys.stderr),
    )  # fmt: skip
    if perplexity is not None:
        report["perplexity"] = round(perplexity[0], 3)
        report["perplexity_pairs"] = perplexity[1]
    report["search"] = {"beam_size": options.beam_size, "length_penalty": options.length_penalty}
    text = json.dumps(report, indent=2) + "\n"
    write_text_atomically(args.workdir / f"eval_{name}.json", text)
    print(text, end="")


if __name__ == "__main__":
    main()
