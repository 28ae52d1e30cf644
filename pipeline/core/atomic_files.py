"""Writing a file so that readers see the old version or the new one, never part of one."""

import contextlib
import os
import re
import sys
import uuid
from pathlib import Path

from pipeline.core.errors import UserError, WriteFailed, first_line


def write_failure_reason(error):
    """Why a write failed, when `error` is a failed write: an `OSError`, or TensorFlow's error
    from a file operation (it carries the system's message, e.g. `...; No space left on
    device [Op:SaveV2]`); else None. Call it only on errors raised while writing."""
    if isinstance(error, OSError):
        return error.strerror or first_line(error)
    tensorflow = sys.modules.get("tensorflow")
    if tensorflow is not None and isinstance(error, tensorflow.errors.OpError):
        text = re.sub(r"\s*\[Op:\w+\].*$", "", first_line(error.message))
        return text.rsplit("; ", 1)[-1]
    return None


@contextlib.contextmanager
def writing(path):
    """A failed write inside the block raises `WriteFailed` naming `path` (one line for the
    user instead of a library's traceback); other errors pass as they are."""
    try:
        yield
    except UserError:
        raise
    except Exception as error:
        reason = write_failure_reason(error)
        if reason is None:
            raise
        raise WriteFailed(path, reason) from None


@contextlib.contextmanager
def atomic_path(path):
    """A fresh path beside `path` to write to: renamed onto `path` when the block ends
    normally, removed when it raises. It keeps `path`'s suffix, for writers that go by it
    (Keras' `.keras`, matplotlib's `.png`), and is created by the writer, so with the usual
    permissions."""
    path = Path(path)
    tmp = path.with_name(f".{path.stem}.tmp-{uuid.uuid4().hex[:8]}{path.suffix}")
    try:
        with writing(path):
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
