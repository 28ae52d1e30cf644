"""The matrix product that dominates a decoder step, in each runtime's kernels: a beam's rows
(M) times the output projection of OPUS-MT's base shape ([512, 58,101], 119 MB in float32).

    python bench/matmul_kernels.py [--rows 4,128] [--rounds 5] [--threads 1]

TensorFlow's MatMul on a variable (as a SavedModel runs it: oneDNN where TensorFlow enables
it), the same in bfloat16 (`--saved-model-precision bfloat16`), the same compiled by XLA
(`jit_compile=True`), and ONNX Runtime's Gemm on an initializer (as the ONNX export runs it).
Each figure is the best over `--rounds` rounds of 10 products, the kernels taking turns.
"""

import argparse
import os
import time

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")

import numpy as np  # noqa: E402
import onnx  # noqa: E402
import onnxruntime  # noqa: E402
import tensorflow as tf  # noqa: E402
from common import machine  # noqa: E402

DEPTH, VOCABULARY = 512, 58_101
PRODUCTS = 10  # a timing's products


def tensorflow_kernels(kernel, threads):
    tf.config.threading.set_intra_op_parallelism_threads(threads)
    tf.config.threading.set_inter_op_parallelism_threads(1)
    weights = tf.Variable(kernel)
    half = tf.Variable(tf.cast(kernel, tf.bfloat16))

    def float32(x):
        return tf.matmul(x, weights)

    def bfloat16(x):
        return tf.cast(tf.matmul(tf.cast(x, tf.bfloat16), half), tf.float32)

    return {
        "TensorFlow float32": tf.function(float32),
        "TensorFlow bfloat16": tf.function(bfloat16),
        "TensorFlow float32, XLA": tf.function(float32, jit_compile=True),
    }


def onnx_kernel(kernel, threads):
    inputs = [onnx.helper.make_tensor_value_info("x", onnx.TensorProto.FLOAT, ["rows", DEPTH])]
    outputs = [onnx.helper.make_tensor_value_info("y", onnx.TensorProto.FLOAT, None)]
    graph = onnx.helper.make_graph(
        [onnx.helper.make_node("Gemm", ["x", "w"], ["y"])], "product", inputs, outputs,
        [onnx.numpy_helper.from_array(kernel, "w")],
    )  # fmt: skip
    model = onnx.helper.make_model(
        graph, opset_imports=[onnx.helper.make_opsetid("", 17)], ir_version=8
    )
    options = onnxruntime.SessionOptions()
    options.intra_op_num_threads = threads
    session = onnxruntime.InferenceSession(model.SerializeToString(), options)
    return {"ONNX Runtime float32": lambda x: session.run(None, {"x": x})[0]}


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "--rows", type=lambda text: [int(n) for n in text.split(",")], default=[4, 128]
    )
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--threads", type=int, default=1)
    args = parser.parse_args()
    kernel = (np.random.default_rng(0).standard_normal((DEPTH, VOCABULARY)) * 0.02).astype(
        np.float32
    )
    kernels = {**tensorflow_kernels(kernel, args.threads), **onnx_kernel(kernel, args.threads)}
    print(f"{machine(model=True)}; [M, {DEPTH}] x [{DEPTH}, {VOCABULARY}], {args.threads} "
          f"thread(s), best of {args.rounds} rounds of {PRODUCTS}")  # fmt: skip
    for rows in args.rows:
        x = np.random.default_rng(1).standard_normal((rows, DEPTH)).astype(np.float32)
        best = {}
        for run in kernels.values():
            np.asarray(run(x))  # warm-up (XLA compiles here)
        for _ in range(args.rounds):
            for name, run in kernels.items():
                start = time.perf_counter()
                for _ in range(PRODUCTS):
                    np.asarray(run(x))
                seconds = (time.perf_counter() - start) / PRODUCTS
                best[name] = min(best.get(name, float("inf")), seconds)
        onnx_time = best["ONNX Runtime float32"]
        print(f"\nM = {rows}:")
        for name, seconds in best.items():
            print(f"  {name:26} {seconds * 1000:7.2f} ms  {onnx_time / seconds:5.2f}x ONNX "
                  "Runtime")  # fmt: skip


if __name__ == "__main__":
    main()
