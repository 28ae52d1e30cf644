"""A pretrained checkpoint in the Hugging Face layout, read without torch where its files allow:
its JSON files, its SentencePiece models, and its weights as NumPy arrays. No TensorFlow here."""

import collections.abc
import contextlib
import json
import re
from pathlib import Path

import numpy as np

from pipeline.core.errors import UnusableFileError, UserError, first_line

CONFIG_FILE = "config.json"
GENERATION_CONFIG_FILE = "generation_config.json"
TOKENIZER_CONFIG_FILE = "tokenizer_config.json"
SAFETENSORS_FILE = "model.safetensors"
SAFETENSORS_INDEX = "model.safetensors.index.json"  # a sharded checkpoint's key -> shard
TORCH_FILE = "pytorch_model.bin"
TORCH_INDEX = "pytorch_model.bin.index.json"  # a sharded PyTorch checkpoint's key -> shard
MODEL_CARD_FILE = "README.md"  # the Hub's model card: YAML front matter, then prose
# What a Hub download fetches: every file an importer reads, and no other format's weights;
# the PyTorch files only from a repository without safetensors (`hub_patterns`).
HUB_PATTERNS = ["*.json", "*.spm", "*.model", "*.safetensors", MODEL_CARD_FILE]
HUB_TORCH_PATTERN = "pytorch_model*.bin"
HUB_ID = re.compile(r"[A-Za-z0-9][\w.-]*/[\w.-]+")
# safetensors' dtype names of the weights an import reads (each converted to float32).
FLOAT_DTYPES = {"F64": "float64", "F32": "float32", "F16": "float16", "BF16": "bfloat16"}


class Checkpoint:
    """The files of one checkpoint directory, each read once and checked as it is read: a
    missing or damaged file raises `UnusableFileError` naming it."""

    def __init__(self, directory):
        self.directory = Path(directory)
        self.config = self.json(CONFIG_FILE)

    def stored_as(self):
        """How the weights are stored, in words ("bfloat16", "float16 and float32"; every
        tensor is read as float32), or None for a PyTorch file, which torch reads."""
        if not any((self.directory / name).is_file()
                   for name in (SAFETENSORS_INDEX, SAFETENSORS_FILE)):  # fmt: skip
            return None
        dtypes = self.weights().dtypes.values()
        names = sorted({FLOAT_DTYPES.get(dtype, dtype) for dtype in dtypes})
        return " and ".join(names)

    def licence(self):
        """The licence the checkpoint names, in words ("cc-by-nc-4.0"; "other: NAME LINK"),
        from its model card's front matter or else config.json's `license`; None where
        neither names one."""
        card = _front_matter(self.directory / MODEL_CARD_FILE)
        named = card.get("license") or self.config.get("license")
        if not named or not isinstance(named, str):
            return None
        details = [str(card[key]) for key in ("license_name", "license_link") if card.get(key)]
        return f"{named}: {' '.join(details)}" if details else named

    def path(self, name, required=True):
        path = self.directory / name
        if required and not path.is_file():
            raise UnusableFileError(path, "missing: the checkpoint's directory must hold it")
        return path

    def json(self, name, required=True):
        """The JSON object in `name`, or {} for an absent optional file."""
        path = self.path(name, required)
        if not path.is_file():
            return {}
        try:
            value = json.loads(path.read_text(encoding="utf-8"))
        except (OSError, UnicodeDecodeError, json.JSONDecodeError) as error:
            raise UnusableFileError(path, f"not readable JSON ({first_line(error)})") from None
        if not isinstance(value, dict):
            raise UnusableFileError(path, "expected a JSON object")
        return value

    def bytes(self, name):
        try:
            return self.path(name).read_bytes()
        except OSError as error:
            raise UnusableFileError(self.directory / name, first_line(error)) from None

    def weights(self):
        """{name: float32 array} of every tensor of the checkpoint, with `shape(name)` and
        `rows(name, rows)`: model.safetensors (or its shards) through safetensors' NumPy API,
        each tensor read when asked for (`SafetensorsWeights`); else pytorch_model.bin (or its
        shards) through torch (`InMemoryWeights`)."""
        if (self.directory / SAFETENSORS_INDEX).is_file():
            shards = sorted(set(self.json(SAFETENSORS_INDEX).get("weight_map", {}).values()))
            return SafetensorsWeights([self.path(shard) for shard in shards])
        if (self.directory / SAFETENSORS_FILE).is_file():
            return SafetensorsWeights([self.directory / SAFETENSORS_FILE])
        if (self.directory / TORCH_INDEX).is_file():
            shards = sorted(set(self.json(TORCH_INDEX).get("weight_map", {}).values()))
            weights = InMemoryWeights()
            for shard in shards:  # one shard's tensors held by torch at a time
                weights.update(_read_torch(self.path(shard)))
            return weights
        if (self.directory / TORCH_FILE).is_file():
            return _read_torch(self.directory / TORCH_FILE)
        raise UnusableFileError(
            self.directory, f"no weights: expected {SAFETENSORS_FILE} (or {TORCH_FILE})"
        )


class InMemoryWeights(dict):
    """{name: float32 array}, all read at once."""

    def shape(self, name):
        return self[name].shape

    def rows(self, name, rows):
        return self[name][rows]


class SafetensorsWeights(collections.abc.Mapping):
    """{name: float32 array} of safetensors files, each tensor read from its file (memory
    mapped) only when asked for, so that an import holds one tensor at a time rather than the
    whole checkpoint, and an embedding table a block of rows at a time (`rows`); the files'
    headers are read (and checked) at once. `dtypes`: {name: its dtype as stored, safetensors'
    name}; bfloat16 tensors, which NumPy has no type for, are read as their bits."""

    def __init__(self, paths):
        self._files, self.dtypes = {}, {}
        for path in paths:
            with _opened(path) as tensors:
                for name in tensors.keys():
                    self._files[name] = path
                    self.dtypes[name] = tensors.get_slice(name).get_dtype()

    def __getitem__(self, name):
        path = self._files[name]
        if self.dtypes[name] == "BF16":
            return _float32(_from_bfloat16(_bfloat16_bits(path, name)[...]), path, name)
        with _opened(path) as tensors:
            return _float32(tensors.get_tensor(name), path, name)

    def shape(self, name):
        with _opened(self._files[name]) as tensors:
            return tuple(tensors.get_slice(name).get_shape())

    def rows(self, name, rows):
        """`self[name][rows]`, reading only those rows: each run of consecutive ones at once."""
        path = self._files[name]
        order = np.argsort(rows, kind="stable")
        ascending = rows[order]
        runs = np.split(ascending, np.flatnonzero(np.diff(ascending) > 1) + 1)
        with _opened(path) as tensors:
            if self.dtypes[name] == "BF16":
                bits = _bfloat16_bits(path, name)
                table = _Rows(lambda start, stop: _from_bfloat16(bits[start:stop]))
            else:
                table = tensors.get_slice(name)
            parts = [_float32(table[int(run[0]) : int(run[-1]) + 1], path, name)[run - run[0]]
                     for run in runs]  # fmt: skip
        gathered = np.empty_like(parts[0], shape=(len(rows), *parts[0].shape[1:]))
        gathered[order] = np.concatenate(parts)
        return gathered

    def __contains__(self, name):  # without reading the tensor, as Mapping's would
        return name in self._files

    def __iter__(self):
        return iter(self._files)

    def __len__(self):
        return len(self._files)


@contextlib.contextmanager
def _opened(path):
    """safe_open(path) as NumPy; a damaged file is an `UnusableFileError` naming it."""
    from safetensors import SafetensorError, safe_open

    try:
        with safe_open(str(path), framework="np") as tensors:
            yield tensors
    except (SafetensorError, OSError, ValueError) as error:
        raise UnusableFileError(
            path, f"not a readable safetensors file ({first_line(error)})"
        ) from None


def _read_torch(path):
    try:
        import torch
    except ImportError:
        raise UnusableFileError(
            path,
            "a PyTorch checkpoint, which needs torch to read: pip install torch (CPU "
            "builds: https://download.pytorch.org/whl/cpu), or convert it to model.safetensors",
        ) from None
    try:
        state = torch.load(str(path), map_location="cpu", weights_only=True)
    except Exception as error:  # torch raises many types for a damaged file
        raise UnusableFileError(
            path, f"not a readable PyTorch checkpoint ({first_line(error)})"
        ) from None
    return InMemoryWeights(
        {name: _float32(tensor.float().numpy(), path, name) for name, tensor in state.items()}
    )


class _Rows:
    """`table[start:stop]` as `read(start, stop)` gives it."""

    def __init__(self, read):
        self.read = read

    def __getitem__(self, rows):
        return self.read(rows.start, rows.stop)


def _bfloat16_bits(path, name):
    """The bfloat16 tensor `name` of the safetensors file `path`, memory mapped as its bits
    (uint16): the file is 8 bytes of header length, the JSON header, then the tensors."""
    with open(path, "rb") as file:
        length = int.from_bytes(file.read(8), "little")
        entry = json.loads(file.read(length))[name]
    return np.memmap(path, np.uint16, "r", offset=8 + length + entry["data_offsets"][0],
                     shape=tuple(entry["shape"]))  # fmt: skip


def _from_bfloat16(bits):
    """bfloat16 values, as their uint16 bits, as float32: the upper half of its bits."""
    return (np.asarray(bits).astype(np.uint32) << 16).view(np.float32)


def _float32(array, path, name):
    if not np.issubdtype(array.dtype, np.floating):
        raise UnusableFileError(path, f"{name}: {array.dtype} weights, expected floating point")
    return np.asarray(array, np.float32)


def _front_matter(path):
    """The YAML mapping between a Markdown file's opening `---` lines; {} where the file, the
    block or a mapping in it is missing or unreadable (a model card is prose for people)."""
    import yaml

    try:
        text = path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError):
        return {}
    block = re.match(r"---[ \t]*\r?\n(.*?)\r?\n---[ \t]*(\r?\n|$)", text, re.DOTALL)
    if not block:
        return {}
    try:
        value = yaml.safe_load(block.group(1))
    except yaml.YAMLError:
        return {}
    return value if isinstance(value, dict) else {}


def hub_patterns(repo_id):
    """The files to fetch of the Hub repository `repo_id`: HUB_PATTERNS, and its PyTorch
    weights where it has no safetensors ones (or its listing cannot be read: offline, the
    cache answers with what it holds)."""
    from huggingface_hub import list_repo_files

    try:
        files = list_repo_files(str(repo_id))
    except Exception:  # offline, or the download to come says what is wrong in one line
        files = []
    if any(name.endswith(".safetensors") for name in files):
        return HUB_PATTERNS
    return [*HUB_PATTERNS, HUB_TORCH_PATTERN]


def resolve(source, log=print):
    """The local directory of `source`: a directory as it is; a Hub id (`owner/name`, where
    no such directory exists) downloaded through huggingface_hub where it is installed and
    the network allows. Anything else: a `UserError` in one line."""
    path = Path(source)
    if path.is_dir():
        return path
    if path.exists():
        raise UserError(f"{source}: not a directory; give a checkpoint's directory or a Hub id")
    if not HUB_ID.fullmatch(str(source)):
        raise UserError(f"{source}: no such directory")
    try:
        from huggingface_hub import snapshot_download
    except ImportError:
        raise UserError(
            f"{source}: no such directory, and fetching it from the Hugging Face Hub needs "
            'huggingface_hub (pip install "seq2seq-tf[hub]"); or download it and give its '
            "directory"
        ) from None
    log(f"Fetching {source} from the Hugging Face Hub")
    try:
        return Path(snapshot_download(repo_id=str(source), allow_patterns=hub_patterns(source)))
    except Exception as error:  # offline, unknown repository, gated model: all one line
        raise UserError(f"{source}: cannot fetch it from the Hub ({first_line(error)})") from None
