"""export/int8.py: ONNX Runtime's dynamic quantisation, computed the same way, with the
tensors apart from the model or in it."""

import json
import shutil

import numpy as np
import onnx
import pytest
from onnxruntime.quantization import QuantType, quantize_dynamic

from export.int8 import EXTERNAL_TENSOR_BYTES, TABLE_RANGE, WEIGHT_RANGE, quantised, write_int8
from export.onnx_model import INT8_MODEL_FILE, MODEL_FILE
from export.onnx_rewrites import subgraphs
from export.runtime import OnnxTranslator
from export.signature import METADATA_FILE


def test_weights_are_symmetric_int8_and_tables_asymmetric_uint8():
    values = np.random.default_rng(3).normal(size=(40, 7)).astype(np.float32) + 0.5
    weights, scale, zero_point = quantised(values, *WEIGHT_RANGE)
    assert weights.dtype == np.int8 and zero_point == 0
    assert np.abs(weights).max() == 127 and scale == np.float32(np.abs(values).max() / 127)
    assert np.abs(weights * scale - values).max() <= scale / 2 * (1 + 1e-6)
    table, scale, zero_point = quantised(values, *TABLE_RANGE)
    assert table.dtype == np.uint8 and table.min() == 0 and table.max() == 255
    assert np.abs((table.astype(np.float32) - zero_point) * scale - values).max() <= scale * 0.51
    # Zero is in every range, so that padding stays exactly zero; an all-zero tensor has scale 1.
    assert quantised(np.full(3, 2.0, np.float32), *TABLE_RANGE)[2] == 0
    assert quantised(np.zeros(3, np.float32), *WEIGHT_RANGE)[1:] == (1, 0)


@pytest.fixture(scope="module", params=["exported_workdir", "exported_transformer_workdir"])
def quantised_both_ways(request, tmp_path_factory):
    """A smoke model's float export (the recurrent one: its cells' products are Gemms; the
    Transformer), quantised by quantize_dynamic, by `write_int8` with the tensors in the
    model, and by `write_int8` with the tensors of the float model and its int8 model in files
    beside them."""
    exported = request.getfixturevalue(request.param) / "export" / "onnx"
    root = tmp_path_factory.mktemp("int8")
    directories = {}
    for name in ("onnxruntime", "inline", "apart"):
        directories[name] = root / name / "onnx"
        shutil.copytree(exported, directories[name])
    onnxruntime = directories["onnxruntime"]
    quantize_dynamic(onnxruntime / MODEL_FILE, onnxruntime / INT8_MODEL_FILE,
                     weight_type=QuantType.QInt8,
                     extra_options={"EnableSubgraph": True})  # fmt: skip
    write_int8(directories["inline"] / MODEL_FILE, directories["inline"] / INT8_MODEL_FILE)
    apart = directories["apart"]
    onnx.save_model(onnx.load(str(apart / MODEL_FILE)), str(apart / MODEL_FILE),
                    save_as_external_data=True, location="model.onnx.data",
                    size_threshold=1024)  # fmt: skip
    write_int8(apart / MODEL_FILE, apart / INT8_MODEL_FILE, external_data=True)
    metadata = json.loads((apart / METADATA_FILE).read_text())
    (apart / METADATA_FILE).write_text(json.dumps({**metadata, "external_data": True}))
    return directories


@pytest.mark.parametrize("value_range", [WEIGHT_RANGE, TABLE_RANGE])
def test_a_table_quantised_a_block_of_rows_at_a_time_is_quantised_as_a_whole(
    monkeypatch, value_range
):
    """Blocks of a few rows (a transposed view's too) give what one block gives: the scale
    and zero point come from the whole table, each value is rounded alone."""
    from export import int8

    values = np.random.default_rng(4).normal(size=(301, 17)).astype(np.float32) - 0.3
    for table in (values, values.T, values[0], values[0, 0]):
        whole = quantised(table, *value_range)
        monkeypatch.setattr(int8, "BLOCK_BYTES", 3 * 17 * 4)
        blocks = quantised(table, *value_range)
        monkeypatch.undo()
        assert blocks[0].dtype == whole[0].dtype and blocks[1:] == whole[1:]
        np.testing.assert_array_equal(blocks[0], whole[0])


def test_a_strided_array_is_written_outside_a_block_at_a_time_as_its_bytes(tmp_path, monkeypatch):
    from export import onnx_rewrites

    monkeypatch.setattr(onnx_rewrites, "BLOCK_BYTES", 40)
    table = np.arange(6 * 11, dtype=np.float32).reshape(6, 11)
    tensor = onnx_rewrites.outside_initializer(table.T, "transposed", tmp_path / "tensors")
    np.testing.assert_array_equal(onnx.numpy_helper.to_array(tensor, str(tmp_path)), table.T)
    assert (tmp_path / "tensors").read_bytes() == np.ascontiguousarray(table.T).tobytes()


def test_the_int8_model_computes_what_onnxruntimes_quantiser_makes(quantised_both_ways):
    source_ids = np.random.default_rng(0).integers(4, 100, size=(6, 11)).astype(np.int32)
    results = {
        name: OnnxTranslator(directory.parent, int8=True).search(source_ids, beam_size=3)
        for name, directory in quantised_both_ways.items()
    }
    reference = results.pop("onnxruntime")
    float_result = OnnxTranslator(quantised_both_ways["inline"].parent).search(source_ids)
    assert not np.array_equal(reference["scores"], float_result["scores"])  # it is quantised
    for result in results.values():
        for key in reference:
            np.testing.assert_array_equal(result[key], reference[key], err_msg=key)


def test_an_int8_model_apart_keeps_its_weights_in_its_data_file(quantised_both_ways):
    apart = quantised_both_ways["apart"]
    model = onnx.load(str(apart / INT8_MODEL_FILE), load_external_data=False)
    tensors = [t for graph in subgraphs(model.graph) for t in graph.initializer]
    stored = [t for t in tensors if t.data_location == onnx.TensorProto.EXTERNAL]
    assert onnx.TensorProto.UINT8 in {t.data_type for t in stored}  # the embedding tables
    assert all(len(t.raw_data) < EXTERNAL_TENSOR_BYTES for t in tensors if t not in stored)
    data = apart / (INT8_MODEL_FILE + ".data")
    lengths = sum(int(dict((e.key, e.value) for e in t.external_data)["length"]) for t in stored)
    assert data.stat().st_size == lengths
    # A quarter of the float weights it was made from, more or less.
    assert data.stat().st_size < (apart / "model.onnx.data").stat().st_size / 3
