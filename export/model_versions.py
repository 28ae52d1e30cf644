"""The versions of an exported model, as TF Serving serves them: the highest numbered one.

    BASE/1/  BASE/2/ ...   each an export (`python -m export --output BASE/N`) or its onnx/
    BASE/                  an export alone: served as version 1

The directory is polled; a higher version, or the served one replaced (a re-export renames a
new directory into place), is loaded beside the served one and then takes its place, so no
request fails: those already queued finish on the version they were queued for.
"""

import os
import threading
from pathlib import Path

from export.signature import METADATA_FILE
from pipeline.core.errors import UnusableFileError, first_line


def _export_in(directory):
    """`directory` or its onnx/, whichever holds an ONNX export; None for neither."""
    for candidate in (directory, directory / "onnx"):
        if (candidate / METADATA_FILE).is_file():
            return candidate
    return None


def find_versions(base):
    """{version: export directory} under `base`: its numbered subdirectories that hold an
    export, or {1: base} when `base` is an export itself."""
    base = Path(base)
    versions = {}
    for child in base.iterdir() if base.is_dir() else ():
        if child.name.isdigit() and (found := _export_in(child)):
            versions[int(child.name)] = found
    if not versions and (found := _export_in(base)):
        versions[1] = found
    return versions


def _identity(directory):
    try:
        return os.stat(directory).st_ino
    except OSError:
        return None


class ServedVersion:
    """A loaded version: its number, where it was read from (and that directory's identity,
    which a re-export changes), and what `load` made of it (anything with a `close()`)."""

    def __init__(self, number, directory, identity, model):
        self.number, self.directory, self.identity, self.model = number, directory, identity, model


class ModelVersions:
    """The served version of the model under `base`: `load(directory)` makes a model (with a
    `close()` that returns once its work is done); `poll()` swaps in a newer version, and a
    thread calls it every `poll_seconds` between `start()` and `stop()`."""

    def __init__(self, base, load, poll_seconds=1.0, log=print):
        self.base, self.load, self.poll_seconds, self.log = Path(base), load, poll_seconds, log
        self.served = None
        self._failed = None  # (version, identity) that did not load: not tried again
        self._stop = threading.Event()
        self._thread = None
        versions = find_versions(self.base)
        if not versions:
            raise UnusableFileError(self.base, f"no exported ONNX model ({METADATA_FILE}) in "
                                    "it or in a numbered version under it")  # fmt: skip
        self._serve(max(versions), versions[max(versions)], _identity(versions[max(versions)]))

    def poll(self):
        """Loads the highest version if it is not the one served; keeps the served one when
        it cannot be loaded (said once)."""
        versions = find_versions(self.base)
        if not versions:
            return
        number = max(versions)
        identity = _identity(versions[number])
        if (number, identity) in ((self.served.number, self.served.identity), self._failed):
            return
        try:
            self._serve(number, versions[number], identity)
        except Exception as error:  # a damaged export: said, and the served one kept
            self._failed = (number, identity)
            self.log(f"Version {number} ({versions[number]}) not loaded: {first_line(error)}")

    def _serve(self, number, directory, identity):
        served = self.served
        self.served = ServedVersion(number, directory, identity, self.load(directory))
        self.log(f"Serving version {number} from {directory}")
        if served is not None:  # its queued requests finish on it, off the request path
            threading.Thread(target=served.model.close, daemon=True).start()

    def start(self):
        def loop():
            while not self._stop.wait(self.poll_seconds):
                self.poll()

        self._thread = threading.Thread(target=loop, name="version-poll", daemon=True)
        self._thread.start()

    def stop(self):
        """Stops polling; closes the served version once its work is done."""
        self._stop.set()
        if self._thread is not None:
            self._thread.join()
        if self.served is not None:
            self.served.model.close()
