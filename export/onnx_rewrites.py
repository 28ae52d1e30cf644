"""Rewrites of the ONNX graph tf2onnx writes, for ONNX Runtime's sake: each keeps what the
graph computes and removes work that the search loops would repeat at every step."""

import collections
import functools

import onnx
from onnx import helper


def optimise_loops(graph):
    """Applies every rewrite below to `graph`; returns how many changes each made."""
    return {
        "hoisted": hoist_loop_invariants(graph),
        "selects": selects_as_where(graph),
        "moved_initializers": move_initializers_into_loops(graph),
    }


def subgraphs(graph):
    """`graph` and every graph nested in its nodes' attributes, outermost first."""
    yield graph
    for node in graph.node:
        for attribute in node.attribute:
            if attribute.type == onnx.AttributeProto.GRAPH:
                yield from subgraphs(attribute.g)


def _rename_input(graph, old, new):
    """Makes every node of `graph` and of its subgraphs read `new` where it read `old`."""
    for node in graph.node:
        node.input[:] = [new if name == old else name for name in node.input]
        for attribute in node.attribute:
            if attribute.type == onnx.AttributeProto.GRAPH:
                _rename_input(attribute.g, old, new)


def _replace(field, items):
    items = [type(item).FromString(item.SerializeToString()) for item in items]
    del field[:]
    field.extend(items)


def hoist_loop_invariants(graph):
    """Turns each value a `Loop` carries unchanged from one iteration to the next into a plain
    reference to the value outside the loop; returns how many there were.

    tf2onnx carries every captured tensor this way: the weights, the encoded source, the
    search settings. ONNX Runtime handles each carried value at every iteration, so at batch
    1 the beam search spent about a quarter of its time passing them on (bench/RESULTS.md).
    """
    hoisted = 0
    for node in graph.node:
        if node.op_type == "Loop":
            body = node.attribute[0].g
            carried = len(node.input) - 2  # after the trip count and the condition
            graph_outputs = {output.name for output in graph.output}
            invariant = [
                node.input[2 + k]
                and body.output[1 + k].name == body.input[2 + k].name
                and node.output[k] not in graph_outputs
                for k in range(carried)
            ]
            for k in (k for k in range(carried) if invariant[k]):
                _rename_input(body, body.input[2 + k].name, node.input[2 + k])
                _rename_input(graph, node.output[k], node.input[2 + k])
            kept = [k for k in range(carried) if not invariant[k]]
            node.input[:] = node.input[:2] + [node.input[2 + k] for k in kept]
            node.output[:] = [node.output[k] for k in kept] + node.output[carried:]
            _replace(body.input, body.input[:2] + [body.input[2 + k] for k in kept])
            _replace(
                body.output,
                body.output[:1] + [body.output[1 + k] for k in kept] + body.output[1 + carried :],
            )
            hoisted += sum(invariant)
        for attribute in node.attribute:
            if attribute.type == onnx.AttributeProto.GRAPH:
                hoisted += hoist_loop_invariants(attribute.g)
    return hoisted


def _reads(outputs, nodes):
    """How many times each value name is read by `nodes` (their subgraphs included) and
    `outputs`."""
    reads = collections.Counter(output.name for output in outputs)
    for node in nodes:
        reads.update(node.input)
        for attribute in node.attribute:
            if attribute.type == onnx.AttributeProto.GRAPH:
                reads += _reads(attribute.g.output, attribute.g.node)
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
