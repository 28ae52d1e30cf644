"""Rewrites of the ONNX graph tf2onnx writes, for ONNX Runtime's sake: each keeps what the
graph computes and removes work that the search loops would repeat at every step."""

import collections
import functools

import numpy as np
import onnx
from onnx import helper, numpy_helper

# The largest table `project_embeddings` writes: vocabulary x projected width x 4 bytes.
MAX_PROJECTED_TABLE_BYTES = 64 << 20


def optimise_loops(graph):
    """Applies every rewrite below to `graph`; returns how many changes each made."""
    return {
        "hoisted": hoist_loop_invariants(graph),
        "selects": selects_as_where(graph),
        "folded_transposes": fold_constant_transposes(graph),
        "projected": project_embeddings(graph),
        "moved_initializers": move_initializers_into_loops(graph),
    }


def _node_graphs(node):
    """The graphs in `node`'s attributes (a `Loop`'s body, an `If`'s branches)."""
    return [a.g for a in node.attribute if a.type == onnx.AttributeProto.GRAPH]


def _scopes(graph, enclosing=()):
    """For `graph` and every graph nested in it: the graph with those enclosing it, innermost
    last."""
    scopes = (*enclosing, graph)
    yield scopes
    for node in graph.node:
        for inner in _node_graphs(node):
            yield from _scopes(inner, scopes)


def subgraphs(graph):
    """`graph` and every graph nested in its nodes' attributes, outermost first."""
    return (scopes[-1] for scopes in _scopes(graph))


def _constants(scopes):
    """The initializers the nodes of `scopes[-1]` read as constants, by name: their graph's and
    the enclosing graphs', less the names an inner graph redefines and the initializers that
    are graph inputs too (those are defaults a caller may override)."""
    constants = {}
    for graph in scopes:
        inputs = {value.name for value in graph.input}
        for name in inputs.union(*(node.output for node in graph.node)):
            constants.pop(name, None)
        constants.update((i.name, i) for i in graph.initializer if i.name not in inputs)
    return constants


def _rename_input(graph, old, new):
    """Makes every node of `graph` and of its subgraphs read `new` where it read `old`."""
    for inner in subgraphs(graph):
        for node in inner.node:
            node.input[:] = [new if name == old else name for name in node.input]


def _delete(field, positions):
    """Deletes in place the items at `positions` of a repeated field: references to the others,
    and to the graphs inside them, stay valid (`_replace` copies)."""
    for position in sorted(positions, reverse=True):
        del field[position]


def _replace(field, items):
    items = [type(item).FromString(item.SerializeToString()) for item in items]
    del field[:]
    field.extend(items)


def hoist_loop_invariants(graph):
    """Turns each value a `Loop` carries unchanged from one iteration to the next into a plain
    reference to the value outside the loop; returns how many there were.

    tf2onnx carries every captured tensor this way: the weights, the encoded source, the
    search settings. ONNX Runtime handles each carried value at every iteration, which at
    small batches costs the beam search a large share of its time.
    """
    hoisted = 0
    # Outermost first: an outer loop's renaming reaches the loops inside it before they are
    # looked at (nodes are only rewired, never added or removed, while `subgraphs` walks).
    for node, owner in ((n, g) for g in subgraphs(graph) for n in g.node):
        if node.op_type == "Loop":
            body = node.attribute[0].g
            carried = len(node.input) - 2  # after the trip count and the condition
            graph_outputs = {output.name for output in owner.output}
            invariant = [
                node.input[2 + k]
                and body.output[1 + k].name == body.input[2 + k].name
                and node.output[k] not in graph_outputs
                for k in range(carried)
            ]
            for k in (k for k in range(carried) if invariant[k]):
                _rename_input(body, body.input[2 + k].name, node.input[2 + k])
                _rename_input(owner, node.output[k], node.input[2 + k])
            kept = [k for k in range(carried) if not invariant[k]]
            node.input[:] = node.input[:2] + [node.input[2 + k] for k in kept]
            node.output[:] = [node.output[k] for k in kept] + node.output[carried:]
            _replace(body.input, body.input[:2] + [body.input[2 + k] for k in kept])
            _replace(
                body.output,
                body.output[:1] + [body.output[1 + k] for k in kept] + body.output[1 + carried :],
            )
            hoisted += sum(invariant)
    return hoisted


def fold_constant_transposes(graph):
    """Replaces each `Transpose` of a constant by the transposed constant, an initializer of
    the transpose's own graph; returns how many.

    A Transformer whose output projection is its tied target embedding multiplies by the
    embedding's transpose, which tf2onnx computes inside the search loop: at every step, and
    as a product whose weights are no initializer, which ONNX Runtime neither pre-packs nor
    quantises (`quantize_dynamic` leaves it float).
    """
    folded = 0
    for scopes in list(_scopes(graph)):
        inner, constants = scopes[-1], _constants(scopes)
        removed = []
        for k, node in enumerate(inner.node):
            value = constants.get(node.input[0]) if node.op_type == "Transpose" else None
            if value is None or value.data_type != onnx.TensorProto.FLOAT:
                continue
            permutation = next((list(a.ints) for a in node.attribute if a.name == "perm"), None)
            array = np.transpose(numpy_helper.to_array(value), permutation)
            inner.initializer.append(numpy_helper.from_array(array, node.output[0]))
            removed.append(k)
        _delete(inner.node, removed)
        folded += len(removed)
    _drop_unread_initializers(graph)
    return folded


def _reads(outputs, nodes):
    """How many times each value name is read by `nodes` (their subgraphs included) and
    `outputs`."""
    reads = collections.Counter(output.name for output in outputs)
    for node in nodes:
        reads.update(node.input)
        for inner in (g for body in _node_graphs(node) for g in subgraphs(body)):
            reads.update(output.name for output in inner.output)
            reads.update(name for inner_node in inner.node for name in inner_node.input)
    return reads


def _made_by(producer, name, op_type):
    """The node that writes `name`, if it is an `op_type` node of this graph."""
    node = producer.get(name)
    return node if node is not None and node.op_type == op_type else None


def selects_as_where(graph):
    """Rewrites tf2onnx's select, Add(Mul(Cast(c), x), Mul(y, Cast(Not(c)))), as Where(c, x, y);
    returns how many.

    tf2onnx writes a TensorFlow select on numbers as that arithmetic (five nodes, and three
    passes over the data) unless it sees an infinity. Where gives the same values, infinite or
    not, in one node. Inner graphs go first, so that copying an outer graph's nodes keeps their
    edits.
    """
    rewritten = 0
    for inner in reversed(list(subgraphs(graph))):
        producer = {output: node for node in inner.node for output in node.output}
        made_by = functools.partial(_made_by, producer)
        replacements, pattern = {}, set()
        for add in (node for node in inner.node if node.op_type == "Add"):
            when_true, when_false = (made_by(name, "Mul") for name in add.input)
            if when_true is None or when_false is None:
                continue
            cast_true = made_by(when_true.input[0], "Cast")
            cast_false = made_by(when_false.input[1], "Cast")
            negation = cast_false and made_by(cast_false.input[0], "Not")
            if cast_true is None or negation is None or negation.input[0] != cast_true.input[0]:
                continue
            condition, x, y = cast_true.input[0], when_true.input[1], when_false.input[0]
            replacements[id(add)] = helper.make_node(
                "Where", [condition, x, y], list(add.output), name=add.name
            )
            pattern.update(map(id, (when_true, when_false, cast_true, cast_false, negation)))
        if not replacements:
            continue
        nodes = [replacements.get(id(node), node) for node in inner.node]
        while True:  # drop the pattern's nodes nothing reads any more (some may be shared)
            reads = _reads(inner.output, nodes)
            kept = [
                node
                for node in nodes
                if id(node) not in pattern or any(reads[name] for name in node.output)
            ]
            if len(kept) == len(nodes):
                break
            nodes = kept
        _replace(inner.node, nodes)
        rewritten += len(replacements)
    return rewritten


def move_initializers_into_loops(graph):
    """Moves each initializer of `graph` that only one subgraph reads into that subgraph;
    returns how many.

    ONNX Runtime pre-packs the constant matrix of a MatMul or Gemm only when it is an
    initializer of the node's own graph: a loop reading a weight from the enclosing graph
    multiplies by the unpacked matrix at every step.
    """
    readers = collections.defaultdict(list)  # initializer name -> the graphs whose nodes read it
    initializers = {initializer.name for initializer in graph.initializer}
    for inner in subgraphs(graph):
        for name in {name for node in inner.node for name in node.input} & initializers:
            readers[name].append(inner)
    moving = {
        name: graphs[0]
        for name, graphs in readers.items()
        if len(graphs) == 1 and graphs[0] is not graph
    }
    for initializer in graph.initializer:
        if initializer.name in moving:
            moving[initializer.name].initializer.append(initializer)
    _replace(graph.initializer, [i for i in graph.initializer if i.name not in moving])
    return len(moving)


def project_embeddings(graph, max_table_bytes=MAX_PROJECTED_TABLE_BYTES):
    """Rewrites a lookup in a constant table followed by a product with constant weights (and
    a constant bias), MatMul(Gather(E, ids), W) [+ b], as a lookup in the table E @ W + b,
    computed here in float64; returns how many.

    A recurrent decoder multiplies each step's token embedding by its input weights: gathering
    rows of the product saves that multiplication at every step, for a table of vocabulary x
    (gates x units) values (at most `max_table_bytes`). Only float32 tables are rewritten. A
    bias computed in the step (a Keras GRU splits its own) stays an addition.
    """
    projected = sum(
        _project_lookups(scopes[-1], _constants(scopes), max_table_bytes)
        for scopes in _scopes(graph)
    )
    _drop_unread_initializers(graph)
    return projected


def _project_lookups(graph, constants, max_table_bytes):
    """`project_embeddings` in one graph, with the constants its nodes can read."""
    nodes = list(graph.node)  # held, so that their ids stay theirs
    position = {id(node): k for k, node in enumerate(nodes)}
    reads = _reads(graph.output, nodes)
    readers = collections.defaultdict(list)
    for node in nodes:
        for name in node.input:
            readers[name].append(node)

    def only_reader(name, op_type):
        found = readers[name]
        if reads[name] == 1 and len(found) == 1 and found[0].op_type == op_type:
            return found[0]
        return None

    def constant_array(name, rank):
        value = constants.get(name)
        if value is None or value.data_type != onnx.TensorProto.FLOAT or len(value.dims) != rank:
            return None
        return numpy_helper.to_array(value)

    removed, projected = [], 0
    for gather in [node for node in nodes if node.op_type == "Gather"]:
        axis = next((a.i for a in gather.attribute if a.name == "axis"), 0)
        table = constant_array(gather.input[0], 2)
        product = only_reader(gather.output[0], "MatMul")
        if axis != 0 or table is None or product is None or product.input[0] != gather.output[0]:
            continue
        weights = constant_array(product.input[1], 2)
        if weights is None or table.shape[0] * weights.shape[1] * 4 > max_table_bytes:
            continue
        projection = table.astype(np.float64) @ weights.astype(np.float64)
        last = product
        bias_add = only_reader(product.output[0], "Add")
        if bias_add is not None:
            other = [name for name in bias_add.input if name != product.output[0]]
            bias = constant_array(other[0], 1) if len(other) == 1 else None
            if bias is not None and bias.shape == projection.shape[1:]:
                projection += bias
                last = bias_add
        name = f"{last.output[0]}/projected_table"
        graph.initializer.append(numpy_helper.from_array(projection.astype(np.float32), name))
        gather.input[0], gather.output[0] = name, last.output[0]
        removed += {position[id(product)], position[id(last)]}
        projected += 1
    _delete(graph.node, removed)
    return projected


def _drop_unread_initializers(graph):
    """Removes the initializers, at every depth, that nothing reads and that no input names."""
    for inner in subgraphs(graph):
        reads = _reads(inner.output, inner.node)
        inputs = {value.name for value in inner.input}
        _delete(
            inner.initializer,
            [k for k, i in enumerate(inner.initializer) if not (reads[i.name] or i.name in inputs)],
        )
