"""The `beam_search` signature as an ONNX model, with what a TensorFlow-free runtime needs.

`OUT/onnx/` holds `model.onnx` (the search is an ONNX `Loop`; batch and source length are
dynamic), optionally `model.int8.onnx` (the same with int8 weights in every matrix product,
quantised dynamically by onnxruntime: faster, with translations that may differ a
little), the source and target SentencePiece vocabularies (`.model` and plain `.vocab`) and
`model.json`: special token ids, the search options' defaults and dtypes, the file names and the
languages (`pipeline.core.multilingual.model_languages`: the sides known).
The scalar inputs (`pipeline.decoding.search_options.EXPORTED_OPTIONS`) carry their defaults
as initializers, so ONNX Runtime lets a caller leave them out.
"""

import contextlib
import functools
import json
import os
import shutil

import numpy as np
import onnx
import tf2onnx

from export.int8 import write_int8
from export.onnx_rewrites import append_outside, optimise_loops, outside_initializer
from export.serving_graph import WEIGHT_INPUT
from export.signature import METADATA_FILE, TARGET_PREFIX
from layers.keras_internals import buffer_view
from pipeline.data.tokenizer import BOS_ID, EOS_ID, PAD_ID, UNK_ID
from pipeline.decoding.search_options import OPTIONS_BY_NAME

MODEL_FILE = "model.onnx"
INT8_MODEL_FILE = "model.int8.onnx"
FORMAT_VERSION = 1
# An ONNX file is one protocol buffer, which holds at most 2 GiB: a model with more weights than
# this (the rewrites may add a tied embedding's transpose) keeps its tensors in a file beside
# it, EXTERNAL_DATA_FILE (the int8 model in its own, named after it by ONNX Runtime).
EXTERNAL_DATA_ABOVE_BYTES = 512 << 20
EXTERNAL_DATA_FILE = "model.onnx.data"
WEIGHTS_FILE = "weights.partial"  # the weights, while the export rewrites the model


def _add_input_defaults(model, defaults, prefix_required=False):
    """Gives each search option and, unless `prefix_required`, the target prefix (none) an
    initializer: ONNX Runtime then treats them as optional. (ONNX Runtime's JavaScript
    packages hide such inputs: a feed of one is ignored, or refused.)"""
    for option in map(OPTIONS_BY_NAME.get, defaults):
        array = np.array(defaults[option.name], dtype=option.dtype)
        model.graph.initializer.append(onnx.numpy_helper.from_array(array, option.name))
    if not prefix_required:
        no_prefix = np.zeros((0, 0), np.int32)
        model.graph.initializer.append(onnx.numpy_helper.from_array(no_prefix, TARGET_PREFIX))


@contextlib.contextmanager
def _environment_variable(name, value):
    previous = os.environ.get(name)
    os.environ[name] = value
    try:
        yield
    finally:
        if previous is None:
            del os.environ[name]
        else:
            os.environ[name] = previous


@contextlib.contextmanager
def _reshape_pairs_merged_only_without_copied_dims():
    """tf2onnx's back-to-back pass turns Reshape(Reshape(x, a), b) into Reshape(x, b), which
    is wrong where b holds 0s ("this dimension of the input"): the input is no longer the
    one they name. Such a pair (a Tensordot's reshapes around its MatMul, once grappler has
    folded away a bias of zeros between them, as in a freshly initialised model) stays."""
    from tf2onnx.optimizer import back_to_back_optimizer

    handlers = back_to_back_optimizer._func_map
    merge = handlers[("Reshape",)]

    def merge_safely(graph, node, consumers):
        if len(consumers) == 1 and consumers[0].type == "Reshape":
            shape = consumers[0].inputs[1]
            if not shape.is_const() or 0 in shape.get_tensor_value(as_list=True):
                return []
        return merge(graph, node, consumers)

    handlers[("Reshape",)] = merge_safely
    try:
        yield
    finally:
        handlers[("Reshape",)] = merge


@contextlib.contextmanager
def _unused_nodes_found_in_one_walk():
    """tf2onnx finds the nodes a graph's outputs depend on by walking back from each output in
    turn, every walk anew, after every optimiser pass and in every loop body: over the search
    loops' dozens of carried outputs, most of an export's conversion time. One walk from all
    the outputs together finds the same nodes (their union)."""
    from tf2onnx.graph import Graph

    extract = Graph.extract_sub_graph_nodes

    def extract_in_one_walk(graph, outputs_name, input_checker=None, remove_unused_inputs=True):
        if input_checker is not None:
            return extract(graph, outputs_name, input_checker, remove_unused_inputs)
        names = list(outputs_name)
        if not remove_unused_inputs:
            names += [placeholder.output[0] for placeholder in graph.inputs]
        found = set()
        to_visit = [graph.get_node_by_output(name, search_in_parent_graphs=False)
                    for name in names]  # fmt: skip
        while to_visit:
            node = to_visit.pop()
            if node is None or node in found:
                continue
            found.add(node)
            for name in (*node.input, *node.get_implicit_inputs()):
                to_visit.append(graph.get_node_by_output(name, search_in_parent_graphs=False))
        return list(found)

    Graph.extract_sub_graph_nodes = extract_in_one_walk
    try:
        yield
    finally:
        Graph.extract_sub_graph_nodes = extract


# tf2onnx's optimiser passes for ops the exported graphs never hold (resizes, quantised pairs:
# the int8 model is quantised after conversion): every pass rebuilds the whole graph whether
# or not it finds anything, so these only cost time.
PASSES_WITHOUT_WORK = ("remove_redundant_upsample", "const_dequantize_optimizer", "q_dq_optimizer")


@contextlib.contextmanager
def _without_passes_without_work():
    from tf2onnx import optimizer

    every_pass = optimizer._optimizers
    optimizer._optimizers = type(every_pass)(
        (name, factory) for name, factory in every_pass.items() if name not in PASSES_WITHOUT_WORK
    )
    try:
        yield
    finally:
        optimizer._optimizers = every_pass


@contextlib.contextmanager
def _passes_without_proto_rebuilds():
    """tf2onnx's optimiser passes without what each does after its work: rebuild every node's
    protobuf (the loops' bodies' too) and count the graph's nodes twice for a debug line. The
    passes read the nodes, not their protobufs, and the model is built from the nodes once
    they are done (`Graph.make_graph` rebuilds the protobufs), so only time is saved."""
    from tf2onnx.optimizer.optimizer_base import GraphOptimizerBase

    def optimize(self, graph, iteration):
        self.opt_iteration = iteration
        graph = self._optimize(graph)
        graph.delete_unused_nodes(graph.outputs)
        return graph

    every_pass = GraphOptimizerBase.optimize
    GraphOptimizerBase.optimize = optimize
    try:
        yield
    finally:
        GraphOptimizerBase.optimize = every_pass


def _erfc_as_one_minus_erf(graph, node, name, args):
    """ONNX has Erf but no Erfc, which TensorFlow's exact GELU uses: 1 - erf(x)."""
    from tf2onnx import utils

    node.type = "Erf"
    dtype = utils.map_onnx_to_numpy_type(graph.get_dtype(node.input[0]))
    one = graph.make_const(utils.make_name(f"{node.name}_one"), np.array(1, dtype))
    output = node.output[0]
    complement = graph.insert_new_node_on_output("Sub", output, name=utils.make_name(node.name))
    graph.replace_inputs(complement, [one.output[0], output])


def convert_to_onnx(function, opset):
    """tf2onnx's conversion of a `tf.function` with an input signature. By default tf2onnx
    runs each of its optimiser passes on a deep copy of the graph, to fall back on if the pass
    fails, which costs the beam search's large graph much of the passes' time. The passes
    run in place first, and on copies only if one of them fails."""
    convert = functools.partial(
        tf2onnx.convert.from_function,
        function,
        input_signature=function.input_signature,
        opset=opset,
        custom_op_handlers={"Erfc": (_erfc_as_one_minus_erf, ())},
    )
    with (
        _reshape_pairs_merged_only_without_copied_dims(),
        _without_passes_without_work(),
        _passes_without_proto_rebuilds(),
        _unused_nodes_found_in_one_walk(),
    ):
        try:
            with _environment_variable(tf2onnx.constants.ENV_TF2ONNX_CATCH_ERRORS, "false"):
                return convert()[0]
        except Exception:  # a pass failed: tf2onnx skips it when it works on copies
            return convert()[0]


def _weights_as_initializers(model, variables, weights_file):
    """`model`, converted with the weights as its inputs `WEIGHT_INPUT` (`variables`' order),
    with each of them an initializer instead whose data is in `weights_file`, written a
    tensor at a time. tf2onnx converted a graph without the weights (freezing them, it held
    them many times over), and the rewrites move initializers between graphs, which copies
    them: the model holds none of the weights until it is written (`_gather_tensors`)."""
    weights = {WEIGHT_INPUT.format(i): variable for i, variable in enumerate(variables)}
    read = [node for node in model.graph.input if node.name in weights]
    weights_file.write_bytes(b"")
    for node in read:
        array = buffer_view(weights[node.name])
        model.graph.initializer.append(outside_initializer(array, node.name, weights_file))
    others = [node for node in model.graph.input if node.name not in weights]
    del model.graph.input[:]
    model.graph.input.extend(others)
    return model


def _gather_tensors(model, directory, weights_file, external_data):
    """Moves the tensors the model still reads from `weights_file` (in `directory`) into the
    model, or with `external_data` into EXTERNAL_DATA_FILE, one at a time (what the rewrites
    dropped is left behind); removes `weights_file`."""
    from onnx.external_data_helper import (
        _get_all_tensors,
        load_external_data_for_tensor,
        uses_external_data,
    )

    kept = [tensor for tensor in _get_all_tensors(model) if uses_external_data(tensor)]
    if external_data:
        (directory / EXTERNAL_DATA_FILE).write_bytes(b"")
    for tensor in kept:
        if external_data:
            array = onnx.numpy_helper.to_array(tensor, str(directory))
            append_outside(tensor, array, directory / EXTERNAL_DATA_FILE)
        else:
            load_external_data_for_tensor(tensor, str(directory))
    weights_file.unlink()


def _save(model, path, external_data):
    """Writes and checks `model` (over the protobuf limit: its tensors in EXTERNAL_DATA_FILE,
    after those `_gather_tensors` wrote there); checked by path, not through a copy."""
    if not external_data:
        onnx.save(model, str(path))
        onnx.checker.check_model(str(path))
        return
    onnx.save_model(model, str(path), save_as_external_data=True, all_tensors_to_one_file=True,
                    location=EXTERNAL_DATA_FILE, size_threshold=1024)  # fmt: skip
    onnx.checker.check_model(str(path))  # by path: the checker reads the data file itself


def write_onnx(graph, directory, vocabulary_paths, opset, int8=True, languages=None,
               description=None, search="beam"):  # fmt: skip
    """Converts `graph.beam_search` (a `TranslationGraph`), or with `search` "greedy" its
    greedy search, into `directory`, with its int8 twin if `int8`; `languages`: how
    requests name the model's languages (`multilingual.model_languages`); `description`:
    {"name", "type", "parameters"} of the model, for runtimes to show."""
    greedy = search == "greedy"
    defaults = graph.greedy_defaults if greedy else graph.defaults
    external_data = graph.weight_bytes > EXTERNAL_DATA_ABOVE_BYTES
    # Converted without its weights, which join it as initializers after.
    function = graph.search_function(greedy, with_weight_inputs=True)
    model = convert_to_onnx(function, opset)
    weights_file = directory / WEIGHTS_FILE
    model = _weights_as_initializers(model, graph.weight_variables(), weights_file)
    optimise_loops(model.graph, weights_file)
    _gather_tensors(model, directory, weights_file, external_data)
    _add_input_defaults(model, defaults, graph.prefix_required)
    model.doc_string = f"Attentional encoder-decoder with {search} search (seq2seq-tf)"
    _save(model, directory / MODEL_FILE, external_data)
    inputs, outputs = [n.name for n in model.graph.input], [n.name for n in model.graph.output]
    del model  # before quantising: a large model's weights, held twice otherwise
    if int8:
        write_int8(directory / MODEL_FILE, directory / INT8_MODEL_FILE, external_data)
    for data in directory.glob("*.data"):  # written owner-only: as readable as the models
        data.chmod(0o644)
    files = {}
    for side, path in zip(("source", "target"), vocabulary_paths):
        for suffix in (".model", ".vocab"):  # a shared vocabulary is copied once, as it is named
            shutil.copyfile(path.with_suffix(suffix), directory / path.with_suffix(suffix).name)
        files[f"{side}_vocabulary"] = path.name
    metadata = {
        "format_version": FORMAT_VERSION,
        "model": MODEL_FILE,
        "int8_model": INT8_MODEL_FILE if int8 else None,
        # The tensors are in files beside the models: a runtime loads them by path.
        "external_data": external_data,
        **files,
        "languages": languages or {},
        "description": description or {},
        "special_ids": {"pad": PAD_ID, "unk": UNK_ID, "bos": BOS_ID, "eos": EOS_ID},
        "search": search,
        "defaults": defaults,
        "option_dtypes": {name: OPTIONS_BY_NAME[name].dtype for name in defaults},
        "max_source_length": graph.max_source_length,
        "strip_translation_spaces": graph.strip_translation_spaces,
        "max_length_cap": graph.max_length_cap,
        "inputs": inputs,
        "outputs": outputs,
        "opset": opset,
    }
    (directory / METADATA_FILE).write_text(json.dumps(metadata, indent=2) + "\n")
