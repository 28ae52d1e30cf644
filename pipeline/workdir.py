"""The layout of a work directory, and loading what training left in it."""

import contextlib
import fcntl
import os
import shutil
import socket
import sys
import tempfile
import time
from pathlib import Path

from pipeline.config import load_config
from pipeline.core.atomic_files import atomic_path, writing
from pipeline.core.errors import UnusableFileError, UserError, first_line

CONFIG_FILE = "config.yaml"
MODEL_FILE = "model.keras"
CHECKPOINT_DIR = "checkpoints"
LOG_DIR = "logs"
TEST_REPORT = "test_report.json"
TEST_TRANSLATIONS = "test_translations.txt"
LOCK_FILE = ".lock"  # the writers' advisory lock; its text names the holder

_held_locks = {}  # resolved directory -> (open lock file, nesting depth), in this process


def _holder(handle):
    handle.seek(0)
    return handle.read().strip() or "another process"


def _this_command():
    """This process's command line as typed: `python -m pipeline.train --config X`."""
    program, *arguments = sys.argv or ["-c"]
    path = Path(program)
    if path.parent.name in ("pipeline", "export"):
        module = path.parent.name if path.stem == "__main__" else f"{path.parent.name}.{path.stem}"
        program = f"-m {module}"
    return " ".join(["python", program, *arguments])


@contextlib.contextmanager
def exclusive_writer(directory, wait=False, log=print):
    """Holds the directory's writer lock for the block: one process at a time trains,
    averages or exports into a work directory. An advisory lock (`flock`) on `LOCK_FILE`,
    released by the operating system when the process ends however it ends, so a crash
    leaves no stale lock. Another holder: `UserError` naming it, nothing written (or with
    `wait`, a wait for it). Reentrant within a process (training's export after training).
    Readers take no lock: every file they read is replaced atomically."""
    directory = Path(directory)
    key = directory.resolve()
    if key in _held_locks:
        handle, depth = _held_locks[key]
        _held_locks[key] = handle, depth + 1
        try:
            yield
        finally:
            _held_locks[key] = handle, depth
        return
    with writing(directory / LOCK_FILE):
        directory.mkdir(parents=True, exist_ok=True)
        handle = open(directory / LOCK_FILE, "a+", encoding="utf-8")
    with handle:
        try:
            fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            holder = _holder(handle)
            if not wait:
                raise UserError(
                    f"{directory} is in use by {holder}; wait for it to end (--wait queues "
                    "behind it) or use another directory"
                ) from None
            log(f"Waiting for {holder} to finish with {directory}")
            fcntl.flock(handle, fcntl.LOCK_EX)
        started = time.strftime("%Y-%m-%d %H:%M:%S")
        with writing(directory / LOCK_FILE):
            handle.seek(0)
            handle.truncate()
            handle.write(f"{_this_command()} (host {socket.gethostname()}, pid {os.getpid()}, "
                         f"since {started})\n")  # fmt: skip
            handle.flush()
        _held_locks[key] = handle, 0
        try:
            yield
        finally:
            del _held_locks[key]


def save_model_atomically(model, path):
    from layers.keras_internals import weights_saved_through_disk

    # Not through an in-memory copy of every weight (`weights_saved_through_disk`).
    with atomic_path(path) as tmp, weights_saved_through_disk():
        model.save(tmp)


def write_directory_atomically(path, fill):
    """Creates the directory `path` by `fill(tmp)` on a temporary sibling, then renames it.

    An interrupted write leaves only a hidden `.NAME.tmp-*` sibling, never a partial `path`
    (TF Serving, for one, ignores non-numeric names), and a failed one (a full disk) nothing:
    it raises `WriteFailed`. An existing `path` is replaced only once the new one is complete.
    """
    path = Path(path)
    with writing(path):
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = Path(tempfile.mkdtemp(prefix=f".{path.name}.tmp-", dir=path.parent))
    tmp.chmod(0o755)  # mkdtemp's 0700 would hide the result from a server running as another user
    try:
        with writing(path):
            fill(tmp)
            if path.exists():
                old = Path(tempfile.mkdtemp(prefix=f".{path.name}.old-", dir=path.parent))
                os.replace(path, old / path.name)
                os.replace(tmp, path)
                shutil.rmtree(old)
            else:
                os.replace(tmp, path)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def load_trained(workdir):
    """The configuration, model and tokenizers of a trained work directory."""
    import keras

    import layers  # noqa: F401  (registers the layers for deserialisation)
    from pipeline.data.tokenizer import Tokenizer, vocabulary_paths
    from pipeline.model_types.builder import variables_made_as_zeros

    workdir = Path(workdir)
    config_path, model_path = workdir / CONFIG_FILE, workdir / MODEL_FILE
    if not config_path.is_file() or not model_path.is_file():
        raise UserError(
            f"{workdir}: no trained model here (expected {CONFIG_FILE} and {MODEL_FILE}); "
            "run python -m pipeline.train first"
        )
    config = load_config(config_path, saved=True)
    source_path, target_path = vocabulary_paths(workdir)
    source_tokenizer, target_tokenizer = Tokenizer(source_path), Tokenizer(target_path)
    try:
        # safe_mode: a model file may not run code (no lambdas) on loading. The variables are
        # made as zeros: the file's weights replace every one.
        with variables_made_as_zeros():
            model = keras.saving.load_model(model_path, compile=False, safe_mode=True)
    except Exception as error:  # Keras raises many types for a damaged file
        raise UnusableFileError(
            model_path, f"cannot load the model ({first_line(error)})"
        ) from None
    for tokenizer, size in (
        (source_tokenizer, model.source_vocab_size),
        (target_tokenizer, model.target_vocab_size),
    ):
        if tokenizer.vocab_size != size:
            raise UserError(
                f"{tokenizer.model_path}: {tokenizer.vocab_size} pieces, but {model_path} was "
                f"trained with {size}; the vocabulary does not belong to this model"
            )
    return config, model, source_tokenizer, target_tokenizer


def load_ensemble(workdirs, weights=None):
    """`load_trained`'s (configuration, model, source tokenizer, target tokenizer) of one
    work directory, or of several as one `pipeline.model_types.ensemble.Ensemble` (with
    `weights`) with the first one's configuration (search settings) and vocabularies. Members
    whose vocabularies or languages differ are refused, naming the first difference."""
    from pipeline.core import multilingual
    from pipeline.model_types.ensemble import Ensemble

    workdirs = [Path(workdir) for workdir in workdirs]
    if len(workdirs) == 1 and weights is None:
        return load_trained(workdirs[0])
    loaded = [load_trained(workdir) for workdir in workdirs]
    first_config, _, *first_tokenizers = loaded[0]
    for workdir, (config, _, *tokenizers) in zip(workdirs[1:], loaded[1:]):
        for side, mine, theirs in zip(("source", "target"), first_tokenizers, tokenizers):
            difference = _vocabulary_difference(mine, theirs)
            if difference:
                raise UserError(f"{workdir}: its {side} vocabulary differs from "
                                f"{workdirs[0]}'s ({difference}); an ensemble's models share "
                                "their vocabularies")  # fmt: skip
        targets = [multilingual.language_tags(c["data"]) for c in (first_config, config)]
        if targets[0] != targets[1]:  # the tags a multilingual model's requests may name
            raise UserError(
                f"{workdir}: translates into {', '.join(targets[1]) or 'one language'}, "
                f"{workdirs[0]} into {', '.join(targets[0]) or 'one language'}"
            )
    ensemble = Ensemble([model for _, model, _, _ in loaded], weights)
    return first_config, ensemble, *first_tokenizers


def _vocabulary_difference(mine, theirs):
    """The first way two `Tokenizer`s differ, in words ('' when they are the same model)."""
    if mine.model_proto == theirs.model_proto:
        return ""
    if mine.vocab_size != theirs.vocab_size:
        return f"{theirs.vocab_size} pieces against {mine.vocab_size}"
    for piece_id in range(mine.vocab_size):
        piece, other = mine.processor.id_to_piece(piece_id), theirs.processor.id_to_piece(piece_id)
        if piece != other:
            return f"piece {piece_id} is {other!r}, not {piece!r}"
    return "the same pieces, segmented with other scores or settings"


def add_model_arguments(parser):
    """`--workdir DIR` (repeated: an ensemble) and `--weights` of the commands that translate
    or score; `load_ensemble(args.workdir, args.weights)` loads what they name."""
    parser.add_argument("--workdir", type=Path, action="append", required=True,
                        help="a trained work directory; give it again for each further model "
                             "of an ensemble (one vocabulary)")  # fmt: skip
    parser.add_argument("--weights", type=float, nargs="+", metavar="W",
                        help="an ensemble: each model's weight, in --workdir order (default: "
                             "equal)")  # fmt: skip
