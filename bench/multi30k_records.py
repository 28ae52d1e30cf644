"""Scores of trained recipes on validation and test, the toolkit's way and the published way.

    python bench/multi30k_records.py --workdirs runs/A [runs/B ...] [--average 1 5 10]
        [--beam-sizes 4 5 8] [--length-penalties 0.6 1.0]
        [--held-out data/multi30k/test_2017_flickr]

For each trained work directory, and with `--average` for models averaged from its last N kept
checkpoints (`python -m pipeline.average`, into `WORKDIR-avgN`, reused when present), the
validation and test splits are translated with the recipe's own search and scored:
- sacreBLEU on the raw references, cased and lowercased, and chrF: how this toolkit scores;
- "tok. lc. BLEU": hypotheses and references Moses-tokenised (sacremoses, the target language)
  and lowercased (`pip install -e ".[bench]"`), then BLEU without smoothing, as
  `multi-bleu.perl` computes it: how the published Multi30k anchors are scored, so the two
  can be compared;
- the training time the run reported (its `test_report.json`).
With `--beam-sizes` or `--length-penalties`, validation is translated with every combination
(one row each) and test only with the one of highest validation BLEU, so that the search is
chosen on validation. Choose between recipes on the validation columns only; the test columns
are the record. `--held-out PREFIX` scores one more test set with that same search, read from
`PREFIX.<source language>.gz` and `PREFIX.<target language>.gz`: a second opinion on the
choices, never a ground for them.
"""

import argparse
import json
import os
import subprocess
import sys
from pathlib import Path

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")

PROJECT_ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(PROJECT_ROOT))


def tokenized_lowercase_bleu(hypotheses, references, language):
    """multi-bleu.perl's BLEU of Moses-tokenised, lowercased text (no smoothing)."""
    import sacrebleu
    from sacremoses import MosesTokenizer

    tokenizer = MosesTokenizer(lang=language)

    def prepare(lines):
        return [tokenizer.tokenize(line.lower(), return_str=True, escape=False) for line in lines]

    bleu = sacrebleu.metrics.BLEU(tokenize="none", smooth_method="none", force=True)
    return bleu.corpus_score(prepare(hypotheses), [prepare(references)]).score


def averaged(workdir, last):
    """The work directory of `workdir`'s last `last` checkpoints averaged (made once)."""
    output = workdir.with_name(f"{workdir.name}-avg{last}")
    if not (output / "model.keras").exists():
        command = [sys.executable, "-m", "pipeline.average", "--workdir", str(workdir)]
        subprocess.run(command + ["--last", str(last), "--output", str(output)], check=True)
    return output


def with_test_set(loaded, prefix):
    """`loaded` (`load_trained`'s) with its test split read from `prefix.<language>.gz`."""
    from pipeline.core.multilingual import model_languages

    config, *rest = loaded
    languages = model_languages(config["data"])
    files = {
        f"test_{side}": f"{Path(prefix).resolve()}.{languages[side]}.gz"
        for side in ("source", "target")
    }
    return ({**config, "data": {**config["data"], **files, "test_tsv": None}}, *rest)


def score(loaded, split, beam_size=None, length_penalty=None):
    from pipeline.core.multilingual import model_languages
    from pipeline.decoding.evaluation import score_translations
    from pipeline.evaluate import translate_split

    _, corpus, hypotheses, options, _ = translate_split(
        loaded, split, beam_size=beam_size, length_penalty=length_penalty
    )
    report = score_translations(hypotheses, corpus.targets)
    language = model_languages(loaded[0]["data"]).get("target", "en")
    report["bleu_tok_lc"] = round(tokenized_lowercase_bleu(hypotheses, corpus.targets, language), 2)
    report["search"] = (options.beam_size, options.length_penalty)
    return report


COLUMNS = ("bleu", "bleu_lowercase", "chrf", "bleu_tok_lc")


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--workdirs", type=Path, nargs="+", required=True)
    parser.add_argument(
        "--average", type=int, nargs="*", default=[],
        help="also score the mean of the last N kept checkpoints, for each N",
    )  # fmt: skip
    parser.add_argument("--beam-sizes", type=int, nargs="+", default=[None])
    parser.add_argument("--length-penalties", type=float, nargs="+", default=[None])
    parser.add_argument(
        "--held-out", metavar="PREFIX",
        help="also score PREFIX.<source>.gz -> PREFIX.<target>.gz with the chosen search",
    )  # fmt: skip
    args = parser.parse_args()
    splits = ["valid", "test"] + ([Path(args.held_out).name] if args.held_out else [])
    from pipeline.workdir import load_trained

    print(
        "| model | search | training | "
        + " | ".join(f"{split} {column}" for split in splits for column in COLUMNS)
        + " |"
    )
    print("|---|---|---:|" + "---:|" * len(splits) * len(COLUMNS))
    for workdir in args.workdirs:
        report_path = workdir / "test_report.json"
        seconds = json.loads(report_path.read_text()).get("training_seconds") if (
            report_path.exists()
        ) else None  # fmt: skip
        training = f"{seconds / 60:.0f} min" if seconds else "?"
        for model in [workdir] + [averaged(workdir, last) for last in args.average]:
            loaded = load_trained(model)
            valid = [
                score(loaded, "valid", beam_size, length_penalty)
                for beam_size in args.beam_sizes
                for length_penalty in args.length_penalties
            ]
            best = max(valid, key=lambda report: report["bleu"])
            tests = [score(loaded, "test", *best["search"])]
            if args.held_out:
                tests.append(score(with_test_set(loaded, args.held_out), "test", *best["search"]))
            for report in valid:
                figures = [f"{report[column]:.2f}" for column in COLUMNS]
                tested = report is best
                for test in tests:
                    figures += [f"{test[column]:.2f}" if tested else "" for column in COLUMNS]
                search = "beam {}, lp {}".format(*report["search"])
                row = [model.name, search, training] + figures
                print("| " + " | ".join(row) + " |", flush=True)


if __name__ == "__main__":
    main()
