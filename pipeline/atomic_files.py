"""Writing a file so that readers see the old version or the new one, never part of one."""

import contextlib
import os
import uuid
from pathlib import Path


@contextlib.contextmanager
def atomic_path(path):
    """A fresh path beside `path` to write to: renamed onto `path` when the block ends
    normally, removed when it raises. It keeps `path`'s suffix, for writers that go by it
    (Keras' `.keras`, matplotlib's `.png`), and is created by the writer, so with the usual
    permissions."""
    path = Path(path)
    tmp = path.with_name(f".{path.stem}.tmp-{uuid.uuid4().hex[:8]}{path.suffix}")
    try:
        yield tmp
        os.replace(tmp, path)
    finally:
        tmp.unlink(missing_ok=True)


@contextlib.contextmanager
def open_atomically(path):
    """A UTF-8 text file open for writing that replaces `path` once the block ends normally."""
    with atomic_path(path) as tmp, open(tmp, "w", encoding="utf-8") as handle:
        yield handle


def write_text_atomically(path, text):
    with open_atomically(path) as handle:
        handle.write(text)
