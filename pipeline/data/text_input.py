"""Reading sentences to translate from a file or standard input."""

import sys

from pipeline.core.errors import UserError


def read_sentences(path=None, errors="strict"):
    """Lines of `path` (or stdin) as text. With errors="strict", invalid UTF-8 is a
    `UserError` naming the line; with "replace" the bad bytes become U+FFFD."""
    name = path or "<stdin>"
    try:
        stream = open(path, "rb") if path else sys.stdin.buffer
    except OSError as error:
        raise UserError(f"{name}: cannot read the file ({error.strerror})") from None
    sentences = []
    with stream:
        for number, raw in enumerate(stream, start=1):
            try:
                line = raw.decode("utf-8", errors=errors)
            except UnicodeDecodeError as error:
                raise UserError(
                    f"{name}:{number}: not valid UTF-8 (byte {error.start + 1} of the line); "
                    "use --errors replace to translate it anyway"
                ) from None
            sentences.append(line.rstrip("\r\n"))
    return sentences
