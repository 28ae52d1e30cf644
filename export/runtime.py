"""Translation with an exported ONNX model, without TensorFlow.

Needs numpy, onnxruntime and sentencepiece only:

    from export.runtime import OnnxTranslator
    translator = OnnxTranslator("runs/default/export")        # or the onnx/ folder itself
    translator.translate(["Ein Hund läuft über eine Wiese."], beam_size=5)

Tokenisation reads the same SentencePiece files as the SavedModel's in-graph tokenizer, so
both give the same ids. Sentences are decoded in length-sorted batches (less padding); results
keep the input order. A session may be shared by many threads; `inter_threads` translates
that many batches at once (as CTranslate2's option of that name), for throughput.
"""

import json
import os
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numpy as np
import onnxruntime
import sentencepiece

from export.signature import METADATA_FILE, SOURCE_IDS, TARGET_PREFIX, option_dtypes
from pipeline.core import multilingual
from pipeline.core.errors import UnusableFileError, UserError, first_line
from pipeline.core.translation_text import translation_text
from pipeline.data.length_batches import length_sorted_batches
from pipeline.decoding.search_options import MAX_BEAM_SIZE, check_values

# What the runtime reads from model.json; an export without one of them is too old or damaged.
METADATA_KEYS = ("model", "source_vocabulary", "target_vocabulary", "special_ids",
                 "max_source_length", "inputs")  # fmt: skip


def _find_export(path):
    path = Path(path)
    for candidate in (path, path / "onnx"):
        if (candidate / METADATA_FILE).is_file():
            return candidate
    raise UnusableFileError(path / METADATA_FILE, "not found: no exported ONNX model here")


def read_metadata(directory):
    """An export's model.json, checked for what the runtime reads; `UnusableFileError`
    naming the file when it is cut short, not JSON, or lacks a key."""
    path = Path(directory) / METADATA_FILE
    try:
        metadata = json.loads(path.read_bytes().decode("utf-8"))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as error:
        raise UnusableFileError(path, f"cannot read the export's description ({error})") from None
    missing = [
        key for key in METADATA_KEYS if not isinstance(metadata, dict) or key not in metadata
    ]
    if missing:
        raise UnusableFileError(path, f"no {missing[0]!r}: damaged, or from another version; "
                                "export the model again (python -m export)")  # fmt: skip
    return metadata


def _read_bytes(path, what):
    try:
        return path.read_bytes()
    except FileNotFoundError:
        raise UnusableFileError(path, f"{what} not found") from None
    except OSError as error:
        raise UnusableFileError(path, f"cannot read the {what} ({error.strerror})") from None


def _read_once(directory, int8):
    """(metadata, model, source vocabulary, target vocabulary, the model's path): each file
    of the export read once, as bytes (the model None where its tensors are in a file beside
    it: then ONNX Runtime reads it by path)."""
    metadata = read_metadata(directory)
    model_file = metadata["model"]
    if int8:
        model_file = metadata.get("int8_model")
        if not model_file:
            raise UnusableFileError(
                directory / METADATA_FILE,
                "no int8 model in this export; export with export.onnx_int8: true",
            )
    files = [
        (directory / model_file, "ONNX model"),
        (directory / metadata["source_vocabulary"], "vocabulary"),
        (directory / metadata["target_vocabulary"], "vocabulary"),
    ]
    if metadata.get("external_data"):  # ONNX Runtime reads the tensors beside it, by path
        model_path = files.pop(0)[0]
        if not model_path.is_file():
            raise UnusableFileError(model_path, "ONNX model not found")
        return (metadata, None, *(_read_bytes(path, what) for path, what in files), model_path)
    return (metadata, *(_read_bytes(path, what) for path, what in files), files[0][0])


def read_export(directory, int8=False, attempts=3):
    """The export's files, read as one version: a re-export replaces the directory by a
    rename, so when its identity changed during the reads, they are read again."""
    for _ in range(attempts):
        identity = os.stat(directory).st_ino
        try:
            files = _read_once(directory, int8)
        except UnusableFileError:
            if os.stat(directory).st_ino == identity:
                raise
            continue
        if os.stat(directory).st_ino == identity:
            return files
    raise UnusableFileError(directory, f"replaced while being read, {attempts} times; try again")


def _load(path, what, load):
    """`load()`; a damaged file raises `UnusableFileError` naming `path`."""
    try:
        return load()
    except Exception as error:  # onnxruntime and sentencepiece raise their own types
        raise UnusableFileError(path, f"cannot load the {what} ({first_line(error)})") from None


def encode_each(processor, texts):
    """The ids of each text, one call a text: given a list, SentencePiece starts a thread pool
    each call, which costs more than tokenising a sentence (bench/RESULTS.md)."""
    return [processor.encode(text) for text in texts]


def session_options(intra_op_threads=None, inter_threads=1):
    """Threads per batch: `intra_op_threads`, or the CPUs shared among `inter_threads` batches."""
    options = onnxruntime.SessionOptions()
    options.graph_optimization_level = onnxruntime.GraphOptimizationLevel.ORT_ENABLE_ALL
    cpus = os.cpu_count() or 1
    options.intra_op_num_threads = intra_op_threads or max(1, cpus // inter_threads)
    # The search settings are inputs with defaults by design; ORT would warn about each.
    options.log_severity_level = 3
    return options


class OnnxTranslator:
    """An exported model (`OUT` or `OUT/onnx`) in ONNX Runtime, with its vocabularies.

    `int8=True` loads `model.int8.onnx`, the model with int8 weights: faster on a CPU, with
    translations that may differ a little from the float model's.

    `inter_threads` batches run at once, each on `intra_op_threads` threads (by default the
    CPUs shared among them). One batch at a time with every CPU is the fastest for a single
    sentence; batches side by side on one CPU each give more sentences/s, as the search's many
    small kernels cannot use a second CPU.
    """

    def __init__(self, path, intra_op_threads=None, batch_size=64, int8=False, inter_threads=1):
        if inter_threads < 1:
            raise ValueError(f"inter_threads must be at least 1, not {inter_threads}")
        self.directory = _find_export(path)
        self.metadata, model, source, target, model_path = read_export(self.directory, int8)
        options = session_options(intra_op_threads, inter_threads)
        self.session = _load(
            model_path,
            "ONNX model",
            lambda: onnxruntime.InferenceSession(
                str(model_path) if model is None else model,
                options,
                providers=["CPUExecutionProvider"],
            ),
        )
        self.output_names = [output.name for output in self.session.get_outputs()]
        self.source, self.target = (
            _load(self.directory / self.metadata[key], "vocabulary",
                  lambda proto=proto: sentencepiece.SentencePieceProcessor(model_proto=proto))
            for key, proto in (("source_vocabulary", source), ("target_vocabulary", target))
        )  # fmt: skip
        self.batch_size = batch_size
        self.inter_threads = inter_threads
        self.pad_id = self.metadata["special_ids"]["pad"]
        self.eos_id = self.metadata["special_ids"]["eos"]
        languages = self.metadata.get("languages", {})
        self.request_languages = multilingual.RequestLanguages.of(languages)

    def encode(self, sentences):
        """Source ids of each sentence, cut at the exported `max_source_length`."""
        limit = self.metadata["max_source_length"]
        return [ids[:limit] for ids in encode_each(self.source, sentences)]

    def search(self, source_ids, target_prefix=None, **options):
        """Runs the model on one padded batch: int32 `[batch, src_len]` (and optionally the
        target prefixes, int32 `[batch, len]`, right-padded) -> dict of arrays. `ValueError`
        (`check_search`) for what the model cannot be asked."""
        return self.run(self.check_search(source_ids, target_prefix, **options))

    def run(self, feeds):
        """The model's outputs, by name, for `check_search`'s `feeds`."""
        return dict(zip(self.output_names, self.session.run(self.output_names, feeds)))

    def check_search(self, source_ids, target_prefix=None, **options):
        """The feeds of `search`, or a `ValueError` naming the argument that is wrong: ids
        that are not a matrix of this export's vocabulary's ids, an option that is not
        exported, or one out of the range the commands enforce."""
        source_ids = self._id_matrix(SOURCE_IDS, source_ids, self.source)
        if not source_ids.shape[1]:  # empty sources still need one (padding) column to encode
            source_ids = np.full((len(source_ids), 1), self.pad_id, np.int32)
        feeds = {SOURCE_IDS: source_ids}
        if target_prefix is None and self.request_languages.target_tokens:
            raise ValueError(f"{TARGET_PREFIX}: this model's targets start with their "
                             "language's token (model.json's languages.target_tokens): give "
                             "its id as the prefix of each")  # fmt: skip
        if target_prefix is not None:
            if TARGET_PREFIX not in self.metadata["inputs"]:
                raise ValueError(f"{self.directory}: this export takes no {TARGET_PREFIX}")
            feeds[TARGET_PREFIX] = self._id_matrix(TARGET_PREFIX, target_prefix, self.target)
        given = {name: value for name, value in options.items() if value is not None}
        option_dtypes(given)  # a TypeError for a name that is no exported option
        if self.metadata.get("search") == "greedy":
            given = self._greedy_options(given)
        defaults = self.metadata.get("defaults", {})
        if "n_best" in given and "beam_size" not in given and "beam_size" in defaults:
            # As `SearchOptions.with_overrides`: a default beam narrower than n_best widens.
            given["beam_size"] = max(defaults["beam_size"], given["n_best"])
        values = {**defaults, **given}
        try:  # the relations (n_best within beam_size) with the export's defaults too
            check_values(values)
        except UserError as wrong:
            raise ValueError(str(wrong)) from None
        if values.get("n_best", 1) > MAX_BEAM_SIZE:  # the graph clips the beam, not n_best
            raise ValueError(f"n_best ({values['n_best']}) cannot exceed {MAX_BEAM_SIZE}, the "
                             "widest beam of an export")  # fmt: skip
        feeds.update({name: np.asarray(given[name], dtype=dtype)
                      for name, dtype in option_dtypes(given).items()})  # fmt: skip
        return feeds

    def _greedy_options(self, given):
        """`given` without what a greedy search is (beam_size and n_best 1) or ignores (the
        length penalty); `ValueError` for an option the greedy export does not take."""
        inputs = self.metadata["inputs"]
        for name, value in given.items():
            ignored = name == "length_penalty" or (name in ("beam_size", "n_best") and value == 1)
            if name not in inputs and not ignored:
                raise ValueError(f"{self.directory}: this export has the greedy search alone "
                                 f"(export.onnx_search: greedy) and takes no {name} ({value}); "
                                 "export with export.onnx_search: beam for it")  # fmt: skip
        return {name: value for name, value in given.items() if name in inputs}

    @staticmethod
    def _id_matrix(name, ids, vocabulary):
        """`ids` as int32 `[rows, columns]`; `ValueError` naming `name` unless every id is one
        of `vocabulary`'s."""
        try:
            matrix = np.asarray(ids)
        except ValueError:  # numpy refuses ragged rows
            raise ValueError(f"{name}: the rows differ in length; pad them with 0") from None
        if name == SOURCE_IDS and matrix.ndim and not len(matrix):
            raise ValueError(f"{name} has no rows: send at least one sentence")
        if matrix.ndim != 2 or not (matrix.size == 0 or np.issubdtype(matrix.dtype, np.integer)):
            raise ValueError(f"{name} must be a matrix of integer ids (rows padded with 0), "
                             f"not of shape {matrix.shape} and type {matrix.dtype}")  # fmt: skip
        size = vocabulary.get_piece_size()
        outside = matrix[(matrix < 0) | (matrix >= size)]
        if outside.size:
            raise ValueError(f"{name}: id {outside[0]} is outside the vocabulary (0 to {size - 1})")
        return matrix.astype(np.int32)

    def _padded(self, rows):
        """int32 `[len(rows), longest]` (at least one column), right-padded."""
        batch = np.full((len(rows), max(1, *map(len, rows))), self.pad_id, dtype=np.int32)
        for r, ids in enumerate(rows):
            batch[r, : len(ids)] = ids
        return batch

    def translate_ids(self, source_ids, target_prefixes=None, progress=None, **options):
        """For each id list, its `n_best` hypotheses as (target ids without </s>, score);
        each starts with its `target_prefixes` ids where given. `progress(n)` is called as
        each batch of n sentences is done."""
        results = [None] * len(source_ids)
        batches = list(length_sorted_batches([len(ids) for ids in source_ids], self.batch_size))

        def search_batch(indices):
            prefix = None
            if target_prefixes is not None:
                prefix = self._padded([target_prefixes[i] for i in indices])
            return self.search(self._padded([source_ids[i] for i in indices]), prefix, **options)

        if self.inter_threads > 1 and len(batches) > 1:
            with ThreadPoolExecutor(min(self.inter_threads, len(batches))) as pool:
                outputs = pool.map(search_batch, batches)
        else:
            outputs = map(search_batch, batches)
        for indices, output in zip(batches, outputs):
            for row, index in enumerate(indices):
                results[index] = [  # an empty source comes back as ids all pad, score 0
                    (self._strip(ids), float(score))
                    for ids, score in zip(output["ids"][row], output["scores"][row])
                ]
            if progress is not None:
                progress(len(indices))
        return results

    def encode_prefixes(self, target_prefixes):
        """Target ids of each prefix text (None for None)."""
        return None if target_prefixes is None else encode_each(self.target, target_prefixes)

    def translate(self, sentences, target_prefix=None, progress=None, target_language=None,
                  source_language=None, **options):  # fmt: skip
        """The best translation of each sentence, as text ("" for an empty sentence), as
        `pipeline.decoding.translation.Translator.translate` gives it.

        `target_prefix`: a text per sentence ("" for none) that its translation must start
        with. `target_language`: a multilingual model's language to translate into, one code
        or one a sentence (`ValueError` when missing or unknown; `languages`);
        `source_language` likewise, for a model that takes it (a many-to-many import's).
        Options: any of `pipeline.decoding.search_options.EXPORTED_OPTIONS`, each omitted
        taking the exported default.
        """
        hypotheses = self.translate_ids(
            *self.encode_requests(sentences, target_prefix, target_language, source_language),
            progress, **options,
        )  # fmt: skip
        return [self.text(best[0][0]) for best in hypotheses]

    def translate_n_best(self, sentences, n_best, target_prefix=None, progress=None,
                         target_language=None, source_language=None, **options):  # fmt: skip
        """The `n_best` (text, score) pairs of each sentence, best first."""
        hypotheses = self.translate_ids(
            *self.encode_requests(sentences, target_prefix, target_language, source_language),
            progress, n_best=n_best, **options,
        )  # fmt: skip
        return [[(self.text(ids), score) for ids, score in h] for h in hypotheses]

    def text(self, ids):
        """The translation of target `ids` (`pipeline.core.translation_text`)."""
        strip = self.metadata.get("strip_translation_spaces", False)  # absent from older exports
        return translation_text(self.target.decode(ids), strip)

    @property
    def languages(self):
        """The languages a multilingual model translates into ([] for a bilingual one)."""
        return list(self.metadata.get("languages", {}).get("targets", []))

    def requests(self, *args, **kwargs):
        """`multilingual.RequestLanguages.requests` of this export's model."""
        return self.request_languages.requests(*args, **kwargs)

    def encode_requests(self, sentences, target_prefix=None, target_language=None,
                        source_language=None):  # fmt: skip
        """(source ids, target prefix ids or None) of `sentences` as the model takes them,
        asked as `translate` is; `ValueError` naming a missing or unknown language."""
        sources = self.requests(sentences, target_language, source_language)
        prefixes = self.request_languages.target_prefixes(sentences, target_language,
                                                          target_prefix)  # fmt: skip
        return self.encode(sources), self.encode_prefixes(prefixes)

    def _strip(self, ids):
        ids = ids.tolist()
        end = ids.index(self.eos_id) if self.eos_id in ids else len(ids)
        return [i for i in ids[:end] if i != self.pad_id]


def __getattr__(name):
    if name == "Translator":  # OnnxTranslator's name before it was told from pipeline's
        import warnings

        warnings.warn(
            "export.runtime.Translator is deprecated: use export.runtime.OnnxTranslator",
            DeprecationWarning,
            2,
        )
        return OnnxTranslator
    raise AttributeError(f"module 'export.runtime' has no attribute {name!r}")
