"""Library chatter away from the user's output.

TensorFlow's native logs, tf2onnx's and ONNX Runtime's Python logs and CTranslate2's write to
the process's stderr. A command's output should be its own: `to_file` sends whatever the
libraries write to stderr into a log file for the duration of a block. Our own messages go to
stdout and are unaffected.
`quiet_tensorflow_startup` drops the lines TensorFlow's native logging writes while it loads
(TensorFlow 2.21 writes them whatever TF_CPP_MIN_LOG_LEVEL says: each library with its own copy
of that logging, libtensorflow_framework and the profiler plugin, reads the variable in a static
initialiser that runs after those of port.cc, the oneDNN notice, and cudart_stub.cc, the missing
CUDA driver) and its later native errors that are not the user's (a missing GPU driver, a kernel
fallback: the oneDNN layout pass logs `oneDNN supports DT_BOOL only on platforms with AVX-512`
at ERROR once a process, whatever the CPU, for the first Transpose of booleans or integers).
"""

import contextlib
import os
import re
import sys
import tempfile

# The lines of TensorFlow's native logging (`I0000 00:00:... file.cc:12] ...`), the notice that
# precedes them, and the continuation of cpu_feature_guard's two-line notice.
_NATIVE_STARTUP_LINE = re.compile(
    rb"^([IWE]\d{4} \d|WARNING: All log messages before absl::InitializeLog|To enable the )"
)


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


def quiet_tensorflow_startup():
    """Imports TensorFlow (and tensorflow-text) with its native start-up lines dropped; what
    else it writes to stderr meanwhile is passed on. Native logs below FATAL stay off for the
    process unless TF_CPP_MIN_LOG_LEVEL is set (errors the user can act on reach Python as
    exceptions). Does nothing once TensorFlow is loaded."""
    if "tensorflow" in sys.modules:
        return
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")
    sys.stderr.flush()
    saved = os.dup(2)
    with tempfile.TemporaryFile() as captured:
        os.dup2(captured.fileno(), 2)
        try:
            import tensorflow as tf
            import tensorflow_text  # noqa: F401  (registers the SentencePiece ops; logs too)

            tf.config.list_physical_devices()  # the device probe's native errors, now
        finally:
            sys.stderr.flush()
            os.dup2(saved, 2)
            os.close(saved)
            captured.seek(0)
            kept = [line for line in captured if not _NATIVE_STARTUP_LINE.match(line)]
            sys.stderr.buffer.write(b"".join(kept))
            sys.stderr.flush()
