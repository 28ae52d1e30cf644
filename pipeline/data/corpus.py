"""Parallel corpora: two aligned files, or one TSV, plain or gzip-compressed.

Validation and test splits are small and read into memory. Training corpora may be any size:
they are described by their files (glob patterns of shards, several corpora with weights),
counted and checked in one streaming pass, and read as a stream by `pipeline.data.dataset`.
"""

import dataclasses
import glob
import gzip
import itertools
import os
import re
import sys
import zlib
from pathlib import Path

import numpy as np
from tqdm import tqdm

from pipeline.core import multilingual
from pipeline.core.errors import UserError


@dataclasses.dataclass
class ParallelCorpus:
    """Aligned source and target sentences, with where they came from; a multilingual split
    also says which lines hold which direction (`(Direction, start, end)` each)."""

    sources: list
    targets: list
    origin: str
    directions: list = dataclasses.field(default_factory=list)

    def __len__(self):
        return len(self.sources)


def with_pair_tokens(corpus, source_token, target_token):
    """`corpus` with each source after `source_token` and each target after `target_token`
    (`multilingual.pair_tokens`; "" adds nothing; a blank line stays blank), as an imported
    model takes its pairs when it is trained or scored."""
    if not source_token and not target_token:
        return corpus
    sides = ((corpus.sources, source_token), (corpus.targets, target_token))
    sources, targets = (multilingual.tagged(lines, token) if token else lines
                        for lines, token in sides)  # fmt: skip
    return dataclasses.replace(corpus, sources=sources, targets=targets)


def _open_text(path):
    """(the file's text, plain or gunzipped; the file on disk, for progress in it)."""
    path = Path(path)
    if not path.is_file():
        raise UserError(f"{path}: file not found")
    raw = open(path, "rb")  # noqa: SIM115  (closed with the text handle)
    return (gzip.GzipFile(fileobj=raw) if path.suffix == ".gz" else raw), raw


def iter_lines(path, errors="strict"):
    """The lines of a UTF-8 text file, plain or gzipped, one at a time (trailing newline and
    carriage return removed). With errors="strict" invalid UTF-8 is a `UserError` naming the
    line; with "replace" the bad bytes become U+FFFD."""
    try:
        handle, file = _open_text(path)
        with file, handle:
            for number, raw in enumerate(handle, start=1):
                try:
                    yield raw.decode("utf-8", errors=errors).rstrip("\r\n")
                except UnicodeDecodeError as error:
                    raise UserError(
                        f"{path}:{number}: not valid UTF-8 (byte {error.start + 1} of the line)"
                    ) from None
    except (OSError, EOFError, gzip.BadGzipFile) as error:
        raise UserError(f"{path}: cannot read the file ({error})") from None


def read_lines(path):
    """All the lines of a UTF-8 text file (`iter_lines`); an empty file is a `UserError`."""
    lines = list(iter_lines(path))
    if not lines:
        raise UserError(f"{path}: the file is empty")
    return lines


def iter_aligned(source_path, target_path, errors="strict"):
    """(source, target) line pairs of two aligned files, read as they are consumed; files of
    different lengths are a `UserError` once the shorter one ends."""
    sources, targets = iter_lines(source_path, errors), iter_lines(target_path, errors)
    for number, (source, target) in enumerate(itertools.zip_longest(sources, targets), start=1):
        if source is None or target is None:
            ended, other = (
                (source_path, target_path) if source is None else (target_path, source_path)
            )
            raise UserError(
                f"{ended} ends after {number - 1} lines but {other} goes on: source and "
                "target files must be aligned line by line"
            )
        yield source, target


def read_aligned(source_path, target_path):
    sources, targets = read_lines(source_path), read_lines(target_path)
    if len(sources) != len(targets):
        raise UserError(
            f"{source_path} has {len(sources)} lines but {target_path} has {len(targets)}: "
            "source and target files must be aligned line by line"
        )
    return ParallelCorpus(sources, targets, f"{source_path} + {target_path}")


def read_tsv(path):
    sources, targets = [], []
    for number, line in enumerate(read_lines(path), start=1):
        fields = line.split("\t")
        if len(fields) < 2:
            raise UserError(f"{path}:{number}: expected source<TAB>target, found no tab")
        sources.append(fields[0])
        targets.append(fields[1])
    return ParallelCorpus(sources, targets, str(path))


def read_split(data_config, split):
    """The corpus of `split` ("train", "valid" or "test"), or None if the config has none."""
    if multilingual.is_multilingual(data_config):
        return read_multiway(data_config, split)
    if data_config[f"{split}_tsv"]:
        return read_tsv(data_config[f"{split}_tsv"])
    if data_config[f"{split}_source"]:
        return read_aligned(data_config[f"{split}_source"], data_config[f"{split}_target"])
    return None


def read_multiway(data_config, split, directions=None):
    """The trained directions (or `directions`, a `data.directions` text: untrained ones too,
    for zero-shot translation) of a multi-way `split` that has both of their languages, one
    after the other, each source tagged with its target language; None without the split."""
    files = data_config[multilingual.SPLIT_KEYS[split]]
    if not files:
        return None
    chosen = (multilingual.training_directions(data_config) if directions is None else
              multilingual.parse_directions(directions, files, "--directions"))  # fmt: skip
    lines = {language: read_lines(path) for language, path in sorted(files.items())}
    _check_multiway_counts(files, {language: len(text) for language, text in lines.items()})
    corpus = ParallelCorpus([], [], f"{split}: {len(lines[next(iter(lines))]):,} lines in "
                            f"{', '.join(lines)}")  # fmt: skip
    for direction in chosen:
        if direction.source in lines and direction.target in lines:
            start = len(corpus.sources)
            corpus.sources += multilingual.tagged(
                lines[direction.source], multilingual.language_tag(direction.target)
            )
            corpus.targets += lines[direction.target]
            corpus.directions.append((direction, start, len(corpus.sources)))
    return corpus


def _check_multiway_counts(files, counts):
    """A `UserError` naming each file and its line count unless all counts are equal."""
    if len(set(counts.values())) > 1:
        listed = ", ".join(f"{files[language]} has {count:,}" for language, count in counts.items())
        raise UserError(f"the files of one multi-way set must be aligned line by line: {listed}")


# Training corpora are streamed: described here by their files, read by `pipeline.data.dataset`.

SCAN_CHUNK_BYTES = 1 << 20
SCAN_PROGRESS_BYTES = 1 << 28  # a progress bar for corpora from this size on disk
_LINE_WITHOUT_TAB = re.compile(rb"^[^\t\n]*$", re.MULTILINE)


@dataclasses.dataclass(frozen=True)
class Shard:
    """One file of a training corpus: aligned `source` and `target` files, or a TSV `source`
    (`target` None), with its line count."""

    source: str
    target: str | None
    lines: int


@dataclasses.dataclass(frozen=True)
class TrainingCorpus:
    """A training corpus as files: its shards, its weight in the mix, its lines skipped as bad."""

    name: str
    shards: tuple
    weight: float
    bad_lines: int
    # Before each source line: a multilingual model's target tag, or an imported model's
    # language token; before each target line: a many-to-many import's target-language token.
    source_prefix: str = ""
    target_prefix: str = ""

    @property
    def lines(self):
        return sum(shard.lines for shard in self.shards)

    @property
    def is_tsv(self):
        return self.shards[0].target is None


@dataclasses.dataclass
class Reservoir:
    """A uniform random sample of at most `size` lines of a stream (Algorithm R).

    Which positions it keeps depends only on `size`, `seed` and the stream's length, not on
    the lines or how they come in blocks: reservoirs fed aligned files hold aligned lines.
    """

    size: int
    seed: int
    seen: int = 0
    lines: list = dataclasses.field(default_factory=list)

    def __post_init__(self):
        self.rng = np.random.default_rng(self.seed)

    def add(self, lines):
        fill = min(max(self.size - len(self.lines), 0), len(lines))
        self.lines.extend(lines[:fill])
        if fill < len(lines):  # each later line replaces a random slot with probability size/seen
            positions = np.arange(self.seen + fill, self.seen + len(lines)) + 1
            slots = (self.rng.random(len(positions)) * positions).astype(np.int64)
            for index in np.flatnonzero(slots < self.size):
                self.lines[slots[index]] = lines[fill + index]
        self.seen += len(lines)


def _complete_lines(path, progress):
    """Yields the file's bytes as blocks of whole lines (without the last newline), calling
    `progress(n)` with the bytes of the file on disk each block took."""
    rest, done = b"", 0
    try:
        handle, file = _open_text(path)
        with file, handle:
            while chunk := handle.read(SCAN_CHUNK_BYTES):
                block, newline, tail = (rest + chunk).rpartition(b"\n")
                if newline:
                    yield block
                rest = tail
                progress(file.tell() - done)
                done = file.tell()
    except (OSError, EOFError, zlib.error, gzip.BadGzipFile) as error:
        raise UserError(f"{path}: cannot read the file ({error})") from None
    if rest:
        yield rest


def _bad_lines(block, tsv):
    """Indices (within `block`) of the lines that are not UTF-8 or, in a TSV, have no tab."""
    bad = set()
    try:
        block.decode("utf-8")
    except UnicodeDecodeError:  # rare: find the lines, one by one
        for index, line in enumerate(block.split(b"\n")):
            try:
                line.decode("utf-8")
            except UnicodeDecodeError:
                bad.add(index)
    if tsv:
        bad |= {block.count(b"\n", 0, m.start()) for m in _LINE_WITHOUT_TAB.finditer(block)}
    return sorted(bad)


def scan_file(path, tsv, skip_bad_lines, reservoirs=(), progress=lambda size: None):
    """(lines, bad lines) of a training file in one streaming pass, feeding each line to the
    `reservoirs` (one per TSV field, or one); a bad line is a `UserError` naming the file and
    line unless `skip_bad_lines`. `progress(n)`: n more bytes of the file were read."""
    lines = bad_count = 0
    for block in _complete_lines(path, progress):
        bad = _bad_lines(block, tsv)
        if bad and not skip_bad_lines:
            what = "no tab (expected source<TAB>target)" if tsv else "not valid UTF-8"
            if tsv:
                try:
                    block.split(b"\n")[bad[0]].decode("utf-8")
                except UnicodeDecodeError:
                    what = "not valid UTF-8"
            raise UserError(
                f"{path}:{lines + bad[0] + 1}: {what}; fix the line or set "
                "data.skip_bad_lines: true to skip such lines"
            )
        if reservoirs:
            rows = block.split(b"\n")
            for index in bad:  # keeps its position, so that the sides stay aligned
                rows[index] = None
            if tsv:
                fields = [row and row.split(b"\t", 2) for row in rows]
                columns = [f and f[0] for f in fields], [f and f[1] for f in fields]
            else:
                columns = (rows,)
            for reservoir, column in zip(reservoirs, columns):
                reservoir.add(column)
        lines += block.count(b"\n") + 1
        bad_count += len(bad)
    if not lines:
        raise UserError(f"{path}: the file is empty")
    return lines, bad_count


def _expand(pattern):
    """The files a path or glob pattern names, sorted; none is a `UserError`."""
    if not glob.has_magic(pattern):
        if not Path(pattern).is_file():
            raise UserError(f"{pattern}: file not found")
        return [pattern]
    files = sorted(glob.glob(pattern))
    if not files:
        raise UserError(f"{pattern}: no file matches this pattern")
    return files


def _corpus_specs(data_config):
    """`[{source, target} or {tsv}, weight]` of the configuration, one form or the other."""
    if data_config["train_corpora"]:
        return data_config["train_corpora"]
    if data_config["train_tsv"]:
        return [{"tsv": data_config["train_tsv"], "weight": 1.0}]
    return [
        {"source": data_config["train_source"], "target": data_config["train_target"],
         "weight": 1.0}
    ]  # fmt: skip


def _corpus_files(spec):
    """(name, [(source, target or None)]) of a corpus of the configuration."""
    if "tsv" in spec:
        return spec["tsv"], [(path, None) for path in _expand(spec["tsv"])]
    sources, targets = _expand(spec["source"]), _expand(spec["target"])
    if len(sources) != len(targets):
        raise UserError(
            f"{spec['source']} matches {len(sources)} files but {spec['target']} "
            f"matches {len(targets)}: source and target shards must pair up"
        )
    return f"{spec['source']} + {spec['target']}", list(zip(sources, targets))


def scan_training_corpora(data_config, sample_size=0, seed=0, log=print):
    """The training corpora of the configuration as `TrainingCorpus`es, every file counted and
    checked in one streaming pass (as `wc -l` costs), and a uniform random sample of at most
    `sample_size` pairs: `(corpora, source sample, target sample)`, the samples aligned.

    Aligned files must have equal line counts; a glob pattern on either side pairs the files
    it matches in sorted order. A progress bar shows the pass over large corpora.
    """
    samples = (Reservoir(sample_size, seed), Reservoir(sample_size, seed)) if sample_size else ()
    skip = data_config["skip_bad_lines"]
    tokens = multilingual.pair_tokens(data_config)
    prefixes = [f"{token} " if token else "" for token in tokens]
    specs = _corpus_specs(data_config)
    files = [_corpus_files(spec) for spec in specs]
    size = sum(os.path.getsize(p) for _, pairs in files for pair in pairs for p in pair if p)
    bar = tqdm(
        total=size, unit="B", unit_scale=True, desc="Scanning the training data",
        file=sys.stderr, disable=size < SCAN_PROGRESS_BYTES, leave=False, mininterval=1,
    )  # fmt: skip
    corpora = []
    with bar:
        for spec, (name, pairs) in zip(specs, files):
            shards, bad_by_side = [], [0, 0]  # bad lines of the source (or TSV), the target
            for source, target in pairs:
                if target is None:
                    lines, bad = scan_file(source, True, skip, samples, bar.update)
                else:
                    lines, bad = scan_file(source, False, skip, samples[:1], bar.update)
                    target_lines, target_bad = scan_file(target, False, skip, samples[1:],
                                                         bar.update)  # fmt: skip
                    if lines != target_lines:
                        raise UserError(
                            f"{source} has {lines} lines but {target} has {target_lines}: "
                            "source and target files must be aligned line by line"
                        )
                    bad_by_side[1] += target_bad
                bad_by_side[0] += bad
                shards.append(Shard(source, target, lines))
            if max(bad_by_side) == sum(shard.lines for shard in shards):
                raise UserError(f"{name}: every line is bad (undecodable or, in a TSV, without a "
                                "tab): no usable training pairs")  # fmt: skip
            bad_lines = sum(bad_by_side)
            corpora.append(TrainingCorpus(name, tuple(shards), spec["weight"], bad_lines,
                                          *prefixes))  # fmt: skip
    for corpus in corpora:
        log(
            f"train: {corpus.name}: {corpus.lines:,} lines in {len(corpus.shards)} file(s)"
            + (f", {corpus.bad_lines} bad line(s) to skip" if corpus.bad_lines else "")
            + (f", weight {corpus.weight:g}" if len(corpora) > 1 else "")
        )
    pairs = [p for p in zip(*(r.lines for r in samples)) if None not in p] if samples else []
    sample = with_pair_tokens(ParallelCorpus([s for s, _ in pairs], [t for _, t in pairs], ""),
                              *tokens)  # fmt: skip
    return corpora, sample.sources, sample.targets


def temperature_weights(sizes, temperature):
    """Each direction's share of the mix: size^(1/T), normalised (as fairseq's
    `--sampling-temperature`: T = 1 samples by size, a large T evenly)."""
    scaled = np.asarray(sizes, dtype=np.float64) ** (1.0 / temperature)
    return (scaled / scaled.sum()).tolist()


def scan_multiway(data_config, sample_size=0, seed=0, log=print):
    """`scan_training_corpora` for a multi-way set: each language's file counted and checked
    once, a training corpus a direction of `data.directions` and of `data.synthetic_directions`
    (whose sources are `data.multiway_synthetic`'s), its sources tagged, its weight by
    `data.sampling_temperature`; aligned samples of `sample_size` lines a language.
    Returns `(corpora, source sample, target sample, vocabulary sample)`: pairs of the
    directions in turn, for the batch estimate, and every language's lines in equal number,
    for a shared vocabulary."""
    files = data_config[multilingual.SPLIT_KEYS["train"]]
    skip = data_config["skip_bad_lines"]
    per_language = max(1, sample_size // len(files)) if sample_size else 0
    counts, bad, samples = {}, {}, {}
    for language, path in sorted(files.items()):
        # The same size and seed keep the same positions of equally long files: aligned.
        reservoir = Reservoir(per_language, seed) if per_language else None
        counts[language], bad[language] = scan_file(path, False, skip,
                                                    (reservoir,) if reservoir else ())  # fmt: skip
        samples[language] = reservoir.lines if reservoir else []
    synthetic = data_config["multiway_synthetic"] or {}
    for language, path in sorted(synthetic.items()):
        name = f"{language} (synthetic)"
        counts[name], bad[name] = scan_file(path, False, skip, ())
        files = {**files, name: path}
    _check_multiway_counts(files, counts)
    directions = multilingual.training_directions(data_config)
    made = set(multilingual.synthetic_directions(data_config))
    sources = {d: f"{d.source} (synthetic)" if d in made else d.source for d in directions}
    shares = temperature_weights(
        [counts[sources[d]] for d in directions], data_config["sampling_temperature"]
    )
    corpora = [
        TrainingCorpus(str(d), (Shard(files[sources[d]], files[d.target], counts[d.source]),),
                       share, bad[sources[d]] + bad[d.target],
                       multilingual.language_tag(d.target) + " ")
        for d, share in zip(directions, shares)
    ]  # fmt: skip
    for corpus in corpora:
        skipped = f", {corpus.bad_lines} bad line(s) to skip" if corpus.bad_lines else ""
        log(f"train: {corpus.name}: {corpus.lines:,} lines, {corpus.weight:.1%} of the "
            f"mix{skipped}")  # fmt: skip
    pairs = []
    for index in range(min(map(len, samples.values()))):
        d = directions[index % len(directions)]
        source, target = samples[d.source][index], samples[d.target][index]
        if source is not None and target is not None:
            pairs.append(
                (multilingual.tagged([source], multilingual.language_tag(d.target))[0], target)
            )
    vocabulary = [line for language in sorted(samples) for line in samples[language]
                  if line is not None]  # fmt: skip
    return corpora, [s for s, _ in pairs], [t for _, t in pairs], vocabulary
