"""The ONNX export's graph rewrite: values a loop passes on unchanged are hoisted out of it."""

import numpy as np
import onnx
import onnxruntime
from onnx import TensorProto, helper

from export.onnx_model import _hoist_loop_invariants


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
    session = onnxruntime.InferenceSession(
        model.SerializeToString(), providers=["CPUExecutionProvider"]
    )
    return session.run(None, {"start": start, "offset": offset})


def test_values_a_loop_passes_on_unchanged_become_outer_references():
    model = accumulating_loop()
    start, offset = np.array([1.0, 2.0], np.float32), np.array([0.5, 0.25], np.float32)
    before = run(model, start, offset)
    assert _hoist_loop_invariants(model.graph) == 2
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
    assert _hoist_loop_invariants(model.graph) == 0
