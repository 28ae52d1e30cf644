"""`python -m pipeline.distill`: a student trained on its teacher's translations, the
distilled corpus written whole only once complete, and a stopped distillation continuing."""

import json
import re

import pytest

from helpers import SMOKE
from pipeline import distill
from pipeline.core.errors import UserError
from pipeline.data.corpus import read_lines

STUDENT = ["--set", "model.embedding_dim=16", "--set", "model.encoder_units=16",
           "--set", "model.decoder_units=16", "--set", "train.bleu_every_epochs=0",
           "--set", "data.test_source=null", "--set", "data.test_target=null"]  # fmt: skip


def run(teacher, workdir, *flags):
    return distill.main(["--teacher", str(teacher), "--config", str(SMOKE),
                         "--workdir", str(workdir), *STUDENT, *flags])  # fmt: skip


def test_a_student_trains_on_its_teachers_translations(exported_workdir, tmp_path, capsys):
    history = run(exported_workdir, tmp_path, "--set", "distill.keep_references=true",
                  "--set", "distill.min_score=-1.5")  # fmt: skip
    captured = capsys.readouterr()
    assert "Teacher translating" in captured.err and len(history["loss"]) == 2
    folder = tmp_path / distill.DISTILLED_DIR
    report = json.loads((folder / distill.DONE_FILE).read_text())
    sources = read_lines(folder / "train.source.txt")
    targets = read_lines(folder / "train.target.txt")
    references = read_lines(SMOKE.parent.parent / "data" / "multi30k" / "val.en.gz")
    assert len(sources) == len(targets) == report["distilled_pairs"] + len(references)
    assert report["dropped"] > 0 and targets[-len(references) :] == references
    scores = [float(line.split("\t")[0]) for line in read_lines(folder / distill.PARTIAL_FILE)]
    assert report["distilled_pairs"] == sum(score >= -1.5 for score in scores)
    assert re.search(r"Distilled corpus: [\d,]+ pairs, [\d,]+ dropped below distill.min_score, "
                     r"with the references", captured.out)  # fmt: skip
    saved = (tmp_path / "config.yaml").read_text()
    assert "distilled/train.target.txt" in saved and "exported/vocab/" in saved
    assert (tmp_path / "model.keras").is_file()


class StopAfter:
    """A teacher that is stopped (KeyboardInterrupt) while translating its `blocks`+1-th
    block."""

    def __init__(self, translator_class, blocks):
        self.translator_class, self.blocks = translator_class, blocks

    def __call__(self, *args, **kwargs):
        translator, left = self.translator_class(*args, **kwargs), [self.blocks]
        translate = translator.translate_n_best

        def translate_n_best(*a, **k):
            if not left[0]:
                raise KeyboardInterrupt
            left[0] -= 1
            return translate(*a, **k)

        translator.translate_n_best = translate_n_best
        return translator


def test_a_stopped_distillation_continues_and_leaves_no_corpus_before_the_end(
    exported_workdir, tmp_path, monkeypatch, capsys
):
    monkeypatch.setattr(distill, "BLOCK_LINES", 300)
    translator_class = distill.registered(distill.ONNX_TRANSLATOR)
    monkeypatch.setattr(distill, "registered", lambda group: StopAfter(translator_class, 2))
    with pytest.raises(KeyboardInterrupt):
        run(exported_workdir, tmp_path / "stopped")
    folder = tmp_path / "stopped" / distill.DISTILLED_DIR
    assert not any((folder / name).exists() for name in (*distill.CORPUS_FILES, "done.json"))
    assert json.loads((folder / distill.PROGRESS_FILE).read_text())["lines"] == 600
    monkeypatch.setattr(distill, "registered", lambda group: translator_class)
    run(exported_workdir, tmp_path / "stopped", "--set", "train.epochs=1")
    assert "600 of 1,014 lines translated before; continuing" in capsys.readouterr().out
    run(exported_workdir, tmp_path / "whole", "--set", "train.epochs=1")
    for name in distill.CORPUS_FILES:
        assert read_lines(folder / name) == read_lines(
            tmp_path / "whole" / distill.DISTILLED_DIR / name
        )


def test_other_corpus_settings_rewrite_the_corpus_from_the_translations_made(
    exported_workdir, tmp_path, monkeypatch
):
    """A finished distillation asked for the references beside, or a score threshold, writes
    its corpus again from the translations it made: the teacher does not run again."""
    from pipeline.config import load_config

    settings = load_config(SMOKE)["distill"]
    source = tmp_path / "source.de"
    source.write_text("\n".join(read_lines(SMOKE.parent.parent / "data" / "multi30k" /
                                          "val.de.gz")[:40]) + "\n")  # fmt: skip
    distillation = distill.Distillation(tmp_path / "made", source, [exported_workdir], settings)
    distillation.translate()
    distillation.write_corpus(source, False, None)
    assert distillation.done(False, None)
    assert not distillation.done(True, None) and not distillation.done(False, -1.0)
    monkeypatch.setattr(distill, "registered", lambda group: pytest.fail("translated again"))
    distillation.translate()  # every line is there: nothing to translate
    _, target, report = distillation.write_corpus(source, True, None)
    assert report["distilled_pairs"] == 40 and len(read_lines(target)) == 80
    assert distillation.done(True, None) and not distillation.done(False, None)


def test_interpolation_trains_on_the_hypothesis_of_the_beam_closest_to_the_reference(
    exported_workdir, tmp_path
):
    """distill.interpolate (Kim and Rush's sequence-level interpolation): the teacher keeps its
    beam's hypotheses, and the corpus holds, for each source, the one closest to its reference.
    With each reference made the teacher's second hypothesis, that one is chosen wherever it
    differs from the first."""
    from pipeline.config import load_config

    settings = load_config(SMOKE, ["distill.interpolate=true"])["distill"]
    source = tmp_path / "source.de"
    source.write_text("\n".join(read_lines(SMOKE.parent.parent / "data" / "multi30k" /
                                          "val.de.gz")[:40]) + "\n")  # fmt: skip
    distillation = distill.Distillation(tmp_path / "made", source, [exported_workdir], settings,
                                        n_best=True)  # fmt: skip
    distillation.translate()
    beam = json.loads((exported_workdir / "export" / "onnx" / "model.json").read_text())
    lines = [line.split("\t") for line in read_lines(distillation.folder / distill.PARTIAL_FILE)]
    assert {len(fields) for fields in lines} == {2 * beam["defaults"]["beam_size"]}
    scores = [list(map(float, fields[0::2])) for fields in lines]
    assert all(row == sorted(row, reverse=True) for row in scores)  # best first
    references = tmp_path / "references.en"
    references.write_text("".join(fields[3] + "\n" for fields in lines))
    _, target, report = distillation.write_corpus(references, False, None, interpolate=True)
    differing = [fields[3] != fields[1] for fields in lines]
    assert read_lines(target) == [fields[3] for fields in lines]
    assert report["not_the_teachers_best"] == sum(differing) > 0
    assert distillation.done(False, None, True) and not distillation.done(False, None)
    assert distill.closest_to_reference([("a dog", -1.0), ("a dog", -2.0)], "a dog") == (
        "a dog", -1.0)  # fmt: skip
    greedy = {**settings, "beam_size": 1}
    with pytest.raises(UserError, match=r"distill.interpolate .* set distill.beam_size above 1"):
        distill.Distillation(tmp_path / "greedy", source, [exported_workdir], greedy,
                             n_best=True).translate()  # fmt: skip


def test_an_ensemble_of_a_teacher_with_itself_teaches_what_the_teacher_does(
    exported_workdir, tmp_path, monkeypatch
):
    """Several --teacher: their ensemble is exported once into the distillation's folder and
    translates; two copies of one model average to that model's own translations."""
    from pipeline.config import load_config

    monkeypatch.setattr(distill, "BLOCK_LINES", 100)
    settings = load_config(SMOKE)["distill"]
    source = tmp_path / "source.de"
    source.write_text("\n".join(read_lines(SMOKE.parent.parent / "data" / "multi30k" /
                                          "val.de.gz")[:250]) + "\n")  # fmt: skip
    translations = {}
    for name, teachers in (("alone", [exported_workdir]), ("pair", [exported_workdir] * 2)):
        distillation = distill.Distillation(tmp_path / name, source, teachers, settings)
        distillation.translate()
        translations[name] = [line.split("\t")[1] for line in
                              read_lines(distillation.folder / distill.PARTIAL_FILE)]  # fmt: skip
    model = json.loads((tmp_path / "pair" / distill.ENSEMBLE_TEACHER_DIR / "onnx" /
                        "model.json").read_text())  # fmt: skip
    assert model["languages"] == {"source": "de", "target": "en"}
    assert translations["pair"] == translations["alone"] and len(translations["alone"]) == 250


def test_a_teacher_without_an_export_or_another_vocabulary_is_refused(exported_workdir, tmp_path):
    with pytest.raises(UserError, match=r"no ONNX export in .*; run python -m export"):
        distill.teacher_export(tmp_path)
    with pytest.raises(SystemExit):
        run(exported_workdir, tmp_path, "--set", "data.target_vocab_size=250")
    with pytest.raises(UserError, match=r"data.target_vocab_size is 250 here but 300 in the "
                                        r"teacher's vocabulary"):  # fmt: skip
        from pipeline.config import load_config

        distill.student_config(load_config(SMOKE, ["data.target_vocab_size=250"]),
                               exported_workdir)  # fmt: skip
