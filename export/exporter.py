"""Exports a trained work directory: a versioned SavedModel for TF Serving, an ONNX model and
(Transformers only, on request) a CTranslate2 model.

    OUT/saved_model/<model_name>/<version>/   signatures serving_default and beam_search
    OUT/onnx/                                 model.onnx, model.json, vocabularies
    OUT/ctranslate2/                          model.bin, config.json, vocabularies

Each is written to a temporary sibling and renamed into place, so an interrupted export
leaves no partial version directory and keeps the previous ONNX or CTranslate2 model.
"""

import contextlib
import re
import time
from pathlib import Path

import tensorflow as tf

from export.onnx_model import write_onnx
from export.serving_check import read_meta_graph, unsupported_ops
from export.serving_graph import TranslationGraph
from export.signature import METADATA_FILE
from pipeline.config import (
    DEFAULT_EXPORT_FORMATS,
    check_formats_fit_model,
    load_config,
    parse_export_formats,
)
from pipeline.core import library_output, multilingual
from pipeline.core.atomic_files import writing
from pipeline.core.errors import UserError
from pipeline.data.tokenizer import vocabulary_paths
from pipeline.model_types import MODEL_TYPES
from pipeline.model_types.builder import at_precision
from pipeline.workdir import (
    CONFIG_FILE,
    exclusive_writer,
    load_ensemble,
    write_directory_atomically,
)

EXPORT_LOG = "export.log"  # what the converters write to stderr, beside the exports


def _check_model_name(name):
    if not re.fullmatch(r"[A-Za-z0-9][A-Za-z0-9_.-]*", name):
        raise UserError(f"model name {name!r}: use letters, digits, '.', '_' and '-'")


def next_version(model_dir):
    """One more than the highest numeric version under `model_dir` (1 for none)."""
    versions = [int(p.name) for p in Path(model_dir).glob("*") if p.name.isdigit()]
    return max(versions, default=0) + 1


# A SavedModel's variables go to files of at most this size (TensorFlow's sharding policy), so
# that a multi-gigabyte model is no single file to copy, store or serve.
SAVED_MODEL_SHARD_BYTES = 1 << 30


def export_saved_model(graph, output, model_name, version, log=print, precision="float32"):
    model_dir = Path(output) / "saved_model" / model_name
    version = version or next_version(model_dir)
    target = model_dir / str(version)
    if target.exists():
        raise UserError(f"{target} already exists; pass another --version (or none for the next)")
    sharding = tf.train.experimental.MaxShardSizePolicy(max_shard_size=SAVED_MODEL_SHARD_BYTES)
    options = tf.saved_model.SaveOptions(experimental_sharding_callback=sharding)
    signatures = graph.signatures()
    write_directory_atomically(
        target, lambda tmp: tf.saved_model.save(graph, str(tmp), signatures, options)
    )
    missing = unsupported_ops(read_meta_graph(target).graph_def)
    if missing:
        log(f"Warning: ops absent from stock TF Serving (2.12+): {', '.join(missing)}")
    weights = "" if precision == "float32" else f", {precision} weights"
    log(f"SavedModel: {target} (signatures {', '.join(graph.signatures())}{weights})")
    return target


def model_description(workdirs, model):
    """model.json's `description`: what a runtime may show of the model it loaded, with its
    type and properties (`ModelType.properties`: the constructor arguments, by the config's
    names), or an ensemble's members' each."""
    members = []
    for workdir in map(Path, workdirs):
        config = load_config(workdir / CONFIG_FILE, saved=True)
        model_type = MODEL_TYPES[config["model"]["type"]]
        members.append({"name": workdir.resolve().name, "type": model_type.name,
                        "properties": model_type.properties(config)})  # fmt: skip
    parameters = sum(member.count_params() for member in getattr(model, "members", [model]))
    if len(members) == 1:
        return {**members[0], "parameters": parameters}
    return {"name": f"ensemble of {', '.join(m['name'] for m in members)}",
            "type": members[0]["type"], "parameters": parameters, "members": members}  # fmt: skip


def export_onnx(graph, workdir, output, opset, int8=True, log=print, languages=None,
                description=None, search="beam"):  # fmt: skip
    target = Path(output) / "onnx"
    write_directory_atomically(
        target,
        lambda tmp: write_onnx(
            graph, tmp, vocabulary_paths(workdir), opset, int8, languages, description, search
        ),  # fmt: skip
    )
    also = " and model.int8.onnx" if int8 else ""
    files = f"vocabularies and {METADATA_FILE}"
    searching = "" if search == "beam" else f", {search} search"
    log(f"ONNX: {target / 'model.onnx'}{also} (opset {opset}{searching}), with {files}")
    return target


def export_ctranslate2(model, workdir, output, quantization, log=print):
    from export.ctranslate2_model import write_ctranslate2

    target = Path(output) / "ctranslate2"
    weights = None if quantization == "none" else quantization
    write_directory_atomically(
        target, lambda tmp: write_ctranslate2(model, tmp, vocabulary_paths(workdir), weights)
    )
    log(f"CTranslate2: {target} ({quantization if weights else 'float32'} weights), with "
        "vocabularies")  # fmt: skip
    return target


def export_model(
    workdir,
    output=None,
    formats=DEFAULT_EXPORT_FORMATS,
    version=None,
    model_name=None,
    log=print,
    verbose=False,
    wait=False,
    ensemble=(),
    weights=None,
    onnx_search=None,
    saved_model_precision=None,
):
    """Exports `workdir`'s model in `formats` under `output` (default: the configuration's
    export.directory, else WORKDIR/export); returns {format: path}. With `ensemble` (further
    work directories of the same vocabulary) and `weights`, one model holding all of them and
    their combined search (`pipeline.model_types.ensemble`), under `output`, which it needs.
    `onnx_search` ("beam" or "greedy") overrides export.onnx_search, `saved_model_precision`
    ("float32" or "bfloat16") export.saved_model_precision (the other formats stay float32).
    What the converters write to stderr goes to OUT/export.log unless `verbose`. An export
    into the work directory holds its writer lock (waiting for another holder with `wait`); one
    elsewhere reads it only."""
    if ensemble and not output:
        raise UserError("an ensemble's export needs --output: it belongs to no one work directory")
    if ensemble and "ctranslate2" in formats:
        raise UserError("--formats ctranslate2 holds one model: export an ensemble as "
                        "saved_model or onnx")  # fmt: skip
    config, model, source_tokenizer, target_tokenizer = load_ensemble([workdir, *ensemble],
                                                                      weights)  # fmt: skip
    if "ctranslate2" in formats:  # refused now rather than after the other formats
        check_formats_fit_model(formats, config["model"]["type"], str(workdir))
        import export.ctranslate2_model  # noqa: F401  (names the package to install, if missing)
    settings = config["export"]
    output = Path(output or settings["directory"] or Path(workdir) / "export")
    model_name = model_name or settings["model_name"]
    _check_model_name(model_name)
    if version is not None and version < 1:
        raise UserError(f"--version must be a positive integer, got {version}")
    precision = saved_model_precision or settings["saved_model_precision"]

    def translation_graph(model):
        return TranslationGraph(
            model, source_tokenizer.model_proto, target_tokenizer.model_proto, config["decode"],
            multilingual.RequestLanguages.of(multilingual.model_languages(config["data"])),
            config["data"]["strip_translation_spaces"],
        )  # fmt: skip

    start = time.perf_counter()
    paths = {}
    inside = output.resolve().is_relative_to(Path(workdir).resolve())
    with exclusive_writer(workdir, wait, log) if inside else contextlib.nullcontext():
        with writing(output):
            output.mkdir(parents=True, exist_ok=True)
        with library_output.to_file(output / EXPORT_LOG, enabled=not verbose):
            if "saved_model" in formats:
                paths["saved_model"] = export_saved_model(
                    translation_graph(at_precision(model, precision)), output, model_name,
                    version, log, precision,
                )  # fmt: skip
            if "onnx" in formats:
                paths["onnx"] = export_onnx(
                    translation_graph(model), workdir, output, settings["onnx_opset"],
                    settings["onnx_int8"], log,
                    multilingual.model_languages(config["data"]),
                    model_description([workdir, *ensemble], model),
                    onnx_search or settings["onnx_search"],
                )  # fmt: skip
            if "ctranslate2" in formats:
                paths["ctranslate2"] = export_ctranslate2(
                    model, workdir, output, settings["ctranslate2_quantization"], log
                )
    also = "" if verbose else f"; the converters' messages are in {output / EXPORT_LOG}"
    log(f"Exported in {time.perf_counter() - start:.0f} s{also}")
    return paths


def export_after_training(workdir, config, log=print):
    """`pipeline.train`'s after-training hook (entry point `seq2seq_tf.after_training`):
    exports in `export.formats` when the configuration says `export.after_training`."""
    if config["export"]["after_training"]:
        formats = parse_export_formats(config["export"]["formats"], "export.formats")
        export_model(workdir, formats=formats, log=log)
