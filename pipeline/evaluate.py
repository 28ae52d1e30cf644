"""Evaluate a trained model: BLEU, chrF and TER (sacreBLEU) and perplexity on a split.

    python -m pipeline.evaluate --workdir DIR [--split test|valid|FILE] [--beam-size N]
        [--directions de-fr,fr-de] [any search flag of pipeline.translate]
    python -m pipeline.evaluate --workdir runs/nllb --split test.tsv \
        --source-language deu_Latn --target-language fra_Latn

FILE is a TSV of source<TAB>reference. The report is printed and written to
DIR/eval_<split>.json. With `--workdir` given again for each further model, an ensemble of
one vocabulary is evaluated (`--weights`), into DIR/eval_<split>.ensemble-of-N.json of the
first model's DIR. An imported many-to-many model (M2M100, NLLB) is told the split's
languages (`--source-language`, `--target-language`), an imported multi-target one its target
language; by default, for the configuration's own test and valid splits, the languages it was
fine-tuned on.
"""

import argparse
import dataclasses
import json
import sys
from pathlib import Path

from pipeline.core.errors import UserError, report_user_errors
from pipeline.core.multilingual import LANGUAGE_NAMES
from pipeline.decoding.search_options import add_search_arguments, search_arguments
from pipeline.workdir import add_model_arguments


def parse_args(argv):
    parser = argparse.ArgumentParser(
        prog="python -m pipeline.evaluate",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    add_model_arguments(parser)
    parser.add_argument("--split", default="test", help="test, valid (or val), or a TSV file")
    parser.add_argument("--batch-size", type=int, help="default: decode.batch_size")
    parser.add_argument("--directions", help="a multilingual model: the directions of the split "
                        "to score, trained or not (zero-shot), as data.directions takes them "
                        "(default: the trained ones)")  # fmt: skip
    for side in ("source", "target"):
        parser.add_argument(f"--{side}-language", metavar="CODE",
                            help=f"an imported many-to-many model (or multi-target, the "
                            f"target): the split's {side} language, by the checkpoint's code "
                            f"(default, for test and valid: data.{side}_language of a fine-tuned "
                            "one)")  # fmt: skip
    # Scored is each sentence's best translation: no n-best list.
    add_search_arguments(parser, exclude=("n_best",))
    return parser.parse_args(argv)


def _corpus(config, split, directions=None):
    from pipeline.core import multilingual
    from pipeline.data.corpus import read_multiway, read_split, read_tsv

    name = {"val": "valid"}.get(split, split)
    if directions is not None and not multilingual.is_multilingual(config["data"]):
        raise UserError("--directions: this model translates one direction")
    if name in ("test", "valid"):
        corpus = (read_split(config["data"], name) if directions is None
                  else read_multiway(config["data"], name, directions))  # fmt: skip
        if corpus is None:
            raise UserError(f"the configuration has no {name} data (data.{name}_source)")
        return name, corpus
    return Path(split).name, read_tsv(split)


def translate_split(loaded, split, batch_size=None, directions=None, languages=(None, None),
                    **search):  # fmt: skip
    """Translate a split with a trained model, `load_trained`'s (config, model, source
    tokenizer, target tokenizer), and its decode settings (overridden by `search`, any
    `SearchOptions` field); `languages`: the split's (source, target) languages, for an
    imported model that is told them (`multilingual.told_languages`; `UserError` when one is
    missing or unknown, or given to another model); for the configuration's own split, its
    pairs' languages by default.

    Returns (name, corpus, hypotheses, options, pairs): `name` is the split's name, `pairs`
    the corpus as the model takes it (an imported model's, after their language tokens).
    """
    from tqdm import tqdm

    from pipeline.core import multilingual
    from pipeline.data.corpus import with_pair_tokens
    from pipeline.decoding.translation import Translator

    name, corpus = _corpus(loaded[0], split, directions)
    data = loaded[0]["data"]
    told = multilingual.told_languages(data)
    if told and name in ("test", "valid"):  # the configuration's split: its pairs' languages
        pair = multilingual.pair_languages(data)
        languages = tuple(asked or (pair.get(side) if f"{side}_language" in told else None)
                          for side, asked in zip(("source", "target"), languages))  # fmt: skip
    translator = Translator.from_trained(loaded, batch_size, **search)
    options = translator.options
    # The split's sources are as the model takes them (a multilingual one's, tagged), but for
    # an imported model told their languages.
    sources, prefixes = _requests(translator, corpus.sources, told, *languages)
    with tqdm(total=len(corpus), unit="sent", file=sys.stderr, desc=f"translating {name}") as bar:
        found = translator.hypotheses(sources, prefixes, progress=bar.update)
    hypotheses = [best[0].text for best in found]
    pairs = corpus
    if told:
        asked = dict(zip(("source", "target"), languages))
        pairs = with_pair_tokens(corpus, *multilingual.pair_tokens(data, languages=asked))
    return name, corpus, hypotheses, options, pairs


def _requests(translator, sources, told, source_language, target_language):
    """(sources, target prefixes) of a split for `translator`'s model, which is `told` the
    languages (`multilingual.told_languages`) of those given."""
    flags = dict(zip(LANGUAGE_NAMES, ("--target-language", "--source-language")))
    for name, language in zip(LANGUAGE_NAMES, (target_language, source_language)):
        if language is not None and name not in told:
            raise UserError(f"{flags[name]}: this model is not told the {name.split('_')[0]} "
                            "language of its split (only an imported many-to-many model is, "
                            "and the target of an imported multi-target one)")  # fmt: skip
    if not told:
        return sources, None
    names = tuple(flags.values())
    return (
        translator.requests(sources, target_language, source_language, names, UserError),
        translator.target_prefixes(sources, target_language, None, names[0], UserError),
    )


@report_user_errors
def main(argv=None):
    args = parse_args(sys.argv[1:] if argv is None else argv)
    search = search_arguments(args)
    from pipeline.core.atomic_files import write_text_atomically
    from pipeline.decoding.evaluation import (
        corpus_perplexity,
        direction_table,
        score_directions,
        score_translations,
    )
    from pipeline.workdir import load_ensemble

    loaded = load_ensemble(args.workdir, args.weights)
    config, model, source_tokenizer, target_tokenizer = loaded
    languages = (args.source_language, args.target_language)
    name, corpus, hypotheses, options, pairs = translate_split(
        loaded, args.split, args.batch_size, args.directions, languages, **search
    )
    report = score_translations(hypotheses, corpus.targets)
    if corpus.directions:  # a multilingual model: a row a direction, the pooled figures above
        report["directions"] = score_directions(hypotheses, corpus)
        print(direction_table(report["directions"]), file=sys.stderr)

    perplexity = corpus_perplexity(
        model, pairs, source_tokenizer, target_tokenizer, config, name,
        log=lambda message: print(message, file=sys.stderr),
    )  # fmt: skip
    if perplexity is not None:
        report["perplexity"] = round(perplexity[0], 3)
        report["perplexity_pairs"] = perplexity[1]
    report["search"] = dataclasses.asdict(options)
    written = args.workdir[0] / f"eval_{name}.json"
    if len(args.workdir) > 1 or args.weights:  # beside the first model's own reports
        report["ensemble"] = {"workdirs": [str(w) for w in args.workdir], "weights": model.weights}
        written = written.with_suffix(f".ensemble-of-{len(args.workdir)}.json")
    text = json.dumps(report, indent=2) + "\n"
    write_text_atomically(written, text)
    print(text, end="")


if __name__ == "__main__":
    main()
