"""int8 weights for an exported ONNX model: ONNX Runtime's dynamic quantisation, as its
`quantize_dynamic(weight_type=QInt8)` computes it, one tensor in memory at a time.

Each `MatMul` whose second input is a float initializer (in its graph or one enclosing it, so
inside the search loops too), and each `Gemm` that is such a product plus a bias, becomes
`DynamicQuantizeLinear` of its first input (uint8, per tensor, at run time; once per input and
graph), `MatMulInteger` with the weight in int8 (per tensor, symmetric, [-127, 127]), and the
product's rescaling, which ONNX Runtime fuses into one kernel; each `Gather` from a float
initializer gathers from the table in uint8 (per tensor, asymmetric) and dequantises what it
gathered. The numbers are quantize_dynamic's (tests/test_int8.py compares the models'
outputs), but its quantiser holds a model several times over and serialises loop bodies
whole: a 600M-parameter model outgrew 24 GiB and the protobuf limit. Here the float tensors
stay in their file until each is quantised or copied. It needs no TensorFlow, so that
benchmarks can quantise a graph beside a TensorFlow-free runtime.
"""

from pathlib import Path

import numpy as np
import onnx
from onnx import helper, numpy_helper

from export.onnx_rewrites import (
    BLOCK_BYTES,
    _attribute,
    _constants,
    _drop_unread_initializers,
    _replace,
    _scopes,
)

# Tensors of at least this many bytes go to the data file when the model keeps them apart.
EXTERNAL_TENSOR_BYTES = 1024
WEIGHT_RANGE = (-127, 127)  # int8, symmetric: zero point 0
TABLE_RANGE = (0, 255)  # uint8, asymmetric


def quantised(values, low, high):
    """(quantised values, scale, zero point) of `values` over [low, high], per tensor: the
    range [min(values, 0), max(values, 0)], made symmetric when `low` is -`high`."""
    dtype = np.int8 if low < 0 else np.uint8
    smallest = min(values.min(), np.float32(0)) if values.size else np.float32(0)
    largest = max(values.max(), np.float32(0)) if values.size else np.float32(0)
    if low == -high:
        largest = max(abs(smallest), abs(largest))
        smallest = -largest
    scale = (np.float64(largest) - np.float64(smallest)) / (np.float64(high) - np.float64(low))
    if scale < np.finfo(np.float32).tiny:
        scale, zero_point = np.float32(1), dtype(0)
    else:
        symmetric_zero = np.round((low + high) / 2.0)
        zero_point = dtype(symmetric_zero if low == -high else np.round(low - smallest / scale))
        scale = np.float32(scale)
    # A block of rows at a time: the float temporaries of a whole embedding table would be
    # several times the int8 result.
    result = np.empty(values.shape, dtype)
    blocks = [...]  # a scalar: whole
    if values.ndim:
        rows = max(1, BLOCK_BYTES // max(1, values[:1].size * 4))
        blocks = [slice(start, start + rows) for start in range(0, len(values), rows)]
    for part in blocks:
        rounded = (values[part].astype(np.float32) / scale).round() + zero_point
        result[part] = np.clip(rounded, low, high)
    return result, scale, zero_point


def _is_product(gemm):
    """Whether a Gemm is A @ B' + C (no scaling, A as it is; B' is B or its transpose)."""
    scaled = _attribute(gemm, "alpha", 1.0) != 1.0 or _attribute(gemm, "beta", 1.0) != 1.0
    return not scaled and not _attribute(gemm, "transA", 0)


class _Tensors:
    """Reads initializers wherever they are: inline, or in a data file beside the model."""

    def __init__(self, directory):
        self.directory = Path(directory)

    def _external(self, tensor):
        info = {entry.key: entry.value for entry in tensor.external_data}
        return self.directory / info["location"], int(info.get("offset", 0)), info.get("length")

    def values(self, tensor):
        if tensor.data_location != onnx.TensorProto.EXTERNAL:
            return numpy_helper.to_array(tensor)
        path, offset, _ = self._external(tensor)
        dtype = helper.tensor_dtype_to_np_dtype(tensor.data_type)
        count = int(np.prod(tensor.dims))
        return np.fromfile(path, dtype, count, offset=offset).reshape(tuple(tensor.dims))

    def data(self, tensor):
        """The tensor's bytes as stored."""
        if tensor.data_location != onnx.TensorProto.EXTERNAL:
            return tensor.raw_data or numpy_helper.from_array(self.values(tensor)).raw_data
        path, offset, length = self._external(tensor)
        with open(path, "rb") as stored:
            stored.seek(offset)
            return stored.read(int(length) if length is not None else -1)


class _Quantiser:
    """Rewrites the nodes of each graph; the quantised tensors join the graph that holds the
    float ones (a loop body reads an outer weight as it read the float one)."""

    def __init__(self, tensors):
        self.tensors = tensors
        self.done = {}  # (float name, range, transposed): (quantised, scale, zero point) names

    def weight(self, name, scopes, value_range, transposed=False):
        key = name, value_range, transposed
        if key not in self.done:
            owner = next(g for g in reversed(scopes) if any(i.name == name for i in g.initializer))
            (tensor,) = [i for i in owner.initializer if i.name == name]
            values = self.tensors.values(tensor)
            values, scale, zero_point = quantised(values.T if transposed else values, *value_range)
            suffix = ("_transposed" if transposed else "") + (
                "_int8" if value_range == WEIGHT_RANGE else "_uint8"
            )
            names = tuple(f"{name}{suffix}{part}" for part in ("", "_scale", "_zero_point"))
            for array, array_name in zip((values, scale, zero_point), names):
                owner.initializer.append(numpy_helper.from_array(np.asarray(array), array_name))
            self.done[key] = names
        return self.done[key]

    def graph(self, scopes):
        inner, constants = scopes[-1], _constants(scopes)

        def float_constant(name):
            return name in constants and constants[name].data_type == onnx.TensorProto.FLOAT

        nodes, activations = [], {}
        for node in inner.node:
            if node.op_type == "MatMul" and float_constant(node.input[1]):
                weights = self.weight(node.input[1], scopes, WEIGHT_RANGE)
                nodes += self._product(node.input[0], weights, node.output[0],
                                       node.name or node.output[0], activations)  # fmt: skip
            elif node.op_type == "Gemm" and float_constant(node.input[1]) and _is_product(node):
                nodes += self._gemm(node, scopes, activations)
            elif node.op_type == "Gather" and float_constant(node.input[0]):
                nodes += self._gather(node, scopes)
            else:
                nodes.append(node)
        if len(nodes) != len(inner.node):
            _replace(inner.node, nodes)

    def _product(self, source, weights, output, name, activations):
        """The nodes of `source` @ the quantised `weights` into `output`."""
        nodes = []
        if source not in activations:  # once per input and graph, as quantize_dynamic does
            activations[source] = [f"{source}_quantized{s}" for s in ("", "_scale", "_zero")]
            nodes.append(helper.make_node("DynamicQuantizeLinear", [source], activations[source],
                                          name=f"{source}_quantize"))  # fmt: skip
        values, scale, zero_point = activations[source]
        weights, weight_scale, weight_zero = weights
        product, as_float, scales = (f"{output}_int32", f"{output}_float", f"{output}_scales")
        return nodes + [
            helper.make_node("MatMulInteger", [values, weights, zero_point, weight_zero],
                             [product], name=f"{name}_int8"),
            helper.make_node("Cast", [product], [as_float], name=f"{name}_cast",
                             to=onnx.TensorProto.FLOAT),
            helper.make_node("Mul", [scale, weight_scale], [scales], name=f"{name}_scales"),
            helper.make_node("Mul", [as_float, scales], [output], name=name),
        ]  # fmt: skip

    def _gemm(self, node, scopes, activations):
        """A Gemm that is A @ B (+ C) as that product (+ C), as quantize_dynamic rewrites it."""
        weights = self.weight(node.input[1], scopes, WEIGHT_RANGE, _attribute(node, "transB", 0))
        name = node.name or node.output[0]
        if len(node.input) < 3 or not node.input[2]:
            return self._product(node.input[0], weights, node.output[0], name, activations)
        product = f"{node.output[0]}_MatMul"
        return self._product(node.input[0], weights, product, name, activations) + [
            helper.make_node("Add", [product, node.input[2]], node.output, name=f"{name}_Add")
        ]

    def _gather(self, node, scopes):
        table, scale, zero_point = self.weight(node.input[0], scopes, TABLE_RANGE)
        gathered, name = f"{node.output[0]}_uint8", node.name or node.output[0]
        return [
            helper.make_node("Gather", [table, *node.input[1:]], [gathered], name=name,
                             axis=_attribute(node, "axis", 0)),
            helper.make_node("DequantizeLinear", [gathered, scale, zero_point], node.output,
                             name=f"{name}_dequantize"),
        ]  # fmt: skip


def _write_apart(model, target, tensors):
    """Saves `model` at `target` with each tensor of EXTERNAL_TENSOR_BYTES or more in
    `target`.data, copied from where it is, one at a time."""
    data_file = target.with_name(target.name + ".data")
    offset = 0
    with open(data_file, "wb") as data:
        for graph in (scopes[-1] for scopes in _scopes(model.graph)):
            for tensor in graph.initializer:
                stored = tensors.data(tensor)
                if len(stored) < EXTERNAL_TENSOR_BYTES:
                    if tensor.data_location == onnx.TensorProto.EXTERNAL:
                        tensor.raw_data = stored
                        del tensor.external_data[:]
                        tensor.data_location = onnx.TensorProto.DEFAULT
                    continue
                data.write(stored)
                tensor.ClearField("raw_data")
                tensor.data_location = onnx.TensorProto.EXTERNAL
                del tensor.external_data[:]
                for key, value in (("location", data_file.name), ("offset", offset),
                                   ("length", len(stored))):  # fmt: skip
                    tensor.external_data.add(key=key, value=str(value))
                offset += len(stored)
    onnx.save(model, str(target))
    onnx.checker.check_model(str(target))  # by path: the checker reads the data file itself


def write_int8(source, target, external_data=False):
    """Writes `source`'s model with int8 weights to `target`; `external_data`: its tensors go to
    a file beside `target` (`target`.data), as `source`'s are beside it."""
    source, target = Path(source), Path(target)
    model = onnx.load(str(source), load_external_data=False)
    tensors = _Tensors(source.parent)
    quantiser = _Quantiser(tensors)
    for scopes in _scopes(model.graph):  # lazily: each graph's subgraphs as rewritten
        quantiser.graph(scopes)
    _drop_unread_initializers(model.graph)
    if external_data:
        _write_apart(model, target, tensors)
    else:
        onnx.save(model, str(target))
