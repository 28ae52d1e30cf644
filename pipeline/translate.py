"""Translate text with a trained model: one translation per input line.

    python -m pipeline.translate --workdir DIR [--input FILE] [--beam-size 5] [--n-best 3]
        [--length-penalty 0.6] [--sampling-temperature T --sampling-topk K] [--scores]
        [--alignments FILE] [--plot DIR]
        [--target-language fr | --target-languages FILE | --languages-in-input]
        [--source-language de | --source-languages FILE]

Reads standard input unless --input is given. With --n-best N > 1 each input line gives N
lines of `index<TAB>rank<TAB>score<TAB>translation`; with --scores, `score<TAB>translation`.
`--workdir` given again for each further model translates with an ensemble of them (one
vocabulary; the first model's search settings): at each step, the weighted mean (`--weights
W ...`) of the models' log-probabilities.
"""

import argparse
import sys
from pathlib import Path

import numpy as np

from pipeline.core.errors import UserError, report_user_errors
from pipeline.decoding.search_options import add_search_arguments, search_arguments
from pipeline.workdir import add_model_arguments


def parse_args(argv):
    parser = argparse.ArgumentParser(
        prog="python -m pipeline.translate",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    add_model_arguments(parser)
    parser.add_argument("--input", type=Path, help="file of sentences (default: stdin)")
    parser.add_argument("--output", type=Path, help="file for translations (default: stdout)")
    parser.add_argument("--errors", choices=("strict", "replace"), default="strict",
                        help="invalid UTF-8 in the input: stop (strict) or replace it")  # fmt: skip
    parser.add_argument("--batch-size", type=int, help="default: decode.batch_size")
    languages = parser.add_mutually_exclusive_group()
    languages.add_argument("--target-language", metavar="CODE",
                           help="a multilingual model: the language to translate into")  # fmt: skip
    languages.add_argument("--target-languages", type=Path, metavar="FILE",
                           help="a multilingual model: a file of language codes, a line per "
                                "input line")  # fmt: skip
    languages.add_argument("--languages-in-input", action="store_true",
                           help="a multilingual model: input lines of LANGUAGE<TAB>sentence, "
                                "each into its language")  # fmt: skip
    sources = parser.add_mutually_exclusive_group()
    sources.add_argument(
        "--source-language",
        metavar="CODE",
        help="a model that takes it (M2M100, NLLB): the input's language",
    )
    sources.add_argument(
        "--source-languages",
        type=Path,
        metavar="FILE",
        help="the same: a file of language codes, a line per input line",
    )
    parser.add_argument("--target-prefix", type=Path,
                        help="file of prefixes, a line per input line: each translation starts "
                             "with its line's text (an empty line: no prefix)")  # fmt: skip
    add_search_arguments(parser)
    output = parser.add_argument_group("output")
    output.add_argument("--scores", action="store_true", help="print each translation's score")
    output.add_argument(
        "--alignments", type=Path, help="write i-j source-target links, a line per translation"
    )
    output.add_argument("--plot", type=Path, help="write each sentence's attention as DIR/N.png")
    return parser.parse_args(argv)


def _check(args):
    """The flags' values, before the model loads: {search option: value given}."""
    if args.batch_size is not None and args.batch_size < 1:
        raise UserError(f"--batch-size must be at least 1, got {args.batch_size}")
    return search_arguments(args)


def load_translator(workdir, batch_size=None, **options):
    """The trained model of `workdir` as a `pipeline.decoding.translation.Translator`, in
    process: its decode configuration overridden by `options` (any search option)."""
    from pipeline.decoding.translation import Translator
    from pipeline.workdir import load_trained

    return Translator.from_trained(load_trained(workdir), batch_size, **options)


def split_language_column(lines):
    """`LANGUAGE<TAB>sentence` lines -> (languages, sentences); a line without a tab is a
    `UserError` naming it."""
    languages, sentences = [], []
    for number, line in enumerate(lines, start=1):
        language, tab, sentence = line.partition("\t")
        if not tab:
            raise UserError(f"input line {number}: no tab; --languages-in-input reads "
                            "LANGUAGE<TAB>sentence lines")  # fmt: skip
        languages.append(language.strip())
        sentences.append(sentence)
    return languages, sentences


def alignment_line(hypothesis):
    """Pharaoh-style `source-target` pairs: each target token to its most attended source."""
    if not hypothesis.source_tokens:
        return ""
    links = np.argmax(hypothesis.attention, axis=1)
    return " ".join(f"{int(s)}-{t}" for t, s in enumerate(links))


@report_user_errors
def main(argv=None):
    args = parse_args(sys.argv[1:] if argv is None else argv)
    search = _check(args)
    from tqdm import tqdm

    from pipeline.data.text_input import read_sentences
    from pipeline.decoding.attention_plot import plot_attention
    from pipeline.decoding.translation import Translator
    from pipeline.workdir import load_ensemble

    # The model first: a bad work directory is reported before anyone types on stdin.
    config, model, source_tokenizer, target_tokenizer = load_ensemble(args.workdir, args.weights)
    sentences = read_sentences(args.input, args.errors)
    prefixes = None
    if args.target_prefix:
        prefixes = read_sentences(args.target_prefix, args.errors)
        if len(prefixes) != len(sentences):
            raise UserError(
                f"{args.target_prefix} has {len(prefixes)} lines but the input has "
                f"{len(sentences)}: a prefix line per input line"
            )
    asked = args.target_language
    if args.target_languages:
        asked = read_sentences(args.target_languages, args.errors)
    if args.languages_in_input:
        asked, sentences = split_language_column(sentences)
    flag = next((f for f, given in (("--target-languages", args.target_languages),
                                    ("--languages-in-input", args.languages_in_input))
                 if given), "--target-language")  # fmt: skip
    source_asked = args.source_language
    if args.source_languages:
        source_asked = read_sentences(args.source_languages, args.errors)
    source_flag = "--source-languages" if args.source_languages else "--source-language"
    translator = Translator.from_trained(
        (config, model, source_tokenizer, target_tokenizer), args.batch_size, **search
    )
    requests = translator.requests(sentences, asked, source_asked, (flag, source_flag),
                                   UserError)  # fmt: skip
    prefixes = translator.target_prefixes(sentences, asked, prefixes, flag, UserError)
    options = translator.options
    with tqdm(
        total=len(sentences), unit="sent", disable=args.input is None, file=sys.stderr
    ) as bar:
        results = translator.hypotheses(requests, prefixes, progress=bar.update)

    out = open(args.output, "w", encoding="utf-8") if args.output else sys.stdout
    with out if args.output else _no_close(out):
        for index, hypotheses in enumerate(results):
            for rank, hypothesis in enumerate(hypotheses):
                if options.n_best > 1:
                    out.write(f"{index}\t{rank}\t{hypothesis.score:.4f}\t{hypothesis.text}\n")
                elif args.scores:
                    out.write(f"{hypothesis.score:.4f}\t{hypothesis.text}\n")
                else:
                    out.write(hypothesis.text + "\n")
    if args.alignments:
        lines = [alignment_line(h) for hypotheses in results for h in hypotheses]
        args.alignments.write_text("".join(line + "\n" for line in lines), encoding="utf-8")
    if args.plot:
        args.plot.mkdir(parents=True, exist_ok=True)
        width = len(str(len(results)))
        for index, hypotheses in enumerate(results):
            plot_attention(hypotheses[0], args.plot / f"{index + 1:0{width}d}.png",
                           title=f"{sentences[index]}\n→ {hypotheses[0].text}")  # fmt: skip


class _no_close:
    """Lets stdout be used in a `with` statement without closing it."""

    def __init__(self, stream):
        self.stream = stream

    def __enter__(self):
        return self.stream

    def __exit__(self, *exc):
        self.stream.flush()


if __name__ == "__main__":
    main()
