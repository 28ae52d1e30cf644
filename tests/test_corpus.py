"""Corpus reading: aligned files, TSV, gzip, and clear errors naming the file and line."""

import gzip
import tracemalloc
from pathlib import Path

import numpy as np
import pytest

from pipeline.core.errors import UserError
from pipeline.data import corpus as corpus_module
from pipeline.data.corpus import read_aligned, read_split, read_tsv, scan_training_corpora


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


# Training corpora: scanned in one streaming pass.


def scan(tmp_path, skip_bad_lines=False, sample_size=0, **paths):
    data = {"train_corpora": None, "train_tsv": None, "train_source": None, "train_target": None,
            "skip_bad_lines": skip_bad_lines}  # fmt: skip
    data.update({key: str(tmp_path / value) for key, value in paths.items()})
    return scan_training_corpora(data, sample_size, seed=0, log=lambda _: None)


def test_glob_patterns_pair_shards_in_sorted_order(tmp_path):
    for index, count in enumerate((3, 2)):
        for side in ("de", "en"):
            with gzip.open(tmp_path / f"part-{index}.{side}.gz", "wt", encoding="utf-8") as handle:
                handle.write("".join(f"{side} {index} {n}\n" for n in range(count)))
    (corpus,), sources, targets = scan(
        tmp_path, sample_size=10, train_source="part-*.de.gz", train_target="part-*.en.gz"
    )
    assert [(Path(s.source).name, Path(s.target).name, s.lines) for s in corpus.shards] == [
        ("part-0.de.gz", "part-0.en.gz", 3), ("part-1.de.gz", "part-1.en.gz", 2),
    ]  # fmt: skip
    assert corpus.lines == 5 and sorted(sources) == sorted(b"de" + s[2:] for s in targets)


def test_shards_that_do_not_pair_up_name_the_files(tmp_path):
    (tmp_path / "a-0.de").write_text("1\n2\n3\n")
    (tmp_path / "a-0.en").write_text("1\n2\n")
    with pytest.raises(UserError, match=r"a-0.de has 3 lines but .*a-0.en has 2"):
        scan(tmp_path, train_source="a-*.de", train_target="a-*.en")
    (tmp_path / "a-1.de").write_text("1\n")
    with pytest.raises(UserError, match=r"a-\*.de matches 2 files but .*a-\*.en matches 1"):
        scan(tmp_path, train_source="a-*.de", train_target="a-*.en")
    with pytest.raises(UserError, match=r"b-\*.de: no file matches this pattern"):
        scan(tmp_path, train_source="b-*.de", train_target="a-*.en")


def test_a_bad_line_mid_stream_names_file_and_line_or_is_skipped_and_counted(tmp_path):
    lines = [f"Zeile {n}".encode() for n in range(200_000)]  # a few blocks of the scan
    lines[150_000] = b"kaputt \xff\xfe"
    with gzip.open(tmp_path / "big.de.gz", "wb", compresslevel=1) as handle:
        handle.write(b"\n".join(lines) + b"\n")
    with gzip.open(tmp_path / "big.en.gz", "wb", compresslevel=1) as handle:
        handle.write(b"".join(b"line\n" for _ in lines))
    paths = dict(train_source="big.de.gz", train_target="big.en.gz")
    with pytest.raises(UserError, match=r"big.de.gz:150001: not valid UTF-8; .*skip_bad_lines"):
        scan(tmp_path, **paths)
    (corpus,), _, _ = scan(tmp_path, skip_bad_lines=True, **paths)
    assert corpus.lines == 200_000 and corpus.bad_lines == 1


def test_a_tsv_line_without_tab_is_bad(tmp_path):
    (tmp_path / "p.tsv").write_text("a\tb\nno tab\nc\td\textra\n", encoding="utf-8")
    with pytest.raises(UserError, match=r"p.tsv:2: no tab"):
        scan(tmp_path, train_tsv="p.tsv")
    (corpus,), sources, targets = scan(tmp_path, True, 10, train_tsv="p.tsv")
    assert corpus.bad_lines == 1 and sources == [b"a", b"c"] and targets == [b"b", b"d"]


def test_the_vocabulary_sample_is_uniform_and_bounded(tmp_path):
    (tmp_path / "x.de").write_text("".join(f"{n}\n" for n in range(20_000)))
    (tmp_path / "x.en").write_text("".join(f"{n}\n" for n in range(20_000)))
    _, sources, _ = scan(tmp_path, sample_size=2_000, train_source="x.de", train_target="x.en")
    numbers = np.array([int(line) for line in sources])
    assert len(numbers) == 2_000 == len(set(numbers.tolist()))
    # Uniform over 0..19,999: each tenth of the file holds 200 +- 3 standard deviations (13).
    counts = np.bincount(numbers // 2_000, minlength=10)
    assert np.all(np.abs(counts - 200) < 40), counts


@pytest.mark.parametrize("layout", ["aligned files", "tsv"])
def test_the_sample_holds_whole_pairs(tmp_path, monkeypatch, layout):
    """The source and target samples are the same pairs, though the two files' blocks end at
    other lines and a bad line is skipped: the epoch length is estimated from the pairs'
    lengths (with each side sampled apart, it came out 7% long)."""
    monkeypatch.setattr(corpus_module, "SCAN_CHUNK_BYTES", 4096)
    sources = [b"%d" % n for n in range(30_000)]
    targets = [b"number %d %s" % (n, b"x" * (n % 37)) for n in range(30_000)]
    sources[12_345] = b"kaputt \xff"
    if layout == "tsv":
        rows = [s + b"\t" + t for s, t in zip(sources, targets)]
        (tmp_path / "p.tsv").write_bytes(b"\n".join(rows) + b"\n")
        paths = dict(train_tsv="p.tsv")
    else:
        (tmp_path / "x.de").write_bytes(b"\n".join(sources) + b"\n")
        (tmp_path / "x.en").write_bytes(b"\n".join(targets) + b"\n")
        paths = dict(train_source="x.de", train_target="x.en")
    _, sampled_sources, sampled_targets = scan(tmp_path, True, 3_000, **paths)
    assert 2_999 <= len(sampled_sources) == len(sampled_targets)
    pairs = {(int(s), int(t.split()[1])) for s, t in zip(sampled_sources, sampled_targets)}
    assert all(s == t for s, t in pairs) and len(pairs) == len(sampled_sources)


def scan_peak(tmp_path, lines):
    """Python's peak allocation while scanning an aligned corpus of `lines` gzip lines."""
    text = b"".join(b"Satz Nummer %d.\n" % n for n in range(lines))
    for name in ("big.de.gz", "big.en.gz"):
        with gzip.open(tmp_path / name, "wb", compresslevel=1) as handle:
            handle.write(text)
    tracemalloc.start()
    try:
        (corpus,), sources, _ = scan(
            tmp_path, sample_size=100, train_source="big.de.gz", train_target="big.en.gz"
        )
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert corpus.lines == lines and len(sources) == 100
    return peak, len(text)


def test_the_scan_holds_a_block_and_the_sample_not_the_corpus(tmp_path):
    (tmp_path / "small").mkdir()
    (tmp_path / "large").mkdir()
    small, _ = scan_peak(tmp_path / "small", 100_000)
    large, size = scan_peak(tmp_path / "large", 1_000_000)  # 20 MB of text
    assert large < 1.2 * small and large < size / 2, (small, large, size)
