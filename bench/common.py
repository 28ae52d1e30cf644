"""What the benchmarks share: the line that names the machine, sides timed in alternating
rounds and their per-round ratios, `python` commands run from the project root, and the venvs
the peers are installed into.

A benchmark run as `python bench/NAME.py` finds this module beside it (`import common`).
"""

import json
import os
import platform
import statistics
import subprocess
import sys
import time
from pathlib import Path

PROJECT_ROOT = Path(__file__).resolve().parent.parent


# --- the machine ----------------------------------------------------------------------------


def cpu_model():
    """The CPU's model name and its widest vector extension, from /proc/cpuinfo."""
    try:
        info = Path("/proc/cpuinfo").read_text()
    except OSError:
        return platform.machine()
    name = next((line.split(":", 1)[1].strip() for line in info.splitlines()
                 if line.startswith("model name")), platform.machine())  # fmt: skip
    flags = next((line.split(":", 1)[1].split() for line in info.splitlines()
                  if line.startswith("flags")), [])  # fmt: skip
    vector = next((f.upper() for f in ("avx512_bf16", "avx512f", "avx2") if f in flags), "")
    return f"{name} {vector}".strip()


def machine(cpus=True, model=False):
    """This machine as a benchmark's first line names it: the host name, then its CPU count
    and, with `model`, the CPU's model and widest vector extension ("host: 2 CPUs, ...")."""
    details = ([f"{os.cpu_count()} CPUs"] if cpus else []) + ([cpu_model()] if model else [])
    return ": ".join([platform.node(), ", ".join(details)]) if details else platform.node()


# --- alternating rounds ---------------------------------------------------------------------


def alternate(rounds, sides):
    """Runs each of `sides` ({name: callable}) once a round, in their order, for `rounds`
    rounds, so that a passing load on a shared machine weighs on every side alike:
    {name: [each round's result]}. A ratio of two sides is then one measured in one run."""
    results = {name: [] for name in sides}
    for _ in range(rounds):
        for name, side in sides.items():
            results[name].append(side())
    return results


def per_second(work):
    """What `work()` returns (sentences, batches: a count) over the seconds it took."""
    started = time.perf_counter()
    count = work()
    return count / (time.perf_counter() - started)


def round_ratios(ours, theirs):
    """Each round's ratio of one side's figures to another's, and their median: the sides took
    turns, so the per-round ratios are what to read when the machine's speed drifts."""
    ratios = [a / b for a, b in zip(ours, theirs)]
    return ratios, statistics.median(ratios)


# --- commands -------------------------------------------------------------------------------


def run_python(command, **kwargs):
    """`python COMMAND...` with this interpreter, from the project root, printed first; a
    failure raises."""
    print("$", " ".join(map(str, command)), flush=True)
    return subprocess.run([sys.executable, *map(str, command)], cwd=PROJECT_ROOT, check=True,
                          **kwargs)  # fmt: skip


def make_venv(venv, installs, run=None, message=None):
    """The venv `venv`, made once: `installs` is pip's argument lists, installed in order;
    its `installed` file records them, so that a changed pin installs again. `run(command)`
    runs each command (default: `subprocess.run`, a failure raising); `message` is printed
    when something is installed. Returns the venv's python."""
    run = run or (lambda command: subprocess.run([str(part) for part in command], check=True))
    venv = Path(venv)
    marker, wanted = venv / "installed", json.dumps(installs)
    if not (marker.exists() and marker.read_text() == wanted):
        if message:
            print(message, flush=True)
        if not (venv / "bin" / "pip").exists():
            run([sys.executable, "-m", "venv", venv])
        for packages in installs:
            run([venv / "bin" / "pip", "install", "-q", *packages])
        marker.write_text(wanted)
    return venv / "bin" / "python"
