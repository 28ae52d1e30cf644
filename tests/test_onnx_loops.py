"""The ONNX export's graph rewrites, on hand-built graphs: values a loop passes on unchanged
are hoisted out of it, tf2onnx's arithmetic selects become Where, a token lookup followed by a
product with constant weights becomes a lookup in their product, a transposed constant becomes
a constant, Keras' layer normalisation becomes one LayerNormalization node, the nodes of a loop
that compute the same value at every iteration run before it, and weights only a loop reads move
into the loop."""

import numpy as np
import onnx
import onnxruntime
import pytest
from onnx import TensorProto, helper

from export.int8 import write_int8
from export.onnx_rewrites import (
    fold_constant_transposes,
    fuse_layer_norms,
    hoist_invariant_nodes,
    hoist_loop_invariants,
    move_initializers_into_loops,
    project_embeddings,
    selects_as_where,
)


def accumulating_loop(iterations=4):
    """total = start + iterations * weight, with `weight` (an initializer) and `offset` (an
    input) carried through the loop unchanged, as tf2onnx carries captured tensors."""
    body = helper.make_graph(
        [
            helper.make_node("Identity", ["cond_in"], ["cond_out"]),
            helper.make_node("Add", ["total_in", "weight_in"], ["total_sum"]),
            helper.make_node("Add", ["total_sum", "offset_in"], ["total_out"]),
        ],
        "body",
        [
            helper.make_tensor_value_info("i", TensorProto.INT64, []),
            helper.make_tensor_value_info("cond_in", TensorProto.BOOL, []),
            helper.make_tensor_value_info("total_in", TensorProto.FLOAT, [2]),
            helper.make_tensor_value_info("weight_in", TensorProto.FLOAT, [2]),
            helper.make_tensor_value_info("offset_in", TensorProto.FLOAT, [2]),
        ],
        [
            helper.make_tensor_value_info("cond_out", TensorProto.BOOL, []),
            helper.make_tensor_value_info("total_out", TensorProto.FLOAT, [2]),
            helper.make_tensor_value_info("weight_in", TensorProto.FLOAT, [2]),
            helper.make_tensor_value_info("offset_in", TensorProto.FLOAT, [2]),
        ],
    )
    loop = helper.make_node(
        "Loop",
        ["trips", "keep_going", "start", "weight", "offset"],
        ["total", "weight_after", "offset_after"],
        body=body,
    )
    read_offset = helper.make_node("Mul", ["offset_after", "start"], ["offset_times_start"])
    graph = helper.make_graph(
        [loop, read_offset],
        "accumulate",
        [
            helper.make_tensor_value_info("start", TensorProto.FLOAT, [2]),
            helper.make_tensor_value_info("offset", TensorProto.FLOAT, [2]),
        ],
        [
            helper.make_tensor_value_info("total", TensorProto.FLOAT, [2]),
            helper.make_tensor_value_info("offset_times_start", TensorProto.FLOAT, [2]),
        ],
        initializer=[
            helper.make_tensor("trips", TensorProto.INT64, [], [iterations]),
            helper.make_tensor("keep_going", TensorProto.BOOL, [], [True]),
            helper.make_tensor("weight", TensorProto.FLOAT, [2], [1.0, 10.0]),
        ],
    )
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=8)


def run(model, start, offset):
    return session(model).run(None, {"start": start, "offset": offset})


def session(model):
    return onnxruntime.InferenceSession(
        model.SerializeToString(), providers=["CPUExecutionProvider"]
    )


def test_values_a_loop_passes_on_unchanged_become_outer_references():
    model = accumulating_loop()
    start, offset = np.array([1.0, 2.0], np.float32), np.array([0.5, 0.25], np.float32)
    before = run(model, start, offset)
    assert hoist_loop_invariants(model.graph) == 2
    onnx.checker.check_model(model, full_check=True)
    loop = model.graph.node[0]
    assert list(loop.input) == ["trips", "keep_going", "start"]  # only the total is carried
    assert list(loop.output) == ["total"]
    assert [n.input[1] for n in loop.attribute[0].g.node[1:]] == ["weight", "offset"]
    # The loop's output for `offset` was read after the loop: it now reads the input itself.
    assert list(model.graph.node[1].input) == ["offset", "start"]
    after = run(model, start, offset)
    np.testing.assert_array_equal(after[0], start + 4 * (np.array([1.0, 10.0]) + offset))
    for expected, actual in zip(before, after):
        np.testing.assert_array_equal(actual, expected)
    assert hoist_loop_invariants(model.graph) == 0


def arithmetic_select_in_a_loop():
    """A loop whose body computes select(c, x, y) as tf2onnx writes it, and reads `c` and `y`
    again after the select (so those stay)."""
    body = helper.make_graph(
        [
            helper.make_node("Identity", ["cond_in"], ["cond_out"]),
            helper.make_node("Cast", ["mask"], ["mask_as_float"], to=TensorProto.FLOAT),
            helper.make_node("Mul", ["mask_as_float", "x"], ["kept_x"]),
            helper.make_node("Not", ["mask"], ["not_mask"]),
            helper.make_node("Cast", ["not_mask"], ["not_mask_as_float"], to=TensorProto.FLOAT),
            helper.make_node("Mul", ["y", "not_mask_as_float"], ["kept_y"]),
            helper.make_node("Add", ["kept_x", "kept_y"], ["selected"]),
            helper.make_node("Add", ["total_in", "selected"], ["total_out"]),
            helper.make_node("Cast", ["mask"], ["mask_out"], to=TensorProto.INT32),
        ],
        "body",
        [
            helper.make_tensor_value_info("i", TensorProto.INT64, []),
            helper.make_tensor_value_info("cond_in", TensorProto.BOOL, []),
            helper.make_tensor_value_info("total_in", TensorProto.FLOAT, [3]),
        ],
        [
            helper.make_tensor_value_info("cond_out", TensorProto.BOOL, []),
            helper.make_tensor_value_info("total_out", TensorProto.FLOAT, [3]),
            helper.make_tensor_value_info("mask_out", TensorProto.INT32, [3]),
        ],
    )
    loop = helper.make_node("Loop", ["trips", "keep_going", "start"], ["total", "masks"], body=body)
    graph = helper.make_graph(
        [loop],
        "select",
        [
            helper.make_tensor_value_info("start", TensorProto.FLOAT, [3]),
            helper.make_tensor_value_info("mask", TensorProto.BOOL, [3]),
            helper.make_tensor_value_info("x", TensorProto.FLOAT, [3]),
            helper.make_tensor_value_info("y", TensorProto.FLOAT, [3]),
        ],
        [
            helper.make_tensor_value_info("total", TensorProto.FLOAT, [3]),
            helper.make_tensor_value_info("masks", TensorProto.INT32, [2, 3]),
        ],
        initializer=[
            helper.make_tensor("trips", TensorProto.INT64, [], [2]),
            helper.make_tensor("keep_going", TensorProto.BOOL, [], [True]),
        ],
    )
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=8)


def test_arithmetic_selects_become_where_and_give_the_same_values():
    model = arithmetic_select_in_a_loop()
    feed = {
        "start": np.zeros(3, np.float32),
        "mask": np.array([True, False, True]),
        "x": np.array([1.5, -np.inf, -2.0], np.float32),  # the arithmetic gives NaN for inf
        "y": np.array([7.0, 3.0, np.inf], np.float32),
    }
    before = session(model).run(None, feed)
    assert np.isnan(before[0]).tolist() == [False, True, True]
    assert selects_as_where(model.graph) == 1
    onnx.checker.check_model(model, full_check=True)
    body = model.graph.node[0].attribute[0].g
    assert [node.op_type for node in body.node] == ["Identity", "Where", "Add", "Cast"]
    assert list(body.node[1].input) == ["mask", "x", "y"]
    total, masks = session(model).run(None, feed)
    np.testing.assert_array_equal(total, 2 * np.where(feed["mask"], feed["x"], feed["y"]))
    np.testing.assert_array_equal(masks, before[1])
    assert selects_as_where(model.graph) == 0


def test_weights_only_a_loop_reads_move_into_it():
    model = accumulating_loop()
    hoist_loop_invariants(model.graph)
    start, offset = np.array([1.0, 2.0], np.float32), np.array([0.5, 0.25], np.float32)
    before = run(model, start, offset)
    assert move_initializers_into_loops(model.graph) == 1
    onnx.checker.check_model(model, full_check=True)
    body = model.graph.node[0].attribute[0].g
    assert [i.name for i in body.initializer] == ["weight"]
    # The loop's own inputs stay where the Loop node reads them.
    assert [i.name for i in model.graph.initializer] == ["trips", "keep_going"]
    for expected, actual in zip(before, run(model, start, offset)):
        np.testing.assert_array_equal(actual, expected)
    assert move_initializers_into_loops(model.graph) == 0


def embedding_step_loop(vocab=7, dim=3, width=4, read_embedding_twice=False):
    """A loop that, at each step, looks up `tokens[i]` in an embedding table, multiplies it by
    weights and adds a bias (as a Keras LSTM step does), and sums the results. The table, the
    weights and the bias are initializers of the outer graph."""
    rng = np.random.default_rng(3)
    body_nodes = [
        helper.make_node("Identity", ["cond_in"], ["cond_out"]),
        helper.make_node("Gather", ["tokens", "i"], ["token"], axis=0),
        helper.make_node("Gather", ["embeddings", "token"], ["embedded"], axis=0),
        helper.make_node("MatMul", ["embedded", "weights"], ["product"]),
        helper.make_node("Add", ["product", "bias"], ["projected"]),
        helper.make_node("Add", ["total_in", "projected"], ["total_out"]),
    ]
    if read_embedding_twice:  # the embedding is read again: the product must stay
        body_nodes.append(helper.make_node("ReduceSum", ["embedded"], ["embedded_sum"]))
    body = helper.make_graph(
        body_nodes,
        "body",
        [
            helper.make_tensor_value_info("i", TensorProto.INT64, []),
            helper.make_tensor_value_info("cond_in", TensorProto.BOOL, []),
            helper.make_tensor_value_info("total_in", TensorProto.FLOAT, [None, width]),
        ],
        [
            helper.make_tensor_value_info("cond_out", TensorProto.BOOL, []),
            helper.make_tensor_value_info("total_out", TensorProto.FLOAT, [None, width]),
        ],
    )
    loop = helper.make_node("Loop", ["trips", "", "start"], ["total"], body=body)
    graph = helper.make_graph(
        [loop],
        "embed",
        [
            helper.make_tensor_value_info("trips", TensorProto.INT64, []),
            helper.make_tensor_value_info("tokens", TensorProto.INT64, [None, None]),
            helper.make_tensor_value_info("start", TensorProto.FLOAT, [None, width]),
        ],
        [helper.make_tensor_value_info("total", TensorProto.FLOAT, [None, width])],
        initializer=[
            onnx.numpy_helper.from_array(value, name)
            for name, value in [
                ("embeddings", rng.normal(size=(vocab, dim)).astype(np.float32)),
                ("weights", rng.normal(size=(dim, width)).astype(np.float32)),
                ("bias", rng.normal(size=width).astype(np.float32)),
            ]
        ],
    )
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=8)


def run_embedding_steps(model):
    tokens = np.array([[1, 6, 0], [4, 4, 2]], np.int64)  # [steps, batch]
    feed = {"trips": np.array(2, np.int64), "tokens": tokens, "start": np.zeros((3, 4), np.float32)}
    return session(model).run(None, feed)[0]


def test_a_lookup_then_a_product_becomes_a_lookup_in_the_product():
    model = embedding_step_loop()
    before = run_embedding_steps(model)
    embeddings, weights, bias = map(onnx.numpy_helper.to_array, model.graph.initializer)
    assert project_embeddings(model.graph) == 1
    onnx.checker.check_model(model, full_check=True)
    body = model.graph.node[0].attribute[0].g
    assert [node.op_type for node in body.node] == ["Identity", "Gather", "Gather", "Add"]
    assert body.node[2].output[0] == "projected"
    # The table is computed in float64 and rounded once; it replaces what only the removed
    # nodes read (the embeddings, the weights, the bias).
    (table,) = body.initializer
    assert table.name == body.node[2].input[0]
    exact = embeddings.astype(np.float64) @ weights + bias
    np.testing.assert_array_equal(onnx.numpy_helper.to_array(table), exact.astype(np.float32))
    assert [i.name for i in model.graph.initializer] == []
    np.testing.assert_allclose(run_embedding_steps(model), before, rtol=1e-5, atol=1e-5)
    assert project_embeddings(model.graph) == 0


def test_a_lookup_read_elsewhere_or_a_table_too_large_stays_a_product():
    shared = embedding_step_loop(read_embedding_twice=True)
    assert project_embeddings(shared.graph) == 0
    large = embedding_step_loop(vocab=7, width=4)
    assert project_embeddings(large.graph, max_table_bytes=7 * 4 * 4 - 1) == 0
    assert project_embeddings(large.graph, max_table_bytes=7 * 4 * 4) == 1


def tied_projection_loop(vocab=9, dim=4):
    """A loop that projects its state on the transpose of an outer embedding table at each
    step, as a Transformer with tied embeddings does, and sums the logits."""
    rng = np.random.default_rng(5)
    body = helper.make_graph(
        [
            helper.make_node("Identity", ["cond_in"], ["cond_out"]),
            helper.make_node("Transpose", ["embeddings"], ["projection"], perm=[1, 0]),
            helper.make_node("MatMul", ["state", "projection"], ["logits"]),
            helper.make_node("Add", ["total_in", "logits"], ["total_out"]),
        ],
        "body",
        [
            helper.make_tensor_value_info("i", TensorProto.INT64, []),
            helper.make_tensor_value_info("cond_in", TensorProto.BOOL, []),
            helper.make_tensor_value_info("total_in", TensorProto.FLOAT, [None, vocab]),
        ],
        [
            helper.make_tensor_value_info("cond_out", TensorProto.BOOL, []),
            helper.make_tensor_value_info("total_out", TensorProto.FLOAT, [None, vocab]),
        ],
    )
    graph = helper.make_graph(
        [helper.make_node("Loop", ["trips", "", "start"], ["total"], body=body)],
        "tied",
        [
            helper.make_tensor_value_info("trips", TensorProto.INT64, []),
            helper.make_tensor_value_info("state", TensorProto.FLOAT, [None, dim]),
            helper.make_tensor_value_info("start", TensorProto.FLOAT, [None, vocab]),
        ],
        [helper.make_tensor_value_info("total", TensorProto.FLOAT, [None, vocab])],
        initializer=[
            onnx.numpy_helper.from_array(
                rng.normal(size=(vocab, dim)).astype(np.float32), "embeddings"
            )
        ],  # fmt: skip
    )
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=8)


def test_a_transposed_constant_becomes_a_constant_that_int8_quantises(tmp_path):
    model = tied_projection_loop()
    feed = {"trips": np.array(3, np.int64), "state": np.ones((2, 4), np.float32),
            "start": np.zeros((2, 9), np.float32)}  # fmt: skip
    before = session(model).run(None, feed)[0]
    embeddings = onnx.numpy_helper.to_array(model.graph.initializer[0])
    assert fold_constant_transposes(model.graph) == 1
    onnx.checker.check_model(model, full_check=True)
    body = model.graph.node[0].attribute[0].g
    assert [node.op_type for node in body.node] == ["Identity", "MatMul", "Add"]
    (projection,) = body.initializer  # in the loop's own graph; the table, read by none, gone
    assert projection.name == "projection" and not model.graph.initializer
    np.testing.assert_array_equal(onnx.numpy_helper.to_array(projection), embeddings.T)
    np.testing.assert_array_equal(session(model).run(None, feed)[0], before)
    assert fold_constant_transposes(model.graph) == 0
    # Now a weight of its own graph, the product is quantised with the others.
    onnx.save(model, str(tmp_path / "model.onnx"))
    write_int8(tmp_path / "model.onnx", tmp_path / "model.int8.onnx")
    quantised = onnx.load(str(tmp_path / "model.int8.onnx")).graph
    (loop,) = [node for node in quantised.node if node.op_type == "Loop"]
    assert "MatMulInteger" in [node.op_type for node in loop.attribute[0].g.node]


def keras_layer_norm_loop(dim=6, epsilon=1e-3):
    """A loop whose step normalises `state_in @ weight` as tf2onnx writes Keras'
    LayerNormalization (the moments, then x * m + (beta - mean * m) with
    m = gamma / sqrt(var + eps)); gamma and beta are outer values the step reshapes to
    `[1, dim]`, as a search loop reads them."""
    body = helper.make_graph(
        [
            helper.make_node("Identity", ["cond_in"], ["cond_out"]),
            helper.make_node("MatMul", ["state_in", "weight"], ["x"]),
            helper.make_node("Reshape", ["gamma", "row"], ["gamma_row"]),
            helper.make_node("Reshape", ["beta", "row"], ["beta_row"]),
            helper.make_node("ReduceMean", ["x"], ["mean"], axes=[1], keepdims=1),
            helper.make_node("Neg", ["mean"], ["negated"]),
            helper.make_node("Sub", ["x", "mean"], ["centred"]),
            helper.make_node("Mul", ["centred", "centred"], ["squared"]),
            helper.make_node("ReduceMean", ["squared"], ["variance"], axes=[1], keepdims=1),
            helper.make_node("Add", ["variance", "epsilon"], ["shifted"]),
            helper.make_node("Sqrt", ["shifted"], ["deviation"]),
            helper.make_node("Reciprocal", ["deviation"], ["inverse"]),
            helper.make_node("Mul", ["inverse", "gamma_row"], ["scale"]),
            helper.make_node("Mul", ["x", "scale"], ["scaled"]),
            helper.make_node("Mul", ["negated", "scale"], ["mean_scaled"]),
            helper.make_node("Add", ["mean_scaled", "beta_row"], ["offset"]),
            helper.make_node("Add", ["scaled", "offset"], ["state_out"]),
        ],
        "body",
        [
            helper.make_tensor_value_info("i", TensorProto.INT64, []),
            helper.make_tensor_value_info("cond_in", TensorProto.BOOL, []),
            helper.make_tensor_value_info("state_in", TensorProto.FLOAT, [None, dim]),
        ],
        [
            helper.make_tensor_value_info("cond_out", TensorProto.BOOL, []),
            helper.make_tensor_value_info("state_out", TensorProto.FLOAT, [None, dim]),
        ],
        initializer=[
            helper.make_tensor("row", TensorProto.INT64, [2], [1, dim]),
            helper.make_tensor("epsilon", TensorProto.FLOAT, [], [epsilon]),
        ],
    )
    graph = helper.make_graph(
        [helper.make_node("Loop", ["trips", "", "start"], ["state"], body=body)],
        "normalise",
        [
            helper.make_tensor_value_info("trips", TensorProto.INT64, []),
            helper.make_tensor_value_info("start", TensorProto.FLOAT, [None, dim]),
            helper.make_tensor_value_info("gamma", TensorProto.FLOAT, [dim]),
            helper.make_tensor_value_info("beta", TensorProto.FLOAT, [dim]),
        ],
        [helper.make_tensor_value_info("state", TensorProto.FLOAT, [None, dim])],
        initializer=[
            onnx.numpy_helper.from_array(
                np.random.default_rng(0).normal(size=(dim, dim)).astype(np.float32), "weight"
            )
        ],  # fmt: skip
    )
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=8)


def test_keras_layer_norm_becomes_one_node_with_the_same_values():
    model = keras_layer_norm_loop()
    rng = np.random.default_rng(1)
    feed = {"trips": np.array(3, np.int64), "start": rng.normal(size=(5, 6)).astype(np.float32),
            "gamma": rng.normal(size=6).astype(np.float32),
            "beta": rng.normal(size=6).astype(np.float32)}  # fmt: skip
    before = session(model).run(None, feed)[0]
    assert fuse_layer_norms(model.graph) == 1
    onnx.checker.check_model(model, full_check=True)
    body = model.graph.node[0].attribute[0].g
    assert [node.op_type for node in body.node] == ["Identity", "MatMul", "LayerNormalization"]
    (norm,) = body.node[2:]
    assert list(norm.input) == ["x", "gamma", "beta"] and list(norm.output) == ["state_out"]
    assert {a.name: helper.get_attribute_value(a) for a in norm.attribute} == pytest.approx(
        {"axis": 1, "epsilon": 1e-3}
    )
    assert [i.name for i in body.initializer] == []  # the reshapes' shape and eps: unread
    np.testing.assert_allclose(session(model).run(None, feed)[0], before, rtol=1e-5, atol=1e-5)
    assert fuse_layer_norms(model.graph) == 0


def test_a_normalisation_whose_parts_are_read_elsewhere_stays():
    model = keras_layer_norm_loop()
    body = model.graph.node[0].attribute[0].g
    body.output.append(helper.make_tensor_value_info("variance", TensorProto.FLOAT, [None, 1]))
    model.graph.node[0].output.append("last_variance")
    assert fuse_layer_norms(model.graph) == 0


def masked_sum_loop():
    """Each step adds `source_mask * row_scale` to the total, with the mask's float form and
    the scale computed in the step from values that do not change (tf2onnx's way with
    captured tensors), and one random node, which must stay."""
    body = helper.make_graph(
        [
            helper.make_node("Identity", ["cond_in"], ["cond_out"]),
            helper.make_node("Cast", ["source_mask"], ["mask_float"], to=TensorProto.FLOAT),
            helper.make_node("Shape", ["source_mask"], ["mask_shape"]),
            helper.make_node("Gather", ["mask_shape", "last"], ["width"], axis=0),
            helper.make_node("Cast", ["width"], ["width_float"], to=TensorProto.FLOAT),
            helper.make_node("Div", ["mask_float", "width_float"], ["row_scale"]),
            helper.make_node("RandomUniformLike", ["row_scale"], ["noise"], high=0.0, low=0.0),
            helper.make_node("Add", ["row_scale", "noise"], ["step_value"]),
            helper.make_node("Add", ["total_in", "step_value"], ["total_out"]),
        ],
        "body",
        [
            helper.make_tensor_value_info("i", TensorProto.INT64, []),
            helper.make_tensor_value_info("cond_in", TensorProto.BOOL, []),
            helper.make_tensor_value_info("total_in", TensorProto.FLOAT, [None, None]),
        ],
        [
            helper.make_tensor_value_info("cond_out", TensorProto.BOOL, []),
            helper.make_tensor_value_info("total_out", TensorProto.FLOAT, [None, None]),
        ],
        initializer=[helper.make_tensor("last", TensorProto.INT64, [], [1])],
    )
    graph = helper.make_graph(
        [helper.make_node("Loop", ["trips", "", "start"], ["total"], body=body)],
        "masked_sum",
        [
            helper.make_tensor_value_info("trips", TensorProto.INT64, []),
            helper.make_tensor_value_info("start", TensorProto.FLOAT, [None, None]),
            helper.make_tensor_value_info("source_mask", TensorProto.BOOL, [None, None]),
        ],
        [helper.make_tensor_value_info("total", TensorProto.FLOAT, [None, None])],
    )
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=8)


def test_nodes_that_compute_the_same_value_at_every_step_run_before_the_loop():
    model = masked_sum_loop()
    feed = {"trips": np.array(4, np.int64), "start": np.zeros((2, 3), np.float32),
            "source_mask": np.array([[1, 1, 0], [1, 0, 0]], bool)}  # fmt: skip
    before = session(model).run(None, feed)[0]
    assert hoist_invariant_nodes(model.graph) == 5
    onnx.checker.check_model(model, full_check=True)
    assert [node.op_type for node in model.graph.node] == [
        "Cast", "Shape", "Gather", "Cast", "Div", "Loop"
    ]  # fmt: skip
    body = model.graph.node[-1].attribute[0].g
    assert [node.op_type for node in body.node] == ["Identity", "RandomUniformLike", "Add", "Add"]
    # The small constant the hoisted Gather reads went out with it.
    assert [i.name for i in model.graph.initializer] == ["last"] and not body.initializer
    after = session(model).run(None, feed)[0]
    np.testing.assert_array_equal(after, before)
    np.testing.assert_allclose(after, 4 * feed["source_mask"] / 3)
    assert hoist_invariant_nodes(model.graph) == 0
