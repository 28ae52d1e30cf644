"""Library chatter away from the user's output.

TensorFlow's native logs, tf2onnx's and ONNX Runtime's Python logs (a protobuf dump in each of
the quantiser's notices) and CTranslate2's write to the process's stderr. A command's output
should be its own: `to_file` sends whatever the libraries write to stderr into a log file for
the duration of a block. Our own messages go to stdout and are unaffected. (The few lines
TensorFlow's native logging writes while it loads come before any file is known; TensorFlow
2.21 writes them whatever TF_CPP_MIN_LOG_LEVEL says.)
"""

import contextlib
import os
import sys


@contextlib.contextmanager
def to_file(path, enabled=True):
    """Inside the block, file descriptor 2 (stderr, where native libraries and Python's
    `logging` and `warnings` write) appends to `path`; `enabled=False` leaves it alone."""
    if not enabled:
        yield
        return
    sys.stderr.flush()
    saved = os.dup(2)
    try:
        with open(path, "ab") as log_file:
            os.dup2(log_file.fileno(), 2)
            try:
                yield
            finally:
                sys.stderr.flush()
                os.dup2(saved, 2)
    finally:
        os.close(saved)
