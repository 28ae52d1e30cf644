"""Score given translations with a trained model: the log-probability of each target.

    python -m pipeline.score --workdir DIR --source FILE --target FILE [--output FILE]
        [--alignments FILE] [--batch-size 64] [--errors strict|replace]

Prints a line per pair, `log_prob<TAB>log_prob_per_token<TAB>tokens`: the natural-log
probability of the whole target under the model (teacher-forced, </s> included), the same
divided by the target's token count, and that count. A higher per-token figure is a more
likely translation: sort by it to filter a noisy corpus. Files may be gzipped; they are read
and scored a block at a time, so their size is not limited by memory. `--alignments` writes
each pair's forced alignment, `source-target` links to the most attended source token.
`--workdir` given again for each further model scores with an ensemble (`--weights`).
"""

import argparse
import contextlib
import sys
from pathlib import Path

from pipeline.core.errors import report_user_errors
from pipeline.workdir import add_model_arguments

BLOCK_PAIRS = 4096  # pairs read, sorted and scored together


def parse_args(argv):
    parser = argparse.ArgumentParser(
        prog="python -m pipeline.score",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    add_model_arguments(parser)
    parser.add_argument("--source", type=Path, required=True, help="source sentences")
    parser.add_argument("--target", type=Path, required=True, help="their translations")
    parser.add_argument("--output", type=Path, help="file for the scores (default: stdout)")
    parser.add_argument("--alignments", type=Path, help="file for forced alignments")
    parser.add_argument("--batch-size", type=int, help="default: decode.batch_size")
    parser.add_argument("--errors", choices=("strict", "replace"), default="strict",
                        help="invalid UTF-8 in the input: stop (strict) or replace it")  # fmt: skip
    parser.add_argument("--target-language", metavar="CODE",
                        help="a multilingual model: the language of the targets")  # fmt: skip
    return parser.parse_args(argv)


def blocks(pairs, size):
    """Lists of at most `size` pairs, in order."""
    block = []
    for pair in pairs:
        block.append(pair)
        if len(block) == size:
            yield block
            block = []
    if block:
        yield block


def alignment_links(attention):
    """Pharaoh-style `source-target` links, each target token (</s> left out) to its most
    attended source token."""
    if attention.shape[1] == 0:
        return ""
    return " ".join(f"{int(s)}-{t}" for t, s in enumerate(attention[:-1].argmax(axis=1)))


@report_user_errors
def main(argv=None):
    args = parse_args(sys.argv[1:] if argv is None else argv)
    from pipeline.core.errors import UserError

    if args.batch_size is not None and args.batch_size < 1:
        raise UserError(f"--batch-size must be at least 1, got {args.batch_size}")
    from tqdm import tqdm

    from pipeline.core import multilingual
    from pipeline.core.atomic_files import open_atomically
    from pipeline.data.corpus import iter_aligned
    from pipeline.decoding.scoring import Scorer
    from pipeline.workdir import load_ensemble

    config, model, source_tokenizer, target_tokenizer = load_ensemble(args.workdir, args.weights)
    languages = multilingual.language_tags(config["data"])
    own_target = multilingual.model_languages(config["data"]).get("target")
    # The language checked before any file is read (a blank sentence needs no tag).
    multilingual.tag_requests([""], args.target_language, languages, own_target,
                              "--target-language")  # fmt: skip
    scorer = Scorer(
        model, source_tokenizer, target_tokenizer,
        args.batch_size or config["decode"]["batch_size"], config["decode"]["max_source_length"],
    )  # fmt: skip
    with contextlib.ExitStack() as files:
        out = files.enter_context(open_atomically(args.output)) if args.output else sys.stdout
        links = files.enter_context(open_atomically(args.alignments)) if args.alignments else None
        bar = files.enter_context(tqdm(unit="pair", file=sys.stderr, disable=not args.output))
        pairs = iter_aligned(args.source, args.target, args.errors)
        for block in blocks(pairs, BLOCK_PAIRS):
            sources, targets = zip(*block, strict=True)
            sources = multilingual.tag_requests(sources, args.target_language, languages,
                                                own_target, "--target-language")  # fmt: skip
            for result in scorer.score(sources, list(targets)):
                out.write(f"{result.log_prob:.4f}\t{result.per_token:.4f}\t{result.tokens}\n")
                if links:
                    links.write(alignment_links(result.attention) + "\n")
            out.flush()
            bar.update(len(block))


if __name__ == "__main__":
    main()
