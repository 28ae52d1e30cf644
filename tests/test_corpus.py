"""Corpus reading: aligned files, TSV, gzip, and clear errors naming the file and line."""

import gzip

import pytest

from pipeline.corpus import read_aligned, read_split, read_tsv
from pipeline.errors import UserError


def test_aligned_plain_and_gzip(tmp_path):
    (tmp_path / "a.de").write_text("Ein Hund.\nZwei Katzen.\n", encoding="utf-8")
    with gzip.open(tmp_path / "a.en.gz", "wt", encoding="utf-8") as handle:
        handle.write("A dog.\r\nTwo cats.\n")
    corpus = read_aligned(tmp_path / "a.de", tmp_path / "a.en.gz")
    assert corpus.sources == ["Ein Hund.", "Zwei Katzen."]
    assert corpus.targets == ["A dog.", "Two cats."]


def test_tsv(tmp_path):
    (tmp_path / "pairs.tsv").write_text("Hola.\tHello.\nAdiós.\tBye.\tCC-BY\n", encoding="utf-8")
    corpus = read_tsv(tmp_path / "pairs.tsv")
    assert corpus.sources == ["Hola.", "Adiós."] and corpus.targets == ["Hello.", "Bye."]


def test_read_split_picks_the_configured_form(tmp_path):
    (tmp_path / "p.tsv").write_text("a\tb\n", encoding="utf-8")
    data = {
        "valid_tsv": str(tmp_path / "p.tsv"),
        "valid_source": None,
        "valid_target": None,
        "test_tsv": None,
        "test_source": None,
        "test_target": None,
    }
    assert read_split(data, "valid").targets == ["b"]
    assert read_split(data, "test") is None


def test_misaligned_files(tmp_path):
    (tmp_path / "a.de").write_text("1\n2\n3\n", encoding="utf-8")
    (tmp_path / "a.en").write_text("1\n2\n", encoding="utf-8")
    with pytest.raises(UserError, match=r"a.de has 3 lines but .*a.en has 2"):
        read_aligned(tmp_path / "a.de", tmp_path / "a.en")


def test_missing_and_empty_files(tmp_path):
    (tmp_path / "empty.en").write_text("", encoding="utf-8")
    with pytest.raises(UserError, match=r"missing.de: file not found"):
        read_aligned(tmp_path / "missing.de", tmp_path / "empty.en")
    (tmp_path / "a.de").write_text("x\n", encoding="utf-8")
    with pytest.raises(UserError, match=r"empty.en: the file is empty"):
        read_aligned(tmp_path / "a.de", tmp_path / "empty.en")


def test_undecodable_bytes_name_the_line(tmp_path):
    (tmp_path / "bad.de").write_bytes(b"gut\nauch gut\nschlecht \xff\xfe\n")
    with pytest.raises(UserError, match=r"bad.de:3: not valid UTF-8"):
        read_tsv(tmp_path / "bad.de")


def test_corrupt_gzip(tmp_path):
    (tmp_path / "broken.de.gz").write_bytes(b"\x1f\x8b\x08\x00garbage")
    with pytest.raises(UserError, match=r"broken.de.gz: cannot read the file"):
        read_tsv(tmp_path / "broken.de.gz")


def test_tsv_without_tab_names_the_line(tmp_path):
    (tmp_path / "p.tsv").write_text("a\tb\nno tab here\n", encoding="utf-8")
    with pytest.raises(UserError, match=r"p.tsv:2: expected source<TAB>target"):
        read_tsv(tmp_path / "p.tsv")
