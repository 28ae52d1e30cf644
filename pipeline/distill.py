"""Sequence-level knowledge distillation (Kim and Rush, 2016): a student trained on its
teacher's translations of the training sources.

    python -m pipeline.distill --teacher runs/TEACHER [--teacher runs/OTHER ...]
        --config configs/student.yaml [--workdir DIR] [--set section.key=value ...] [--wait]

1. The teacher's ONNX export (TEACHER/export/onnx, `python -m export` writes it) translates
   the student configuration's `data.train_source`, batched by length, with its recipe's
   search (`distill.beam_size`, `distill.int8` to change it). Several `--teacher`s (one
   vocabulary) teach as their ensemble, exported once to DIR/distilled/teacher/ with the
   first one's search. The translations stream to
   DIR/distilled/ a block at a time; an interrupted run continues after the last block
   written, and the corpus files appear, each whole, only once every line is translated.
2. The student then trains on them as `pipeline.train` trains (reports, checkpoints, resuming,
   export), in the teacher's vocabularies. `distill.min_score` drops the pairs the teacher
   scores lowest; `distill.keep_references` adds the original pairs; `distill.interpolate`
   trains on the hypothesis of the teacher's beam closest to the reference. Changing the
   first two rewrites the corpus from the translations already made.

A command rather than a `data.distill_from` key: the distilled corpus is a product of its own,
made once by a long translation with another model's runtime, and this keeps that phase and its
progress apart from a training that any recipe can then repeat.
"""

import argparse
import functools
import json
import os
import sys
from pathlib import Path

from pipeline.config import DEFAULT_CONFIG, load_config
from pipeline.core.atomic_files import open_atomically, write_text_atomically, writing
from pipeline.core.errors import UserError, report_user_errors

DISTILLED_DIR = "distilled"  # in the student's work directory
# score<TAB>translation lines (the n-best's pairs side by side, where kept), a block at a time
PARTIAL_FILE = "translations.partial"
PROGRESS_FILE = "progress.json"  # the lines and bytes of PARTIAL_FILE that are complete
CORPUS_FILES = ("train.source.txt", "train.target.txt")  # the student's training pairs
DONE_FILE = "done.json"  # written last: what the corpus holds
BLOCK_LINES = 2048  # source lines translated, then written, at a time


def parse_args(argv):
    parser = argparse.ArgumentParser(
        prog="python -m pipeline.distill",
        description=__doc__.split("\n\n")[0],
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--teacher", type=Path, required=True, action="append",
                        help="the teacher's trained and exported work directory; repeated, "
                             "the members of an ensemble teacher (exported here)")  # fmt: skip
    parser.add_argument("--config", type=Path, default=DEFAULT_CONFIG,
                        help="the student's experiment YAML")  # fmt: skip
    parser.add_argument("--workdir", type=Path,
                        help="the student's work directory (default: runs/<config>)")  # fmt: skip
    parser.add_argument("--wait", action="store_true",
                        help="if another command writes to the work directory, wait")  # fmt: skip
    parser.add_argument("--set", action="append", default=[], metavar="SECTION.KEY=VALUE",
                        help="override one configuration value; repeatable")  # fmt: skip
    return parser.parse_args(argv)


def log(message):
    print(message, flush=True)


# Entry-point groups of the ONNX runtime's translator class and of the exporter: the export
# package registers them (pyproject.toml), so that distillation runs and writes a teacher's
# export without importing `export`.
ONNX_TRANSLATOR = "seq2seq_tf.onnx_translator"
MODEL_EXPORTER = "seq2seq_tf.model_exporter"
ENSEMBLE_TEACHER_DIR = "teacher"  # in DISTILLED_DIR: an ensemble teacher's export


def registered(group):
    """The object the export package registers under the entry-point `group`."""
    from importlib.metadata import entry_points

    found = entry_points(group=group)
    if not found:
        raise UserError("pipeline.distill needs the export package's ONNX runtime and exporter: "
                        "install the project (pip install -e .)")  # fmt: skip
    return next(iter(found)).load()


def teacher_export(teacher):
    """The teacher's ONNX export folder; a missing one is a `UserError` saying what to run."""
    onnx = Path(teacher) / "export" / "onnx"
    if not (onnx / "model.json").is_file():
        raise UserError(f"--teacher {teacher}: no ONNX export in {onnx}; run python -m export "
                        f"--workdir {teacher} first")  # fmt: skip
    return onnx


def ensemble_export(teachers, folder):
    """The ONNX export of the ensemble of `teachers` under `folder`, written on first use (the
    members' vocabularies are checked there: one that differs is refused)."""
    onnx = Path(folder) / "onnx"
    if not (onnx / "model.json").is_file():
        log(f"Exporting the ensemble of {len(teachers)} teachers to {folder}")
        first, *others = teachers
        registered(MODEL_EXPORTER)(first, formats=("onnx",), output=folder, ensemble=others,
                                   log=log)  # fmt: skip
    return onnx


def student_config(config, teacher):
    """`config` set to learn in the teacher's vocabularies, refusing settings that contradict
    them or a training set the distillation cannot translate."""
    from pipeline.core import multilingual
    from pipeline.data.tokenizer import SIDES, vocabulary_paths
    from pipeline.workdir import CONFIG_FILE

    data = config["data"]
    if (
        not data["train_source"]
        or data["train_tsv"]
        or data["train_corpora"]
        or (multilingual.is_multilingual(data))
    ):
        raise UserError("pipeline.distill translates data.train_source: give the student's "
                        "training set as data.train_source and data.train_target")  # fmt: skip
    trained = load_config(Path(teacher) / CONFIG_FILE, saved=True)["data"]
    paths = vocabulary_paths(teacher)
    data = dict(data)
    for side, path in zip(SIDES, paths, strict=True):
        given = data[f"{side}_vocabulary"]
        if given and Path(given).read_bytes() != path.read_bytes():
            raise UserError(f"data.{side}_vocabulary ({given}) is not the teacher's {side} "
                            f"vocabulary ({path}); a student learns in its teacher's")  # fmt: skip
        size = f"{side}_vocab_size"
        if data[size] != trained[size]:
            raise UserError(
                f"data.{size} is {data[size]} here but {trained[size]} in the teacher's "
                f"vocabulary ({path}); set it to {trained[size]}"
            )
        data[f"{side}_vocabulary"] = str(path)
    data["shared_vocabulary"] = paths[0] == paths[1]
    languages = multilingual.model_languages(trained)
    for side in SIDES:  # the distilled files' names say no language: the teacher's do
        data[f"{side}_language"] = data[f"{side}_language"] or languages.get(side)
    return {**config, "data": data}


@functools.cache
def _sentence_bleu():
    import sacrebleu

    return sacrebleu.metrics.BLEU(effective_order=True)


def closest_to_reference(hypotheses, reference):
    """Of a teacher's (translation, score) hypotheses, best first, the one of highest sentence
    BLEU against `reference`, the teacher's order breaking ties: the target of Kim and Rush's
    (2016) sequence-level interpolation."""
    bleu = _sentence_bleu()
    return max(hypotheses, key=lambda pair: bleu.sentence_score(pair[0], [reference]).score)


class Distillation:
    """The teacher's translations of `source` into `folder`, resumable a block at a time."""

    def __init__(self, folder, source, teachers, settings, target_language=None, n_best=False):
        """`n_best`: keep every hypothesis of the teacher's beam, best first (for
        `closest_to_reference`), not its best alone."""
        self.folder, self.source = Path(folder), Path(source)
        self.teachers, self.settings = [Path(teacher) for teacher in teachers], settings
        self.target_language = target_language  # a multilingual teacher's, else None
        self.partial, self.progress = self.folder / PARTIAL_FILE, self.folder / PROGRESS_FILE
        self.identity = {"source": str(self.source.resolve()),
                         "teacher": [str(teacher.resolve()) for teacher in self.teachers],
                         "int8": settings["int8"], "beam_size": settings["beam_size"]}  # fmt: skip
        if target_language:
            self.identity["target_language"] = target_language
        self.n_best = n_best
        if n_best:
            self.identity["n_best"] = True

    def export(self):
        """The ONNX export that translates: the teacher's, or its members' ensemble's."""
        if len(self.teachers) == 1:
            return teacher_export(self.teachers[0])
        return ensemble_export(self.teachers, self.folder / ENSEMBLE_TEACHER_DIR)

    def done(self, keep_references, min_score, interpolate=False):
        """Whether the corpus is written from this teacher's translations with these settings
        (other settings rewrite it from the translations, without translating again)."""
        path = self.folder / DONE_FILE
        if not path.is_file():
            return False
        report = json.loads(path.read_text())
        written = (report["identity"], report["references"], report.get("min_score"),
                   report.get("interpolate", False))  # fmt: skip
        return written == (self.identity, keep_references, min_score, interpolate)

    def completed(self):
        """(lines, bytes) of the partial file that are complete (0, 0 for a new start, or when
        what was begun came from another teacher, source or search)."""
        if not (self.progress.is_file() and self.partial.is_file()):
            return 0, 0
        progress = json.loads(self.progress.read_text())
        if progress["identity"] != self.identity:
            return 0, 0
        return progress["lines"], progress["bytes"]

    def translate(self):
        """Translates every source line not yet done, a block at a time, showing progress."""
        from itertools import islice

        from tqdm import tqdm

        from pipeline.data.corpus import iter_lines

        self.folder.mkdir(parents=True, exist_ok=True)
        total = sum(1 for _ in iter_lines(self.source))
        lines, size = self.completed()
        if lines == total:
            log(f"Distillation: all {total:,} lines translated before")
            return
        if lines:
            log(f"Distillation: {lines:,} of {total:,} lines translated before; continuing")
        settings = self.settings
        translator = registered(ONNX_TRANSLATOR)(self.export(), int8=settings["int8"],
                                                 batch_size=settings["batch_size"])  # fmt: skip
        options = {"beam_size": self.settings["beam_size"]} if self.settings["beam_size"] else {}
        beam = options.get("beam_size") or translator.metadata["defaults"].get("beam_size", 1)
        if self.n_best and beam == 1:
            raise UserError(
                "distill.interpolate chooses among the hypotheses of the teacher's "
                "beam: set distill.beam_size above 1 (the teacher searches greedily)"
            )
        kept_per_source = beam if self.n_best else 1
        if self.target_language:
            options["target_language"] = self.target_language
        asked = f" into {self.target_language}" if self.target_language else ""
        with writing(self.partial), open(self.partial, "ab") as partial:
            partial.truncate(size)  # what a stop left after the last recorded block
            remaining = islice(iter_lines(self.source), lines, None)
            with tqdm(total=total, initial=lines, unit="sent", file=sys.stderr,
                      desc=f"Teacher translating{asked}") as bar:  # fmt: skip
                while block := list(islice(remaining, BLOCK_LINES)):
                    lists = translator.translate_n_best(block, kept_per_source, progress=bar.update,
                                                        **options)  # fmt: skip
                    text = "".join("\t".join(f"{score:.4f}\t{translation.replace(chr(9), ' ')}"
                                             for translation, score in hypotheses) + "\n"
                                   for hypotheses in lists)  # fmt: skip
                    partial.write(text.encode("utf-8"))
                    partial.flush()
                    os.fsync(partial.fileno())
                    lines, size = lines + len(block), partial.tell()
                    record = {"identity": self.identity, "lines": lines, "bytes": size}
                    write_text_atomically(self.progress, json.dumps(record) + "\n")

    def write_corpus(self, target, keep_references, min_score, interpolate=False):
        """The student's training files from the finished translations (and the references);
        returns (source path, target path, the report). `interpolate`: each source's
        hypothesis closest to its reference in `target`, not the teacher's best."""
        from pipeline.data.corpus import iter_lines

        source_path, target_path = (self.folder / name for name in CORPUS_FILES)
        kept = dropped = moved = 0
        lines = zip(iter_lines(self.source), iter_lines(self.partial), strict=True)
        if interpolate:
            references = iter_lines(target)
            lines = ((*pair, reference) for pair, reference in zip(lines, references, strict=True))
        with open_atomically(source_path) as sources, open_atomically(target_path) as targets:
            for source, line, *reference in lines:
                fields = line.split("\t")
                hypotheses = list(zip(fields[1::2], map(float, fields[0::2])))
                translation, score = hypotheses[0]
                if reference:
                    translation, score = closest_to_reference(hypotheses, reference[0])
                    moved += translation != hypotheses[0][0]
                if min_score is not None and score < min_score:
                    dropped += 1
                    continue
                sources.write(source + "\n")
                targets.write(translation + "\n")
                kept += 1
            if keep_references:
                for source, reference in zip(iter_lines(self.source), iter_lines(target)):
                    sources.write(source + "\n")
                    targets.write(reference + "\n")
        report = {"identity": self.identity, "distilled_pairs": kept, "dropped": dropped,
                  "references": keep_references, "min_score": min_score,
                  "interpolate": interpolate, "not_the_teachers_best": moved}  # fmt: skip
        write_text_atomically(self.folder / DONE_FILE, json.dumps(report, indent=1) + "\n")
        return source_path, target_path, report


@report_user_errors
def main(argv=None):
    args = parse_args(sys.argv[1:] if argv is None else argv)
    from pipeline.train import train_in

    config = load_config(args.config, args.set)
    if len(args.teacher) == 1:  # an ensemble's members need no export of their own
        teacher_export(args.teacher[0])
    config = student_config(config, args.teacher[0])
    workdir = args.workdir or Path("runs") / args.config.stem
    settings, data = config["distill"], config["data"]
    distillation = Distillation(workdir / DISTILLED_DIR, data["train_source"], args.teacher,
                                settings, n_best=settings["interpolate"])  # fmt: skip
    source, target = (distillation.folder / name for name in CORPUS_FILES)
    corpus_settings = settings["keep_references"], settings["min_score"], settings["interpolate"]
    if not distillation.done(*corpus_settings):
        distillation.translate()
        source, target, report = distillation.write_corpus(data["train_target"], *corpus_settings)
        references = ", with the references" if settings["keep_references"] else ""
        closest = (f", {report['not_the_teachers_best']:,} of them a hypothesis of the beam "
                   "closer to the reference than the teacher's best"
                   if settings["interpolate"] else "")  # fmt: skip
        log(f"Distilled corpus: {report['distilled_pairs']:,} pairs, {report['dropped']:,} "
            f"dropped below distill.min_score{closest}{references}")  # fmt: skip
    config["data"] = {**data, "train_source": str(source), "train_target": str(target)}
    return train_in(config, workdir, args.wait)


if __name__ == "__main__":
    main()
