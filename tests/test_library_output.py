"""What the libraries write stays out of what a user reads (`pipeline.core.library_output`)."""

import os
import re
import subprocess
import sys

from pipeline.config import PROJECT_ROOT

# TensorFlow's native log lines (`I0000 00:00:...`) and the notice before them.
NATIVE_LOG_LINE = re.compile(r"^([IWEF]\d{4} \d|WARNING: All log messages before absl)")


def test_the_test_command_ends_with_its_summary(tmp_path):
    """The README's test command, on two quick tests with one pytest-xdist worker, as a fresh
    clone runs it (no TF_CPP_MIN_LOG_LEVEL): its last line is pytest's summary. pytest-xdist's
    controller loads TensorFlow with the conftest, under pytest's capture, and that capture
    prints what it holds when the session ends."""
    environment = {k: v for k, v in os.environ.items()
                   if not k.startswith("PYTEST_") and k != "TF_CPP_MIN_LOG_LEVEL"}  # fmt: skip
    result = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-n", "1", "-p", "no:cacheprovider",
         f"--basetemp={tmp_path / 'run'}",
         "tests/test_structure.py::test_no_package_imports_one_downstream_of_it"],
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, cwd=PROJECT_ROOT,
        env=environment, timeout=120,
    )  # fmt: skip
    lines = result.stdout.rstrip("\n").split("\n")
    assert result.returncode == 0, result.stdout[-3000:]
    assert re.match(r"^2 passed in \d", lines[-1]), lines[-8:]
    assert not [line for line in lines if NATIVE_LOG_LINE.match(line)], lines
