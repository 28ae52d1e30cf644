"""int8 weights for an exported ONNX model (ONNX Runtime's dynamic quantisation); it needs no
TensorFlow, so that benchmarks can quantise a graph beside a TensorFlow-free runtime."""

from onnxruntime.quantization import QuantType, quantize_dynamic


def write_int8(source, target, external_data=False):
    """Quantises the weights of every MatMul, inside loops too, to int8 (activations are
    quantised on the fly, per tensor); `external_data`: the tensors go to a file beside
    `target`, as `source`'s are beside it."""
    quantize_dynamic(source, target, weight_type=QuantType.QInt8,
                     extra_options={"EnableSubgraph": True},
                     use_external_data_format=external_data)  # fmt: skip


def write_int8_apart(source, target):
    """`write_int8` of a model whose tensors are in a file beside it, in a process of its own:
    one that starts without the memory an export's conversion left behind (a 600M-parameter
    model's quantisation outgrew 24 GiB in the exporting process)."""
    import subprocess
    import sys

    code = "import sys; from export.int8 import write_int8; write_int8(*sys.argv[1:], True)"
    subprocess.run([sys.executable, "-c", code, str(source), str(target)], check=True)
