"""The layout of a work directory, and loading what training left in it."""

import os
import shutil
import tempfile
from pathlib import Path

from pipeline.atomic_files import atomic_path
from pipeline.config import load_config
from pipeline.errors import UserError, first_line

CONFIG_FILE = "config.yaml"
MODEL_FILE = "model.keras"
CHECKPOINT_DIR = "checkpoints"
LOG_DIR = "logs"
TEST_REPORT = "test_report.json"
TEST_TRANSLATIONS = "test_translations.txt"


def save_model_atomically(model, path):
    with atomic_path(path) as tmp:
        model.save(tmp)


def write_directory_atomically(path, fill):
    """Creates the directory `path` by `fill(tmp)` on a temporary sibling, then renames it.

    An interrupted write leaves only a hidden `.NAME.tmp-*` sibling, never a partial `path`
    (TF Serving, for one, ignores non-numeric names). An existing `path` is replaced only
    once the new one is complete.
    """
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{path.name}.tmp-", dir=path.parent))
    tmp.chmod(0o755)  # mkdtemp's 0700 would hide the result from a server running as another user
    try:
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
    from pipeline.tokenizer import Tokenizer, vocabulary_paths

    workdir = Path(workdir)
    config_path, model_path = workdir / CONFIG_FILE, workdir / MODEL_FILE
    if not config_path.is_file() or not model_path.is_file():
        raise UserError(
            f"{workdir}: no trained model here (expected {CONFIG_FILE} and {MODEL_FILE}); "
            "run python -m pipeline.train first"
        )
    config = load_config(config_path)
    source_path, target_path = vocabulary_paths(workdir)
    source_tokenizer, target_tokenizer = Tokenizer(source_path), Tokenizer(target_path)
    try:
        # safe_mode: a model file may not run code (no lambdas) on loading.
        model = keras.saving.load_model(model_path, compile=False, safe_mode=True)
    except Exception as error:  # Keras raises many types for a damaged file
        raise UserError(f"{model_path}: cannot load the model ({first_line(error)})") from None
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
