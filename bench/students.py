"""Students distilled from the best German->English system, against their teacher, the default
recipe's model and the same student trained on the references.

    python bench/students.py [--root runs/students] [--student configs/STUDENT.yaml]
        [--parts teachers distill references scores speed browser profile report] [--quick]

Every system is trained by the project's own commands under ROOT, so that an interrupted part
resumes (training from its checkpoints, the distillation from its last block, a scored system
is not scored again); every figure lands in ROOT/results.json:

- `teachers`: the default recipe (`configs/default.yaml`) with seeds 1234, 7 and 99, the last
  two in the first one's vocabularies; `teacher_1234` is the default recipe's model.
- `distill`: `python -m pipeline.distill` with the three as an ensemble teacher and the
  student recipe (`--student`), timed: the teacher's translation of the training sources and
  the student's training.
- `references`: the student recipe trained on the references alone (`pipeline.train`, the
  same schedule, the teachers' vocabularies).
- `scores`: test_2016_flickr and test_2017_flickr BLEU (cased, lowercased) and chrF of each
  system with its recipe's search (`pipeline.evaluate`; the ensemble with `--workdir` thrice),
  parameters and the ONNX and int8 ONNX file sizes.
- `speed`: sentences/s in ONNX Runtime of the default model, the ensemble and the student,
  float32 and int8, at batch 1 and 64, greedy and beam 5, the systems taking turns within
  each round (`--rounds`); each system's own search is its recipe's (model.json's default).
- `browser`: sentences/s in headless Chromium through the page of `examples/web/` (its own
  code, timed by the page), int8 and float32, the systems taking turns.
- `profile`: ONNX Runtime's profile of batch-1 greedy translations (int8) of the default
  model and the student: nodes run and kernel time a sentence, by operator type.
- `report`: the tables.

`--extra-exports NAME=DIR ...` times further ONNX exports beside the systems (`speed`,
`browser`), e.g. the same models exported by a previous version; `--timed NAME ...` times
only those named. A greedy export
(`export.onnx_search: greedy`) is timed greedy only.

`--quick` runs the smoke recipe for every system: a check of the script, not a measurement.
"""

import argparse
import functools
import json
import re
import shutil
import statistics
import subprocess
import sys
import time
from pathlib import Path

from common import PROJECT_ROOT, alternate, machine, round_ratios
from common import run_python as run

sys.path.insert(0, str(PROJECT_ROOT))

from pipeline.core.atomic_files import write_text_atomically  # noqa: E402

CONFIGS = PROJECT_ROOT / "configs"
TEACHER_RECIPE, STUDENT_RECIPE = CONFIGS / "default.yaml", CONFIGS / "multi30k_de_en_student.yaml"
QUICK_RECIPE = CONFIGS / "smoke.yaml"
SEEDS = (1234, 7, 99)  # the teacher ensemble's members; the first is the default recipe's
SECOND_TEST = "test_2017_flickr"
PARTS = ("teachers", "distill", "references", "scores", "speed", "browser", "profile", "report")
WEB_EXAMPLE = PROJECT_ROOT / "examples" / "web"


def overrides(settings):
    return [a for setting in settings for a in ("--set", setting)]


class Bench:
    def __init__(self, args):
        self.args, self.root = args, args.root.resolve()
        self.root.mkdir(parents=True, exist_ok=True)
        self.results_path = self.root / "results.json"
        self.results = (json.loads(self.results_path.read_text())
                        if self.results_path.exists() else {})  # fmt: skip
        self.members = [self.root / f"teacher_{seed}" for seed in SEEDS]
        self.quick = ["train.epochs=1"] if args.quick else []

    def save(self):
        write_text_atomically(self.results_path, json.dumps(self.results, indent=1) + "\n")

    def in_teacher_vocabulary(self):
        vocab = self.members[0] / "vocab"
        return [f"data.source_vocabulary={vocab / 'source.model'}",
                f"data.target_vocabulary={vocab / 'target.model'}"]  # fmt: skip

    def teachers(self):
        for seed, workdir in zip(SEEDS, self.members):
            if (workdir / "test_report.json").exists():
                continue
            shared = self.in_teacher_vocabulary() if workdir != self.members[0] else []
            run(["-m", "pipeline.train", "--config", self.args.teacher_recipe, "--workdir",
                 workdir, *overrides([f"train.seed={seed}", *shared, *self.quick])])  # fmt: skip

    def distill(self):
        workdir = self.root / "student"
        if (workdir / "test_report.json").exists():
            return
        started = time.perf_counter()
        teachers = [a for teacher in self.members for a in ("--teacher", teacher)]
        result = run(["-m", "pipeline.distill", *teachers, "--config", self.args.student,
                      "--workdir", workdir,
                      *overrides(self.quick)], stdout=subprocess.PIPE, text=True)  # fmt: skip
        print(result.stdout)
        training = json.loads((workdir / "test_report.json").read_text())["training_seconds"]
        self.results["distillation"] = {
            "seconds": time.perf_counter() - started,
            "student_training_seconds": training,
            "resumed": "translated before; continuing" in result.stdout,
        }
        self.save()

    def references(self):
        workdir = self.root / "student_references"
        if not (workdir / "test_report.json").exists():
            run(["-m", "pipeline.train", "--config", self.args.student, "--workdir", workdir,
                 *overrides([*self.in_teacher_vocabulary(), *self.quick])])  # fmt: skip

    def systems(self):
        """name -> the work directories of a system (several: an ensemble), of those trained
        (a part not run yet leaves its system out, and says so)."""
        others = {name: [self.root / name] for name in self.args.other_students}
        named = {"default": [self.members[0]], "teacher_ensemble": self.members,
                 "student": [self.root / "student"],
                 "student_references": [self.root / "student_references"], **others}  # fmt: skip
        trained = {name: workdirs for name, workdirs in named.items()
                   if all((workdir / "model.keras").exists() for workdir in workdirs)}  # fmt: skip
        if missing := sorted(named.keys() - trained.keys()):
            print(f"not trained yet, left out: {', '.join(missing)}")
        return trained

    def timed(self):
        """The systems whose speed is measured (the student trained on the references runs as
        fast as the student), and the `--extra-exports`; `--timed` where given."""
        return self.args.timed or ["default", "teacher_ensemble", "student",
                                   *self.args.other_students, *self.args.extra_exports]  # fmt: skip

    def exports(self):
        """name -> its ONNX export folder (the ensemble's written under ROOT once)."""
        systems = self.systems()
        found = {name: workdirs[0] / "export" / "onnx" for name, workdirs in systems.items()}
        for name, workdirs in systems.items():
            if len(workdirs) == 1 and not (found[name] / "model.json").exists():
                run(["-m", "export", "--workdir", workdirs[0], "--formats", "onnx"])
        ensemble = self.root / "teacher_ensemble" / "onnx"
        if not (ensemble / "model.json").exists():
            run(["-m", "export", "--ensemble", *self.members, "--formats", "onnx",
                 "--output", ensemble.parent])  # fmt: skip
        found["teacher_ensemble"] = ensemble
        return {**found, **self.args.extra_exports}

    def scores(self):
        done = self.results.setdefault("scores", {})
        test = self.args.test_source
        second = {side: str(test[side]).replace("test_2016_flickr", SECOND_TEST) for side in test}
        tsv = self.root / f"{SECOND_TEST}.tsv"
        if Path(second["source"]).exists() and not tsv.exists():
            from pipeline.data.corpus import read_lines

            pairs = zip(read_lines(second["source"]), read_lines(second["target"]), strict=True)
            write_text_atomically(tsv, "".join(f"{s}\t{t}\n" for s, t in pairs))
        exports = self.exports()
        for name, workdirs in self.systems().items():
            entry = done.setdefault(name, {})
            for split in ("test", SECOND_TEST):
                if split in entry or (split == SECOND_TEST and not tsv.exists()):
                    continue
                flags = [a for w in workdirs for a in ("--workdir", w)]
                run(["-m", "pipeline.evaluate", *flags, "--split",
                     "test" if split == "test" else tsv])  # fmt: skip
                report = sorted(workdirs[0].glob(f"eval_{'test' if split == 'test' else tsv.name}"
                                                 f"{'.ensemble-of-*' if len(workdirs) > 1 else ''}"
                                                 ".json"))[0]  # fmt: skip
                figures = json.loads(report.read_text())
                entry[split] = {k: figures[k] for k in ("bleu", "bleu_lowercase", "chrf")}
                self.save()
            model = json.loads((exports[name] / "model.json").read_text())
            entry["parameters"] = model.get("description", {}).get("parameters")
            entry["megabytes"] = {
                kind: (exports[name] / model[key]).stat().st_size / 1e6
                for kind, key in (("float32", "model"), ("int8", "int8_model"))
            }
            entry["search"] = model["defaults"].get("beam_size", 1)  # 1: a greedy export
            self.save()

    def speed(self):
        from export.runtime import OnnxTranslator
        from pipeline.data.corpus import read_lines

        sentences = read_lines(self.args.test_source["source"])[: self.args.sentences]
        exports = {name: path for name, path in self.exports().items() if name in self.timed()}
        # A greedy export (export.onnx_search: greedy) has no beam 5.
        beams = {name: (1,) if json.loads((path / "model.json").read_text()).get("search")
                 == "greedy" else (1, 5) for name, path in exports.items()}  # fmt: skip
        cells = [(name, int8, batch, beam) for name in exports for int8 in (False, True)
                 for batch in (1, 64) for beam in beams[name]]  # fmt: skip
        translators = {(name, int8): OnnxTranslator(exports[name], int8=int8, batch_size=64)
                       for name in exports for int8 in (False, True)}  # fmt: skip

        def rate(translator, batch, beam):
            """Sentences/s of one timing: a quarter of the sentences one at a time at batch 1,
            all of them at batch 64."""
            started = time.perf_counter()
            if batch == 1:
                for sentence in sentences[: self.args.sentences // 4]:
                    translator.translate([sentence], beam_size=beam)
                count = len(sentences[: self.args.sentences // 4])
            else:
                translator.translate(sentences, beam_size=beam)
                count = len(sentences)
            return count / (time.perf_counter() - started)

        sides = {  # within a round, the systems take turns at each batch size and beam
            (name, int8, batch, beam): functools.partial(rate, translator, batch, beam)
            for batch in (1, 64) for beam in (1, 5)
            for (name, int8), translator in translators.items() if beam in beams[name]
        }  # fmt: skip
        measured = alternate(self.args.rounds, sides)
        rates = {cell: measured[cell] for cell in cells}
        self.results["speed"] = [
            {"system": name, "int8": int8, "batch": batch, "beam": beam,
             "sentences_per_s": r, "median": statistics.median(r)}
            for (name, int8, batch, beam), r in rates.items()
        ]  # fmt: skip
        self.save()

    def browser(self):
        from pipeline.data.corpus import read_lines

        node, chromium = shutil.which("node"), shutil.which("chromium")
        if not (node and chromium and (WEB_EXAMPLE / "node_modules").exists()):
            print("browser: needs node, chromium and examples/web's packages (npm ci); skipped")
            return
        sentences = read_lines(self.args.test_source["source"])[: self.args.browser_sentences]
        exports = self.exports()
        systems = [(name, int8) for name in self.timed() for int8 in (False, True)]
        each = {system: [] for system in systems}  # every sentence's milliseconds

        def rate(name, int8):
            shown = self.drive_page(node, chromium, exports[name], sentences, int8)
            milliseconds = [page["milliseconds"] for page in shown[1:]]  # the first warms
            each[(name, int8)] += milliseconds
            statuses = self.results.setdefault("browser_status", {})
            statuses[f"{name}, {'int8' if int8 else 'float32'}"] = shown[-1]["status"]
            return 1000 * len(milliseconds) / sum(milliseconds)

        rates = alternate(
            self.args.rounds, {system: functools.partial(rate, *system) for system in systems}
        )
        self.results["browser"] = [
            {"system": name, "int8": int8, "sentences_per_s": r, "median": statistics.median(r),
             "median_ms": statistics.median(each[(name, int8)])}
            for (name, int8), r in rates.items()
        ]  # fmt: skip
        self.save()

    def profile(self):
        """Where a sentence's time goes at batch 1 (greedy, int8) in ONNX Runtime: kernel time
        by operator type, and the nodes run a sentence, for the default model and the student."""
        import collections

        import onnxruntime

        from export.runtime import OnnxTranslator, session_options
        from pipeline.data.corpus import read_lines

        sentences = read_lines(self.args.test_source["source"])[: self.args.sentences // 4]
        exports = self.exports()
        found = self.results["profile"] = {}
        for name in ("default", "student"):
            translator = OnnxTranslator(exports[name], int8=True)
            options = session_options()
            options.enable_profiling = True
            options.profile_file_prefix = str(self.root / f"profile_{name}")
            path = exports[name] / translator.metadata["int8_model"]
            translator.session = onnxruntime.InferenceSession(str(path), options)
            for sentence in sentences:
                translator.translate([sentence], beam_size=1)
            events = json.loads(Path(translator.session.end_profiling()).read_text())
            kernels = [e for e in events if e.get("cat") == "Node"
                       and e["name"].endswith("_kernel_time")
                       and e["args"]["op_name"] != "Loop"]  # fmt: skip
            by_type = collections.Counter()
            for event in kernels:
                by_type[event["args"]["op_name"]] += event["dur"]
            runs = sum(e["dur"] for e in events if e["name"] == "model_run")
            found[name] = {"nodes_a_sentence": len(kernels) / len(sentences),
                           "run_ms_a_sentence": runs / 1000 / len(sentences),
                           "kernel_ms_a_sentence": sum(by_type.values()) / 1000 / len(sentences),
                           "by_type_ms": {op: us / 1000 / len(sentences)
                                          for op, us in by_type.most_common(8)}}  # fmt: skip
        self.save()

    def drive_page(self, node, chromium, export, sentences, int8):
        server = subprocess.Popen([node, "serve.mjs", str(export), "--port", "0"],
                                  cwd=WEB_EXAMPLE, stdout=subprocess.PIPE, text=True)  # fmt: skip
        try:
            address = re.search(r"http://\S+/", server.stdout.readline())[0]
            page = address + ("?weights=int8" if int8 else "")
            result = subprocess.run([node, "test/drive.mjs", page, "--browser", chromium,
                                     *sentences], cwd=WEB_EXAMPLE, capture_output=True,
                                    text=True, check=True)  # fmt: skip
            return json.loads(result.stdout)
        finally:
            server.terminate()
            server.wait(timeout=10)

    def report_ratios(self):
        """Each system's sentences/s over the default model's, each with its recipe's search
        (the default model's beam 5, a greedy export's greedy), round by round: the rounds
        took turns, so their ratios are what to read."""
        rounds = {(row["system"], row["int8"], row["batch"], row["beam"]): row["sentences_per_s"]
                  for row in self.results["speed"]}  # fmt: skip
        print("\n### Against the default model, each with its recipe's search: per-round "
              "ratios (median)\n")  # fmt: skip
        print("| system | weights | batch 1 | batch 64 |")
        print("|---|---|---|---|")
        for name in dict.fromkeys(system for system, *_ in rounds):
            if name == "default":
                continue
            beam = 1 if (name, False, 1, 5) not in rounds else 5
            cells = []
            for int8 in (False, True):
                row = []
                for batch in (1, 64):
                    ratios, median = round_ratios(rounds[(name, int8, batch, beam)],
                                                  rounds[("default", int8, batch, 5)])  # fmt: skip
                    each = " ".join(f"{r:.2f}" for r in ratios)
                    row.append(f"{each} ({median:.2f})")
                cells.append(f"| {name} | {'int8' if int8 else 'float32'} | {' | '.join(row)} |")
            print("\n".join(cells))

    def report(self):
        print(
            f"# {machine(cpus=False)}: {self.args.student.name}, teacher recipe "
            f"{self.args.teacher_recipe.name}"
        )
        scores = self.results.get("scores", {})
        print("\n| system | search | test_2016 BLEU (lc) / chrF | test_2017 BLEU (lc) / chrF |"
              " parameters | ONNX MB | int8 MB |")  # fmt: skip
        print("|---|---:|---|---|---:|---:|---:|")
        for name, entry in scores.items():
            cells = [_cell(entry.get(split)) for split in ("test", SECOND_TEST)]
            size = entry.get("megabytes", {})
            print(
                f"| {name} | beam {entry.get('search')} | {' | '.join(cells)} | "
                f"{entry.get('parameters') or 0:,} | {size.get('float32', 0):.1f} | "
                f"{size.get('int8', 0):.1f} |"
            )
        if "distillation" in self.results:
            d = self.results["distillation"]
            print(
                f"\nDistillation: {d['seconds'] / 60:.1f} min in all, of which the student's "
                f"training {d['student_training_seconds'] / 60:.1f} min"
                + (" (resumed: the total is a lower bound)" if d["resumed"] else "")
            )
        if "speed" in self.results:
            print("\n### ONNX Runtime, sentences/s (median of the rounds)\n")
            print("| system | weights | batch | beam 1 | beam 5 |")
            print("|---|---|---:|---:|---:|")
            rows = {}
            for row in self.results["speed"]:
                key = (row["system"], "int8" if row["int8"] else "float32", row["batch"])
                rows.setdefault(key, {})[row["beam"]] = row["median"]
            for (name, weights, batch), beams in rows.items():
                cells = [f"{beams[b]:.1f}" if b in beams else "-" for b in (1, 5)]  # greedy: no 5
                print(f"| {name} | {weights} | {batch} | {' | '.join(cells)} |")
        if "speed" in self.results:
            self.report_ratios()
        if "browser" in self.results:
            print("\n### Chromium, the page's own code, one sentence at a time, sentences/s\n")
            for row in self.results["browser"]:
                each = ", ".join(f"{r:.1f}" for r in row["sentences_per_s"])
                weights = "int8" if row["int8"] else "float32"
                print(
                    f"- {row['system']} ({weights}): {each} (median {row['median']:.1f}; "
                    f"median sentence {row.get('median_ms', 0):.1f} ms)"
                )
            for name, status in self.results.get("browser_status", {}).items():
                print(f"- the page's status line, {name}: {status}")
        for name, figures in self.results.get("profile", {}).items():
            ops = ", ".join(f"{op} {ms:.2f}" for op, ms in figures["by_type_ms"].items())
            print(
                f"\nProfile, {name}, batch 1, greedy, int8, a sentence: "
                f"{figures['run_ms_a_sentence']:.1f} ms a run (profiling on), "
                f"{figures['nodes_a_sentence']:,.0f} nodes run, their kernels "
                f"{figures['kernel_ms_a_sentence']:.1f} ms; the largest (ms): {ops}"
            )


def _cell(scores):
    if not scores:
        return "-"
    return f"{scores['bleu']} ({scores['bleu_lowercase']}) / {scores['chrf']}"


def main():
    from pipeline.config import load_config

    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--root", type=Path, default=PROJECT_ROOT / "runs" / "students")
    parser.add_argument("--student", type=Path, default=STUDENT_RECIPE)
    parser.add_argument("--parts", nargs="+", choices=PARTS, default=list(PARTS))
    parser.add_argument("--rounds", type=int, default=3, help="speed, browser: rounds")
    parser.add_argument(
        "--sentences",
        type=int,
        default=1000,
        help="speed: test sentences at batch 64 (a quarter of them at batch 1); shorter turns "
        "swing by half between rounds on a shared machine",
    )
    parser.add_argument("--browser-sentences", type=int, default=50)
    parser.add_argument("--other-students", nargs="*", default=[], metavar="NAME",
                        help="scores, speed, browser: further students, ROOT/NAME, each "
                             "distilled by hand (pipeline.distill --set ...)")  # fmt: skip
    parser.add_argument("--extra-exports", nargs="*", default=[], metavar="NAME=DIR",
                        help="speed, browser: further ONNX exports (OUT/onnx) timed beside the "
                             "systems, e.g. a previous version's")  # fmt: skip
    parser.add_argument(
        "--timed",
        nargs="*",
        metavar="NAME",
        help="speed, browser: only these systems (default: all)",
    )
    parser.add_argument("--quick", action="store_true", help="the smoke recipe: a check")
    args = parser.parse_args()
    args.extra_exports = dict(
        (name, Path(path).resolve()) for name, path in (e.split("=", 1) for e in args.extra_exports)
    )
    args.teacher_recipe = QUICK_RECIPE if args.quick else TEACHER_RECIPE
    if args.quick:
        args.student = QUICK_RECIPE
    data = load_config(args.teacher_recipe)["data"]
    args.test_source = {"source": data["test_source"], "target": data["test_target"]}
    bench = Bench(args)
    for part in args.parts:
        getattr(bench, part)()


if __name__ == "__main__":
    main()
