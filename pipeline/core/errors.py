"""Errors a user can cause, reported as one clear line instead of a traceback."""

import functools
import sys

from pipeline.core.library_output import quiet_tensorflow_startup


class UserError(Exception):
    """A problem with the user's input (configuration, corpus, work directory)."""


class UnusableFileError(UserError):
    """A file a command or the library needs is missing, unreadable or damaged. The message
    starts with the file's path, so that a user with several models knows which one."""

    def __init__(self, path, problem):
        super().__init__(f"{path}: {problem}")
        self.path = path


class WriteFailed(UserError):
    """Writing a file failed (a full disk, a lost mount, no permission): its path and the
    system's reason. What was there before is kept; its temporary files are gone."""

    def __init__(self, path, reason):
        super().__init__(f"cannot write {path}: {reason}")
        self.path = path


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
