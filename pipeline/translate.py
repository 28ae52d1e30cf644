"""Translate text with a trained model: one translation per input line.

    python -m pipeline.translate --workdir DIR [--input FILE] [--beam-size 5] [--n-best 3]
        [--length-penalty 0.6] [--sampling-temperature T --sampling-topk K] [--scores]
        [--alignments FILE] [--plot DIR]

Reads standard input unless --input is given. With --n-best N > 1 each input line gives N
lines of `index<TAB>rank<TAB>score<TAB>translation`; with --scores, `score<TAB>translation`.
"""

import argparse
import sys
from pathlib import Path

import numpy as np

from pipeline.errors import report_user_errors


def parse_args(argv):
    parser = argparse.ArgumentParser(
        prog="python -m pipeline.translate",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--workdir", type=Path, required=True, help="a trained work directory")
    parser.add_argument("--input", type=Path, help="file of sentences (default: stdin)")
    parser.add_argument("--output", type=Path, help="file for translations (default: stdout)")
    parser.add_argument("--errors", choices=("strict", "replace"), default="strict",
                        help="invalid UTF-8 in the input: stop (strict) or replace it")  # fmt: skip
    search = parser.add_argument_group("search (defaults: the decode section of the config)")
    search.add_argument("--beam-size", type=int)
    search.add_argument("--n-best", type=int, default=1)
    search.add_argument("--length-penalty", type=float, help="alpha")
    search.add_argument("--length-penalty-type", choices=("gnmt", "average"))
    search.add_argument("--coverage-penalty", type=float, help="beta")
    search.add_argument("--min-length", type=int)
    search.add_argument("--no-repeat-ngram-size", type=int,
                        help="no n-gram of this size twice in a translation (0: off)")  # fmt: skip
    search.add_argument("--max-length-ratio", type=float)
    search.add_argument("--sampling-temperature", type=float, help="sample instead of beam search")
    search.add_argument("--sampling-topk", type=int, default=0)
    search.add_argument("--sampling-topp", type=float, default=1.0)
    search.add_argument("--seed", type=int, default=0,
                        help="sampling: each sentence draws from it and its own text")  # fmt: skip
    search.add_argument("--replace-unknown", action="store_true", default=None,
                        help="replace <unk> by the most attended source token")  # fmt: skip
    search.add_argument("--batch-size", type=int)
    search.add_argument("--target-prefix", type=Path,
                        help="file of prefixes, a line per input line: each translation starts "
                             "with its line's text (an empty line: no prefix)")  # fmt: skip
    output = parser.add_argument_group("output")
    output.add_argument("--scores", action="store_true", help="print each translation's score")
    output.add_argument(
        "--alignments", type=Path, help="write i-j source-target links, a line per translation"
    )
    output.add_argument("--plot", type=Path, help="write each sentence's attention as DIR/N.png")
    return parser.parse_args(argv)


def _check(args):
    from pipeline.errors import UserError

    for name in ("beam_size", "n_best", "batch_size"):
        value = getattr(args, name)
        if value is not None and value < 1:
            raise UserError(f"--{name.replace('_', '-')} must be at least 1, got {value}")
    if args.no_repeat_ngram_size is not None and args.no_repeat_ngram_size < 0:
        raise UserError("--no-repeat-ngram-size must be 0 (off) or more")
    if args.beam_size and args.n_best > args.beam_size:
        raise UserError(f"--n-best ({args.n_best}) cannot exceed --beam-size ({args.beam_size})")
    if args.sampling_temperature is not None and args.sampling_temperature <= 0:
        raise UserError("--sampling-temperature must be positive")
    if args.sampling_temperature is not None and args.n_best > 1:
        raise UserError("--n-best needs beam search, not sampling")


def alignment_line(hypothesis):
    """Pharaoh-style `source-target` pairs: each target token to its most attended source."""
    if not hypothesis.source_tokens:
        return ""
    links = np.argmax(hypothesis.attention, axis=1)
    return " ".join(f"{int(s)}-{t}" for t, s in enumerate(links))


@report_user_errors
def main(argv=None):
    args = parse_args(sys.argv[1:] if argv is None else argv)
    _check(args)
    from tqdm import tqdm

    from pipeline.attention_plot import plot_attention
    from pipeline.errors import UserError
    from pipeline.text_input import read_sentences
    from pipeline.translation import SearchOptions, Translator
    from pipeline.workdir import load_trained

    # The model first: a bad work directory is reported before anyone types on stdin.
    config, model, source_tokenizer, target_tokenizer = load_trained(args.workdir)
    sentences = read_sentences(args.input, args.errors)
    prefixes = None
    if args.target_prefix:
        prefixes = read_sentences(args.target_prefix, args.errors)
        if len(prefixes) != len(sentences):
            raise UserError(
                f"{args.target_prefix} has {len(prefixes)} lines but the input has "
                f"{len(sentences)}: a prefix line per input line"
            )
    beam_size = args.beam_size or max(config["decode"]["beam_size"], args.n_best)
    options = SearchOptions.from_config(
        config["decode"],
        beam_size=beam_size,
        n_best=args.n_best,
        length_penalty=args.length_penalty,
        length_penalty_type=args.length_penalty_type,
        coverage_penalty=args.coverage_penalty,
        min_length=args.min_length,
        no_repeat_ngram_size=args.no_repeat_ngram_size,
        max_length_ratio=args.max_length_ratio,
        replace_unknown=args.replace_unknown,
        sampling_temperature=args.sampling_temperature,
        sampling_topk=args.sampling_topk,
        sampling_topp=args.sampling_topp,
        seed=args.seed,
    )
    translator = Translator(
        model, source_tokenizer, target_tokenizer, options,
        args.batch_size or config["decode"]["batch_size"],
    )  # fmt: skip
    with tqdm(
        total=len(sentences), unit="sent", disable=args.input is None, file=sys.stderr
    ) as bar:
        results = translator.translate(sentences, progress=bar.update, target_prefix=prefixes)

    out = open(args.output, "w", encoding="utf-8") if args.output else sys.stdout
    with out if args.output else _no_close(out):
        for index, hypotheses in enumerate(results):
            for rank, hypothesis in enumerate(hypotheses):
                if args.n_best > 1:
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
