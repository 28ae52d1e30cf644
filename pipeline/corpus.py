"""Reading parallel corpora: two aligned files, or one TSV, plain or gzip-compressed."""

import dataclasses
import gzip
from pathlib import Path

from pipeline.errors import UserError


@dataclasses.dataclass
class ParallelCorpus:
    """Aligned source and target sentences, with where they came from."""

    sources: list
    targets: list
    origin: str

    def __len__(self):
        return len(self.sources)


def _open_text(path):
    path = Path(path)
    if not path.is_file():
        raise UserError(f"{path}: file not found")
    opener = gzip.open if path.suffix == ".gz" else open
    return opener(path, "rb")


def read_lines(path):
    """The lines of a UTF-8 text file (trailing newline and carriage return removed)."""
    lines = []
    try:
        with _open_text(path) as handle:
            for number, raw in enumerate(handle, start=1):
                try:
                    lines.append(raw.decode("utf-8").rstrip("\r\n"))
                except UnicodeDecodeError as error:
                    raise UserError(
                        f"{path}:{number}: not valid UTF-8 (byte {error.start + 1} of the line)"
                    ) from None
    except (OSError, EOFError, gzip.BadGzipFile) as error:
        raise UserError(f"{path}: cannot read the file ({error})") from None
    if not lines:
        raise UserError(f"{path}: the file is empty")
    return lines


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
    if data_config[f"{split}_tsv"]:
        return read_tsv(data_config[f"{split}_tsv"])
    if data_config[f"{split}_source"]:
        return read_aligned(data_config[f"{split}_source"], data_config[f"{split}_target"])
    return None
