"""Errors a user can cause, reported as one clear line instead of a traceback."""

import functools
import sys

from pipeline.library_output import quiet_tensorflow_startup


class UserError(Exception):
    """A problem with the user's input (configuration, corpus, work directory)."""


EXIT_USER_ERROR = 2


def first_line(error):
    """The first line of an exception's message (library messages run to many lines)."""
    text = str(error).strip()
    return text.splitlines()[0] if text else type(error).__name__


def report_user_errors(main):
    """Wraps a command's `main`: TensorFlow loads without its native start-up chatter
    (`quiet_tensorflow_startup`), and a `UserError` prints `error: ...` and exits with status 2."""

    @functools.wraps(main)
    def wrapper(*args, **kwargs):
        quiet_tensorflow_startup()
        try:
            return main(*args, **kwargs)
        except UserError as error:
            print(f"error: {error}", file=sys.stderr)
            sys.exit(EXIT_USER_ERROR)

    return wrapper
