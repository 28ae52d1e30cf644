"""Checks that an exported SavedModel will run where TF Serving runs it.

The TF Serving server cannot be installed here, so the checks are: every op of the graph is
registered in stock TF Serving (core TensorFlow plus tensorflow-text 2.12.1, the release its
builds up to 2.19 link; the list in `tf_serving_ops.txt` was written by
`tools/list_registered_ops.py` under tensorflow 2.12.1 and tensorflow-text 2.12.1), and the
signatures run through the session-based loader that the server uses.
"""

from pathlib import Path

from tensorflow.core.protobuf import saved_model_pb2

TF_SERVING_OPS_FILE = Path(__file__).with_name("tf_serving_ops.txt")


def read_meta_graph(saved_model_dir):
    saved_model = saved_model_pb2.SavedModel()
    saved_model.ParseFromString((Path(saved_model_dir) / "saved_model.pb").read_bytes())
    return saved_model.meta_graphs[0]


def _called_functions(node):
    """Names of the functions a node calls (`f`, `body`, `cond`, branches...)."""
    for value in node.attr.values():
        if value.HasField("func"):
            yield value.func.name
        yield from (function.name for function in value.list.func)


def _node_name(tensor_name):
    return tensor_name.split(":")[0].lstrip("^")


def prune_to(graph_def, outputs):
    """The nodes and functions that `outputs` (node names) depend on, as a new GraphDef."""
    from tensorflow.compat.v1 import GraphDef
    from tensorflow.compat.v1.graph_util import extract_sub_graph

    pruned = extract_sub_graph(graph_def, outputs)
    functions = {function.signature.name: function for function in graph_def.library.function}
    needed, pending = set(), [name for node in pruned.node for name in _called_functions(node)]
    while pending:
        name = pending.pop()
        if name in needed or name not in functions:
            continue
        needed.add(name)
        pending.extend(n for node in functions[name].node_def for n in _called_functions(node))
    result = GraphDef()
    result.CopyFrom(pruned)
    del result.library.function[:]
    result.library.function.extend(functions[name] for name in sorted(needed))
    result.library.gradient.extend(graph_def.library.gradient)
    return result


def signature_graph(meta_graph, signature_key):
    """The part of the graph that serves `signature_key` and restores the variables."""
    signature = meta_graph.signature_def[signature_key]
    saver = meta_graph.saver_def
    outputs = [_node_name(t.name) for t in signature.outputs.values()]
    outputs += [_node_name(saver.restore_op_name), _node_name(saver.filename_tensor_name)]
    return prune_to(meta_graph.graph_def, outputs)


def graph_ops(graph_def):
    ops = {node.op for node in graph_def.node}
    ops.update(node.op for function in graph_def.library.function for node in function.node_def)
    return ops


def unsupported_ops(graph_def):
    """Ops of `graph_def` that stock TF Serving does not register, sorted."""
    known = set(TF_SERVING_OPS_FILE.read_text().split())
    return sorted(graph_ops(graph_def) - known)


def write_signature_only(saved_model_dir, signature_key, output_dir):
    """A copy of the SavedModel that holds only `signature_key` and what it needs.

    Shows what a server without the other signatures' ops (tensorflow-text's, say) can load.
    """
    import shutil

    saved_model = saved_model_pb2.SavedModel()
    source = Path(saved_model_dir)
    saved_model.ParseFromString((source / "saved_model.pb").read_bytes())
    meta_graph = saved_model.meta_graphs[0]
    pruned = signature_graph(meta_graph, signature_key)
    meta_graph.graph_def.CopyFrom(pruned)
    for key in list(meta_graph.signature_def):
        if key != signature_key:
            del meta_graph.signature_def[key]
    meta_graph.ClearField("object_graph_def")  # it describes the full model's objects
    kept = {node.name for node in pruned.node}
    for key in list(meta_graph.collection_def):  # the init op, among others, is gone
        if any(_node_name(n) not in kept for n in meta_graph.collection_def[key].node_list.value):
            del meta_graph.collection_def[key]
    output = Path(output_dir)
    output.mkdir(parents=True)
    (output / "saved_model.pb").write_bytes(saved_model.SerializeToString())
    shutil.copytree(source / "variables", output / "variables")
