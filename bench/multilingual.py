"""One multilingual model beside a bilingual model a direction, and zero-shot beside pivoting.

    python bench/multilingual.py [--root runs/multilingual] [--recipe RECIPE]
        [--parts baselines multilingual zero_shot pivot backtranslated speed report] [--quick]

Every system is `python -m pipeline.train --config RECIPE --workdir ROOT/NAME --set ...`, so
an interrupted part resumes where it stopped (training resumes from its checkpoints, a
scored system is not scored again), and every figure lands in `ROOT/results.json`:

- `baselines`: each direction of the recipe's `data.directions` trained alone, with the same
  model and schedule and its share of the budget: the multi-way set cut to its two languages
  (a vocabulary of theirs, of the same size), `data.directions: SRC-TGT`, and of the recipe's
  steps (`train.steps_per_epoch`, checkpoints and warm-up in proportion) or else of its
  `train.time_budget_hours`, one over the number of directions.
- `multilingual`: the recipe itself (all its directions in one model, within the budget that
  the baselines share).
- `zero_shot`: the recipe trained on the directions into and out of `--pivot` only, with
  their share of the budget.
- Scoring (after each training): test_2016_flickr and test_2017_flickr (where it has both
  languages) of every direction, BLEU cased and lowercased, chrF and the share of
  translations in another language (`pipeline.evaluate --directions`); the zero-shot model
  on the directions it never saw too.
- `pivot`: the zero-shot model translating each unseen direction in two hops through
  `--pivot`, scored as the rest.
- `backtranslated`: the zero-shot model fine-tuned for two more of its epochs on its directions
  and on the unseen ones from its own translations of `--pivot` into their sources
  (`python -m pipeline.backtranslate`, the recipe's beam), scored on every direction.
- `speed`: the multilingual export beside the German->English baseline's export (the same
  model size) in ONNX Runtime, translating German test_2016_flickr: the multilingual one into
  a target language a sentence (mixed) and into English only, the baseline into English; at
  each of `--batch-sizes`, beam as the recipe, the three taking turns over `--rounds`.
- `report`: the tables.

`--quick` runs the tiny smoke recipe (`configs/smoke_multilingual.yaml`) through every part
in minutes: a check of the script, not a measurement.
"""

import argparse
import functools
import json
import statistics
import sys
from pathlib import Path

from common import PROJECT_ROOT, alternate, machine, per_second
from common import run_python as run

sys.path.insert(0, str(PROJECT_ROOT))

from pipeline.config import load_config  # noqa: E402
from pipeline.core import multilingual  # noqa: E402
from pipeline.core.atomic_files import write_text_atomically  # noqa: E402

RECIPE = PROJECT_ROOT / "configs" / "multi30k_multilingual.yaml"
QUICK_RECIPE = PROJECT_ROOT / "configs" / "smoke_multilingual.yaml"
SECOND_TEST = "test_2017_flickr"  # a second test set, where the languages have it
SPEED_DIRECTION = "de-en"  # speed: the bilingual baseline beside the multilingual export
PARTS = ("baselines", "multilingual", "zero_shot", "pivot", "backtranslated", "speed", "report")


class Bench:
    def __init__(self, args):
        self.args, self.root = args, args.root
        self.root.mkdir(parents=True, exist_ok=True)
        self.results_path = self.root / "results.json"
        self.results = (json.loads(self.results_path.read_text())
                        if self.results_path.exists() else {})  # fmt: skip
        self.config = load_config(args.recipe)
        self.data = self.config["data"]
        self.directions = multilingual.training_directions(self.data)

    def save(self):
        write_text_atomically(self.results_path, json.dumps(self.results, indent=1) + "\n")

    def train(self, name, overrides):
        if name in self.results.get("scores", {}):
            return  # trained and scored: a rerun would only score the test split again
        run(["-m", "pipeline.train", "--config", self.args.recipe, "--workdir",
             self.root / name, *[a for o in overrides for a in ("--set", o)]])  # fmt: skip

    def score(self, name, directions=None):
        """Test scores of system `name` ({split: {direction: scores}}), once."""
        done = self.results.setdefault("scores", {}).setdefault(name, {})
        workdir = self.root / name
        for split in ("test", SECOND_TEST):
            if split in done:
                continue
            trained = workdir / "test_report.json"  # training's own test scores, if they do
            if split == "test" and not directions and trained.exists():
                done[split] = json.loads(trained.read_text())["directions"]
            elif split == "test":
                flags = ["--split", "test"] + (["--directions", directions] if directions else [])
                run(["-m", "pipeline.evaluate", "--workdir", workdir, *flags])
                done[split] = json.loads((workdir / "eval_test.json").read_text())["directions"]
            else:
                done[split] = self.score_second_test(workdir, directions)
            self.save()

    def score_second_test(self, workdir, directions):
        """The second test set's directions that have both languages, through TSVs of tagged
        sources (as the model takes them)."""
        from pipeline.core.multilingual import parse_directions
        from pipeline.data.corpus import read_lines

        files = {language: self.data["multiway_test"][language].replace("test_2016_flickr",
                                                                          SECOND_TEST)
                 for language in self.data["multiway_test"]}  # fmt: skip
        present = {language: path for language, path in files.items() if Path(path).exists()}
        config = load_config(workdir / "config.yaml", saved=True)
        asked = (parse_directions(directions, files) if directions
                 else multilingual.training_directions(config["data"]))  # fmt: skip
        wanted = [d for d in asked if d.source in present and d.target in present]
        scores = {}
        for direction in wanted:
            sources = multilingual.tagged(read_lines(present[direction.source]), direction.target)
            tsv = self.root / f"{SECOND_TEST}.{direction}.tsv"
            write_text_atomically(tsv, "".join(f"{s}\t{t}\n" for s, t in zip(
                sources, read_lines(present[direction.target]))))  # fmt: skip
            run(["-m", "pipeline.evaluate", "--workdir", workdir, "--split", tsv])
            report = json.loads((workdir / f"eval_{tsv.name}.json").read_text())
            scores[str(direction)] = {k: report[k] for k in ("bleu", "bleu_lowercase", "chrf")}
        return scores

    def budget_share(self, directions):
        """Overrides that give a system of `directions` directions their share of the recipe's
        budget: its steps (checkpoints and warm-up in proportion) or else its hours."""
        train, fraction = self.config["train"], directions / len(self.directions)
        if train["steps_per_epoch"]:
            return [f"train.{key}={max(1, round(train[key] * fraction))}"
                    for key in ("steps_per_epoch", "checkpoint_every_steps", "warmup_steps")
                    if train[key]]  # fmt: skip
        if train["time_budget_hours"]:
            return [f"train.time_budget_hours={train['time_budget_hours'] * fraction}"]
        return []

    def baselines(self):
        for direction in self.directions:
            name = f"baseline_{direction}"
            cut = {
                split: {lang: path for lang, path in (self.data[f"multiway_{split}"] or {}).items()
                        if lang in (direction.source, direction.target)}
                for split in multilingual.SPLITS
            }  # fmt: skip
            overrides = [f"data.multiway_{split}={json.dumps(files)}"
                         for split, files in cut.items() if files]  # fmt: skip
            overrides.append(f"data.directions={direction}")
            self.train(name, overrides + self.budget_share(1))
            self.score(name)

    def multilingual(self):
        self.train("multilingual", [])
        self.score("multilingual")

    def zero_shot(self):
        """The model of the directions into and out of the pivot, scored on every direction
        between the set's languages: those it never saw are the zero-shot ones."""
        pivot = self.args.pivot
        seen = f"{multilingual.TO_AND_FROM}{pivot}"
        count = len(multilingual.parse_directions(seen, multilingual.languages(self.data)))
        self.train("zero_shot", [f"data.directions={seen}", *self.budget_share(count)])
        every = multilingual.parse_directions(multilingual.ALL_DIRECTIONS,
                                              multilingual.languages(self.data))  # fmt: skip
        self.score("zero_shot", ",".join(map(str, every)))
        self.results["unseen"] = [str(d) for d in every if pivot not in (d.source, d.target)]
        self.save()

    def pivot(self):
        """Each unseen direction in two hops through the pivot language, with the zero-shot
        model, scored on test_2016_flickr."""
        from pipeline.data.corpus import read_lines
        from pipeline.decoding.evaluation import LanguageIdentifier, score_translations
        from pipeline.decoding.translation import Translator
        from pipeline.workdir import load_trained

        done = self.results.setdefault("pivot", {})
        translator = Translator.from_trained(load_trained(self.root / "zero_shot"))
        identify = LanguageIdentifier(self.data["multiway_test"])
        for name in self.results.get("unseen", []):
            if name in done:
                continue
            source, target = name.split("-")
            lines = {
                lang: read_lines(self.data["multiway_test"][lang]) for lang in (source, target)
            }
            middle = translator.translate(lines[source], target_language=self.args.pivot)
            hypotheses = translator.translate(middle, target_language=target)
            done[name] = score_translations(hypotheses, lines[target])
            done[name]["wrong_language"] = identify.wrong_share(hypotheses, target)
            self.save()

    def backtranslated(self):
        """The zero-shot model taught its unseen directions from its own translations through
        the pivot, for two more epochs: its training and test cover every direction."""
        name, model = "backtranslated", self.root / "zero_shot"
        if name not in self.results.get("scores", {}):
            if not (model / "export" / "onnx" / "model.json").is_file():
                run(["-m", "export", "--workdir", model, "--formats", "onnx"])
            run(["-m", "pipeline.backtranslate", "--model", model, "--workdir", self.root / name,
                 "--pivot", self.args.pivot, "--set", "train.epochs=2"])  # fmt: skip
        self.score(name)

    def speed(self):
        """Sentences/s of the multilingual export into a target language a sentence (mixed),
        of the same export into English only, and of the German->English baseline's export,
        at each batch size, the three taking turns."""
        from export.exporter import export_model
        from export.runtime import OnnxTranslator
        from pipeline.data.corpus import read_lines

        names = ("multilingual", f"baseline_{SPEED_DIRECTION}")
        for name in names:
            if not (self.root / name / "export" / "onnx" / "model.json").exists():
                export_model(self.root / name, self.root / name / "export", ["onnx"])
        source, target = SPEED_DIRECTION.split("-")
        sentences = read_lines(self.data["multiway_test"][source])
        others = sorted({d.target for d in self.directions} - {source})
        mixed = [others[i % len(others)] for i in range(len(sentences))]
        systems = {  # name: (work directory, target languages)
            "multilingual, mixed targets": (names[0], mixed),
            f"multilingual, into {target}": (names[0], target),
            f"bilingual {SPEED_DIRECTION}": (names[1], target),  # a multi-way set of two
        }
        figures = {}
        for batch_size in self.args.batch_sizes:
            translators = {name: OnnxTranslator(self.root / workdir / "export" / "onnx",
                                                batch_size=batch_size)
                           for name, (workdir, _) in systems.items()}  # fmt: skip

            def translate(translator, targets):
                translator.translate(sentences, target_language=targets)
                return len(sentences)

            rates = alternate(self.args.rounds, {
                name: functools.partial(per_second, functools.partial(
                    translate, translators[name], targets))
                for name, (_, targets) in systems.items()
            })  # fmt: skip
            figures[str(batch_size)] = {
                name: {"sentences_per_s": r, "median": statistics.median(r)}
                for name, r in rates.items()
            }
        self.results["speed"] = {"direction": SPEED_DIRECTION, "mixed_targets": others,
                                 "batch_sizes": figures}  # fmt: skip
        self.save()

    def report(self):
        scores = self.results.get("scores", {})
        print(f"# {machine(cpus=False)}: {self.args.recipe}")
        for split in ("test", SECOND_TEST):
            print(f"\n### {split}: BLEU (lowercased) / chrF / wrong language %\n")
            systems = [s for s in ("multilingual", "zero_shot", "backtranslated") if s in scores]
            print("| " + " | ".join(["direction", "baseline", *systems, "pivot"]) + " |")
            print("|---|" + "---|" * (len(systems) + 2))
            names = sorted({d for s in scores.values() for d in s.get(split, {})})
            for direction in names:
                cells = [_cell(scores.get(f"baseline_{direction}", {}).get(split, {})
                               .get(direction))]  # fmt: skip
                cells += [_cell(scores[s].get(split, {}).get(direction)) for s in systems]
                pivot = self.results.get("pivot", {}).get(direction) if split == "test" else None
                print(f"| {direction} | " + " | ".join(cells + [_cell(pivot)]) + " |")
        self.report_training_time()
        speed = self.results.get("speed", {})
        for batch_size, systems in speed.get("batch_sizes", {}).items():
            print(f"\n### ONNX Runtime, {speed['direction']} test sentences, batch {batch_size},"
                  " sentences/s (each round)\n")  # fmt: skip
            for name, figures in systems.items():
                each = ", ".join(f"{r:.1f}" for r in figures["sentences_per_s"])
                print(f"- {name}: {each} (median {figures['median']:.1f})")

    def report_training_time(self):
        """Each system's training time (across resumes), the baselines' summed."""
        seconds = {}
        for workdir in sorted(self.root.iterdir()):
            report = workdir / "test_report.json"
            if report.exists():
                seconds[workdir.name] = json.loads(report.read_text())["training_seconds"]
        baselines = [s for name, s in seconds.items() if name.startswith("baseline_")]
        print("\n### Training time (minutes)\n")
        if baselines:
            print(f"- {len(baselines)} baselines together: {sum(baselines) / 60:.1f}")
        for name in ("multilingual", "zero_shot", "backtranslated"):
            if name in seconds:
                print(f"- {name}: {seconds[name] / 60:.1f}")


def _cell(scores):
    if not scores:
        return "-"
    wrong = scores.get("wrong_language")
    return (f"{scores['bleu']} ({scores['bleu_lowercase']}) / {scores['chrf']}"
            + ("" if wrong is None else f" / {wrong}"))  # fmt: skip


def main():
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--root", type=Path, default=PROJECT_ROOT / "runs" / "multilingual")
    parser.add_argument("--recipe", type=Path, default=RECIPE)
    parser.add_argument("--parts", nargs="+", choices=PARTS, default=list(PARTS))
    parser.add_argument("--pivot", default="en", help="zero_shot and pivot: the hub language")
    parser.add_argument("--rounds", type=int, default=2, help="speed: rounds of each system")
    parser.add_argument("--batch-sizes", type=int, nargs="+", default=[1, 64],
                        help="speed: the runtime's batch sizes")  # fmt: skip
    parser.add_argument("--quick", action="store_true", help="the smoke recipe: a check")
    args = parser.parse_args()
    if args.quick:
        args.recipe = QUICK_RECIPE
    bench = Bench(args)
    for part in args.parts:
        getattr(bench, part)()


if __name__ == "__main__":
    main()
