"""Errors a user can cause, reported as one clear line instead of a traceback."""

import functools
import sys


class UserError(Exception):
    """A problem with the user's input (configuration, corpus, work directory)."""


EXIT_USER_ERROR = 2


def first_line(error):
    """The first line of an exception's message (library messages run to many lines)."""
    text = str(error).strip()
    return text.splitlines()[0] if text else type(error).__name__


def report_user_errors(main):
    """Wraps a command's `main`: a `UserError` prints `error: ...` and exits with status 2."""

    @functools.wraps(main)
    def wrapper(*args, **kwargs):
        try:
            return main(*args, **kwargs)
        except UserError as error:
            print(f"error: {error}", file=sys.stderr)
            sys.exit(EXIT_USER_ERROR)

    return wrapper
