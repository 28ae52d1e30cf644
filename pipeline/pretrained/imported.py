"""What every checkpoint family's converter produces (`Imported`), and its one way into a work
directory: the configuration, the Keras model with the checkpoint's weights, and the
vocabularies, written together or not at all."""

import dataclasses

from pipeline.core.errors import UserError
from pipeline.pretrained.generation import IMPORT_NOTES


@dataclasses.dataclass
class Imported:
    family: str  # the checkpoint's model_type
    model: dict  # the toolkit's `model` keys
    suppressed_ids: list  # target ids never output (`model.suppressed_ids`)
    source_model: bytes  # the source SentencePiece model, ids = model ids
    target_model: bytes
    # {Keras weight path below the model: (a function reading its array or its `RowBlocks`,
    # checkpoint name)}
    weights: dict
    # the `decode` keys of the checkpoint's own search, and `generation.IMPORT_NOTES`
    search: dict
    # {"source": code, "target": code, "tags": {target code: token before the source},
    # "source_tags": {source code: token before the source}, "target_tokens": {target code:
    # token the target starts with}}: what the family has of these
    languages: dict
    unproducible: list  # source tokens no segmentation gives (said at import)
    # whether the family's tokenizer strips a translation's edge spaces (`translation_text`)
    strip_translation_spaces: bool


@dataclasses.dataclass
class RowBlocks:
    """A weight too large to hold more than once (an embedding table), given a block of rows at
    a time: `blocks` yields (first row, rows); `transposed`: the Keras variable holds the rows
    as its columns (`[width, rows]`, an output layer's kernel)."""

    shape: tuple  # [rows, width]
    blocks: object  # an iterator
    transposed: bool = False


def weight_rules(settings, encoder_layer, decoder_layer):
    """{Keras path below the model: (checkpoint name, layout, heads)} of every layer's weights,
    from a family's per-layer tables ({path below the layer: (name below the layer,
    layout)}) and the depths and heads of `settings` (the `model` keys). Layers are
    `model.encoder.layers.{i}` and `model.decoder.layers.{i}` in the checkpoint."""
    rules = {}
    for side, table, heads in (
        ("encoder", encoder_layer, settings["num_heads"]),
        ("decoder", decoder_layer, settings["decoder_num_heads"] or settings["num_heads"]),
    ):
        for i in range(settings[f"{side}_layers"]):
            for path, (name, layout) in table.items():
                rules[f"{side}_layer_{i}/{path}"] = (f"model.{side}.layers.{i}.{name}", layout,
                                                     heads)  # fmt: skip
    return rules


def parameter_names(rules):
    return [name for name, _, _ in rules.values()]


def work_config(imported):
    """The work directory's configuration (validated): the model, its vocabularies' sharing,
    and the checkpoint's own search as the decode defaults."""
    from pipeline.config import defaults

    config = defaults("transformer")
    config["model"].update(imported.model, suppressed_ids=list(imported.suppressed_ids))
    search = {k: v for k, v in imported.search.items() if k not in IMPORT_NOTES}
    config["decode"].update(search)
    # Every source position, </s> included, within the positions the model has.
    longest = imported.model["max_positions"] - int(imported.model["source_eos"])
    config["decode"]["max_source_length"] = longest
    data = config["data"]
    data["shared_vocabulary"] = imported.source_model == imported.target_model
    data["max_source_length"] = min(data["max_source_length"], longest)
    data["max_target_length"] = min(data["max_target_length"], longest - 1)
    for side in ("source", "target"):
        data[f"{side}_language"] = imported.languages.get(side)
    data["language_tags"] = imported.languages.get("tags") or None
    data["source_language_tags"] = imported.languages.get("source_tags") or None
    data["target_language_tokens"] = imported.languages.get("target_tokens") or None
    data["strip_translation_spaces"] = imported.strip_translation_spaces
    return config


def set_weights(model, weights):
    """Assigns `weights` to the Keras `model`'s variables by path, reading each array as it
    assigns it and dropping it after; a shape that disagrees with the configuration is a
    `UserError` naming the checkpoint's weight."""
    from pipeline.model_types.builder import SEED_STATE

    paths = [v.path.split("/", 1)[-1] for v in model.variables]
    missing = [p for p in paths if p not in weights and SEED_STATE not in p]
    if missing:
        raise UserError(f"model weights: nothing in the checkpoint for {missing[0]}")
    left = sorted(set(weights) - set(paths))
    if left:
        raise UserError(f"model weights: {weights[left[0]][1]} has no place in the model")
    for variable, path in zip(model.variables, paths):
        if path not in weights:
            continue
        read, name = weights[path]
        value = read()
        shape = tuple(value.shape)
        if isinstance(value, RowBlocks) and value.transposed:
            shape = shape[::-1]
        if shape != tuple(variable.shape):
            raise UserError(f"model weights: {name} has shape {list(value.shape)}; the "
                            f"configuration gives {list(variable.shape)}")  # fmt: skip
        if isinstance(value, RowBlocks):
            for start, block in value.blocks:
                _assign_rows(variable, start, block, value.transposed)
        else:
            variable.assign(value)
        del value


def _assign_rows(variable, start, block, transposed):
    """Rows `start`... of the Keras `variable` (its columns, `transposed`) set to `block`, in
    place. Slice assignment (`variable[a:b].assign`) reads the variable first, and the op
    then copies the whole table rather than change a buffer that a tensor still shares: an
    embedding table's size more at the peak."""
    import tensorflow as tf

    stop = start + len(block)
    begin, end = (
        ([0, start], [block.shape[1], stop]) if transposed else ([start, 0], [stop, block.shape[1]])
    )
    tf.raw_ops.ResourceStridedSliceAssign(
        ref=variable.value.handle, begin=begin, end=end, strides=[1, 1],
        value=block.T if transposed else block,
    )  # fmt: skip


def write_work_directory(imported, workdir, log=print):
    """Writes `imported` as a trained work directory, atomically: config.yaml, model.keras
    and vocab/. Returns the configuration."""
    from pipeline.config import load_config, save_config
    from pipeline.data.tokenizer import vocabulary_paths, write_sentencepiece
    from pipeline.model_types.builder import build_model, variables_made_as_zeros
    from pipeline.workdir import (
        CONFIG_FILE,
        MODEL_FILE,
        save_model_atomically,
        write_directory_atomically,
    )

    config = work_config(imported)

    def fill(directory):
        save_config(config, directory / CONFIG_FILE)
        load_config(directory / CONFIG_FILE, saved=True)  # the checks any work directory passes
        paths = vocabulary_paths(directory, config["data"]["shared_vocabulary"])
        paths[0].parent.mkdir()
        for path, proto in zip(paths, (imported.source_model, imported.target_model)):
            write_sentencepiece(proto, path)
        sizes = [_size(proto) for proto in (imported.source_model, imported.target_model)]
        with variables_made_as_zeros():
            model = build_model(config, *sizes)
        set_weights(model, imported.weights)
        save_model_atomically(model, directory / MODEL_FILE)
        log(f"Model: {model.count_params():,} parameters; vocabularies: {sizes[0]:,} source, "
            f"{sizes[1]:,} target ids")  # fmt: skip

    write_directory_atomically(workdir, fill)
    return config


def _size(proto):
    from sentencepiece import sentencepiece_model_pb2 as model_pb2

    model = model_pb2.ModelProto()
    model.ParseFromString(proto)
    return len(model.pieces)
