"""Rewrites of the ONNX graph tf2onnx writes, for ONNX Runtime's sake: each keeps what the
graph computes and removes work that the search loops would repeat at every step."""

import collections
import functools

import numpy as np
import onnx
from onnx import helper, numpy_helper

# The largest table `project_embeddings` writes: vocabulary x projected width x 4 bytes.
MAX_PROJECTED_TABLE_BYTES = 64 << 20


def optimise_loops(graph, tensor_file=None):
    """Applies every rewrite below to `graph`; returns how many changes each made. With
    `tensor_file` (a path), the initializers outside the model are there and the large ones a
    rewrite makes join them (`outside_initializer`): moving them between graphs copies no data."""
    return {
        "hoisted": hoist_loop_invariants(graph),
        "selects": selects_as_where(graph),
        "folded_transposes": fold_constant_transposes(graph, tensor_file),
        "projected": project_embeddings(graph, tensor_file=tensor_file),
        "layer_norms": fuse_layer_norms(graph, tensor_file),
        "hoisted_nodes": hoist_invariant_nodes(graph),
        "moved_initializers": move_initializers_into_loops(graph),
    }


# An initializer a rewrite makes goes to the `tensor_file` from this size.
OUTSIDE_FROM_BYTES = 1 << 20


# Bytes of a block of rows that a strided array (a transposed view) is written in.
BLOCK_BYTES = 1 << 24


def append_outside(tensor, array, tensor_file):
    """Points `tensor` at `array`'s bytes, appended to `tensor_file` (named relative to the
    model's folder, where the file is). A view that is not contiguous (a transposed table) is
    written a block of rows at a time, not copied whole."""
    with open(tensor_file, "ab") as data:
        offset = data.tell()
        if array.flags.c_contiguous or array.ndim < 2:
            data.write(np.ascontiguousarray(array).data)
        else:
            rows = max(1, BLOCK_BYTES // max(1, array[0].nbytes))
            for start in range(0, len(array), rows):
                data.write(np.ascontiguousarray(array[start : start + rows]).data)
    array_bytes = array.nbytes
    del tensor.external_data[:]
    tensor.data_location = onnx.TensorProto.EXTERNAL
    for key, value in (("location", tensor_file.name), ("offset", offset),
                       ("length", array_bytes)):  # fmt: skip
        entry = tensor.external_data.add()
        entry.key, entry.value = key, str(value)


def outside_initializer(array, name, tensor_file):
    """An initializer `name` of `array`, its bytes appended to `tensor_file`."""
    tensor = onnx.TensorProto(
        name=name, data_type=helper.np_dtype_to_tensor_dtype(array.dtype), dims=array.shape
    )
    append_outside(tensor, array, tensor_file)
    return tensor


def _array(tensor, tensor_file):
    """An initializer's value, read from `tensor_file`'s folder where it is kept outside."""
    return numpy_helper.to_array(tensor, str(tensor_file.parent) if tensor_file else "")


def _initializer(array, name, tensor_file):
    """An initializer of `array`: appended to `tensor_file` where there is one and the array
    is large, else held in the model."""
    if tensor_file is None or array.nbytes < OUTSIDE_FROM_BYTES:
        return numpy_helper.from_array(array, name)
    return outside_initializer(array, name, tensor_file)


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


def fold_constant_transposes(graph, tensor_file=None):
    """Replaces each `Transpose` of a constant by the transposed constant, an initializer of
    the transpose's own graph; returns how many.

    A Transformer whose output projection is its tied target embedding multiplies by the
    embedding's transpose, which tf2onnx computes inside the search loop: at every step, and
    as a product whose weights are no initializer, which ONNX Runtime neither pre-packs nor
    quantises (`export.int8` leaves it float).
    """
    folded = 0
    for scopes in list(_scopes(graph)):
        inner, constants = scopes[-1], _constants(scopes)
        removed = []
        for k, node in enumerate(inner.node):
            value = constants.get(node.input[0]) if node.op_type == "Transpose" else None
            if value is None or value.data_type != onnx.TensorProto.FLOAT:
                continue
            permutation = _attribute(node, "perm")
            array = np.transpose(_array(value, tensor_file), permutation)
            inner.initializer.append(_initializer(array, node.output[0], tensor_file))
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


def _readers(nodes):
    """The nodes of `nodes` that read each value name (a node reading it twice, twice)."""
    readers = collections.defaultdict(list)
    for node in nodes:
        for name in node.input:
            readers[name].append(node)
    return readers


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
        # The pattern's nodes may be shared: those nothing reads any more go.
        _replace(inner.node, _without_unread(nodes, inner.output, pattern))
        rewritten += len(replacements)
    return rewritten


def _attribute(node, name, default=None):
    return next((helper.get_attribute_value(a) for a in node.attribute if a.name == name), default)


def _constant_array(constants, producer, name, tensor_file=None):
    """The value of `name` if it is an initializer in scope or a `Constant` node's output."""
    if name in constants:
        return _array(constants[name], tensor_file)
    node = producer.get(name)
    if node is not None and node.op_type == "Constant" and node.attribute[0].name == "value":
        return numpy_helper.to_array(node.attribute[0].t)
    return None


def fuse_layer_norms(graph, tensor_file=None):
    """Rewrites the layer normalisation tf2onnx writes for Keras' `LayerNormalization` (13
    nodes: the moments, then `x * (gamma / sqrt(var + eps)) + (beta - mean * gamma / ...)`)
    as one ONNX `LayerNormalization` over the last axis; returns how many.

    A Transformer's decoder step has a dozen of them: in the search loop, their small nodes'
    dispatch costs more than their arithmetic.
    """
    fused = 0
    for scopes in list(_scopes(graph)):
        inner, constants = scopes[-1], _constants(scopes)
        nodes = list(inner.node)
        producer = {output: node for node in nodes for output in node.output}
        reads = _reads(inner.output, nodes)
        readers = _readers(nodes)
        replacements, removed = {}, set()
        for mean in (node for node in nodes if node.op_type == "ReduceMean"):
            match = _layer_norm(inner, mean, readers, reads, producer, constants, tensor_file)
            if match is None:
                continue
            pattern, (x, gamma, beta, axis, epsilon) = match
            last = pattern[-1]
            replacements[id(last)] = helper.make_node(
                "LayerNormalization", [x, gamma, beta], list(last.output), name=last.name,
                axis=axis, epsilon=epsilon,
            )  # fmt: skip
            removed.update(id(node) for node in pattern[:-1])
        if not replacements:
            continue
        kept = [replacements.get(id(node), node) for node in nodes if id(node) not in removed]
        reshapes = {id(node) for node in kept if node.op_type == "Reshape"}  # of gamma and beta
        _replace(inner.node, _without_unread(kept, inner.output, reshapes))
        fused += len(replacements)
    _drop_unread_initializers(graph)
    return fused


def _without_unread(nodes, outputs, removable):
    """`nodes` less those whose `id` is in `removable` and whose outputs nothing reads (nor
    `outputs`), repeatedly."""
    while True:
        reads = _reads(outputs, nodes)
        kept = [
            node for node in nodes
            if id(node) not in removable or any(reads[name] for name in node.output)
        ]  # fmt: skip
        if len(kept) == len(nodes):
            return kept
        nodes = kept


def _layer_norm(graph, mean, readers, reads, producer, constants, tensor_file):
    """The nodes of a layer normalisation starting at `mean` (the last one writes its output)
    and its (x, gamma, beta, axis, epsilon), or None."""

    def only(name, op_type, count=1):
        found = [node for node in readers[name] if node.op_type == op_type]
        return found if reads[name] == count and len(found) == count else None

    def other_input(node, name):
        others = [i for i in node.input if i != name]
        return others[0] if len(others) == 1 else None

    axes, x = _attribute(mean, "axes"), mean.input[0]
    if axes is None or len(axes) != 1 or _attribute(mean, "keepdims", 1) != 1:
        return None
    users = {node.op_type: node for node in readers[mean.output[0]]}
    if reads[mean.output[0]] != 2 or set(users) != {"Neg", "Sub"}:
        return None
    negation, centred = users["Neg"], users["Sub"]
    if list(centred.input) != [x, mean.output[0]]:
        return None
    square = only(centred.output[0], "Mul", count=2)  # one node, reading it twice
    if square is None or square[0] is not square[1]:
        return None
    variance = only(square[0].output[0], "ReduceMean")
    if variance is None or _attribute(variance[0], "axes") != axes:
        return None
    chain, name = [], variance[0].output[0]
    for op_type in ("Add", "Sqrt", "Reciprocal", "Mul"):
        step = only(name, op_type)
        if step is None:
            return None
        chain.append(step[0])
        name = step[0].output[0]
    plus_epsilon, _, _, scaled = chain
    epsilon = _constant_array(
        constants, producer, other_input(plus_epsilon, variance[0].output[0]), tensor_file
    )
    gamma = other_input(scaled, chain[2].output[0])
    scaling = only(scaled.output[0], "Mul", count=2)
    if epsilon is None or epsilon.size != 1 or gamma is None or scaling is None:
        return None
    by_input = {other_input(node, scaled.output[0]): node for node in scaling}
    if set(by_input) != {x, negation.output[0]}:
        return None
    x_scaled, mean_scaled = by_input[x], by_input[negation.output[0]]
    shift = only(mean_scaled.output[0], "Add")
    total = only(x_scaled.output[0], "Add")
    if shift is None or total is None:
        return None
    (shift,), (total,) = shift, total
    beta = other_input(shift, mean_scaled.output[0])
    if beta is None or set(total.input) != {x_scaled.output[0], shift.output[0]}:
        return None
    (axis,) = axes
    weights = [
        _vector(name, axis, producer, constants, graph, tensor_file) for name in (gamma, beta)
    ]
    if None in weights:
        return None
    pattern = [mean, negation, centred, square[0], variance[0], *chain, *scaling, shift, total]
    return pattern, (x, *weights, axis, float(epsilon.reshape(())))


def _vector(name, axis, producer, constants, graph, tensor_file):
    """The 1-D vector that `name` broadcasts along `axis`, the last of its rank (Keras
    reshapes gamma and beta to `[1, ..., 1, size]`): its name (a constant's is a new
    initializer of `graph`), or None."""
    reshape = producer.get(name)
    if reshape is not None and reshape.op_type == "Reshape":
        shape = _constant_array(constants, producer, reshape.input[1], tensor_file)
        if (
            shape is not None
            and shape.ndim == 1
            and axis in (-1, shape.size - 1)
            and all(size == 1 for size in shape[:-1])
        ):
            return reshape.input[0]
        return None
    array = _constant_array(constants, producer, name, tensor_file)
    if (
        array is None
        or array.ndim < 1
        or axis not in (-1, array.ndim - 1)
        or any(size != 1 for size in array.shape[:-1])
    ):
        return None
    vector = f"{name}/vector"
    if vector not in constants:
        graph.initializer.append(numpy_helper.from_array(array.reshape(-1), vector))
        constants[vector] = graph.initializer[-1]
    return vector


# Ops whose output depends on their inputs alone, which may run before a loop instead of in it.
_PURE_OPS = frozenset({
    "Add", "Cast", "Concat", "ConstantOfShape", "Div", "Equal", "Expand", "Gather",
    "Greater", "Identity", "Less", "Max", "Min", "Mul", "Neg", "Not", "Range", "Reshape",
    "Shape", "Size", "Slice", "Squeeze", "Sub", "Tile", "Transpose", "Unsqueeze", "Where",
})  # fmt: skip
# An initializer a hoisted node reads moves with it up to this size; a larger one (a weight)
# keeps its node in the loop, where ONNX Runtime pre-packs it.
_MAX_HOISTED_INITIALIZER_ELEMENTS = 64


def hoist_invariant_nodes(graph):
    """Moves each node of a `Loop`'s body that reads nothing the iterations change (the
    body's inputs, or what is computed from them) out of the loop, just before it; returns
    how many.

    tf2onnx computes in the loop the shapes and masks derived from the encoded source (and
    reshapes of the weights): the same values at every step. Innermost loops go first, so a
    node can leave several loops. Nodes that write the body's outputs stay, as does every
    node of an op type not known to be pure.
    """
    hoisted = 0
    while True:
        moved = _hoist_one_loop(graph)
        if not moved:
            return hoisted
        hoisted += moved


def _hoist_one_loop(graph):
    """Hoists the invariant nodes of the innermost loop that has some; how many (0: none)."""
    for scopes in reversed(list(_scopes(graph))):
        owner = scopes[-1]
        for position, loop in enumerate(owner.node):
            if loop.op_type != "Loop":
                continue
            body = loop.attribute[0].g
            local = {i.name: i for i in body.initializer}
            changing = {value.name for value in body.input}
            outputs = {value.name for value in body.output}
            hoisting, staying = [], []
            for node in body.node:
                reads_local = [local[name] for name in node.input if name in local]
                if (
                    node.op_type in _PURE_OPS
                    and not changing.intersection(node.input)
                    and not outputs.intersection(node.output)
                    and all(
                        np.prod(i.dims) <= _MAX_HOISTED_INITIALIZER_ELEMENTS for i in reads_local
                    )
                ):
                    hoisting.append(node)
                else:
                    changing.update(node.output)
                    staying.append(node)
            if not hoisting:
                continue
            hoisting = [type(node).FromString(node.SerializeToString()) for node in hoisting]
            read_outside = {name for node in hoisting for name in node.input}
            owner.initializer.extend(i for name, i in local.items() if name in read_outside)
            _replace(body.initializer, [i for n, i in local.items() if n not in read_outside])
            _replace(body.node, staying)
            _replace(owner.node, [*owner.node[:position], *hoisting, *owner.node[position:]])
            return len(hoisting)
    return 0


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


def project_embeddings(graph, max_table_bytes=MAX_PROJECTED_TABLE_BYTES, tensor_file=None):
    """Rewrites a lookup in a constant table followed by a product with constant weights (and
    a constant bias), MatMul(Gather(E, ids), W) [+ b], as a lookup in the table E @ W + b,
    computed here in float64; returns how many.

    A recurrent decoder multiplies each step's token embedding by its input weights: gathering
    rows of the product saves that multiplication at every step, for a table of vocabulary x
    (gates x units) values (at most `max_table_bytes`). Only float32 tables are rewritten. A
    bias computed in the step (a Keras GRU splits its own) stays an addition.
    """
    projected = sum(
        _project_lookups(scopes[-1], _constants(scopes), max_table_bytes, tensor_file)
        for scopes in _scopes(graph)
    )
    _drop_unread_initializers(graph)
    return projected


def _project_lookups(graph, constants, max_table_bytes, tensor_file):
    """`project_embeddings` in one graph, with the constants its nodes can read."""
    nodes = list(graph.node)  # held, so that their ids stay theirs
    position = {id(node): k for k, node in enumerate(nodes)}
    reads = _reads(graph.output, nodes)
    readers = _readers(nodes)

    def only_reader(name, op_type):
        found = readers[name]
        if reads[name] == 1 and len(found) == 1 and found[0].op_type == op_type:
            return found[0]
        return None

    def constant_array(name, rank):
        value = constants.get(name)
        if value is None or value.data_type != onnx.TensorProto.FLOAT or len(value.dims) != rank:
            return None
        return _array(value, tensor_file)

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
        graph.initializer.append(_initializer(projection.astype(np.float32), name, tensor_file))
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
