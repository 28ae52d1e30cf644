"""The matrix products of a decoder step, in each runtime's kernels, at a beam's few rows (M):
OPUS-MT base's output projection ([512, 58,101], 119 MB in float32), and the 48 products of
its six decoder layers (per layer: self-attention's query, key, value and output and
cross-attention's query and output, [512, 512]; the feed-forward network's [512, 2048] and
[2048, 512]), each with its own weights, as a step meets them: read from beyond the core's
caches, not reused hot.

    python bench/matmul_kernels.py [--rows 4,128] [--rounds 5] [--threads 1]

TensorFlow's MatMul on a variable (as a SavedModel runs it: oneDNN where TensorFlow enables
it), the same in bfloat16 (`--saved-model-precision bfloat16`), the same compiled by XLA
(`jit_compile=True`), the product by the weights stored [out, in] (an einsum, which oneDNN
runs without reordering them), and ONNX Runtime's MatMul on initializers (as the ONNX export
runs it: packed once, at load). Each figure is the median over `--rounds` rounds (of 10
projections; of one step's 48 layer products), the kernels taking turns.
"""

import argparse
import os
import statistics
import time

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")

import numpy as np  # noqa: E402
import onnx  # noqa: E402
import onnxruntime  # noqa: E402
import tensorflow as tf  # noqa: E402
from common import machine  # noqa: E402

DEPTH, VOCABULARY, FFN, LAYERS = 512, 58_101, 2048, 6
PROJECTIONS = 10  # a projection timing's products
LAYER_SHAPES = [(DEPTH, DEPTH)] * 6 + [(DEPTH, FFN), (FFN, DEPTH)]  # one layer's [in, out]


def tensorflow_kernels(weights):
    """{name: f(inputs) -> summed products}: inputs[i] times weights[i], for every i."""
    stored = [tf.Variable(w) for w in weights]
    transposed = [tf.Variable(w.T.copy()) for w in weights]
    half = [tf.Variable(tf.cast(w, tf.bfloat16)) for w in weights]

    def products(product):
        return lambda inputs: tf.add_n([tf.reduce_sum(product(x, i)) for i, x in enumerate(inputs)])

    float32 = products(lambda x, i: tf.matmul(x, stored[i]))
    return {
        "TensorFlow float32": tf.function(float32),
        "TensorFlow float32, [out, in]": tf.function(
            products(lambda x, i: tf.einsum("mk,nk->mn", x, transposed[i]))
        ),
        "TensorFlow bfloat16": tf.function(
            products(lambda x, i: tf.cast(tf.matmul(tf.cast(x, tf.bfloat16), half[i]), tf.float32))
        ),
        "TensorFlow float32, XLA": tf.function(float32, jit_compile=True),
    }


def onnx_kernel(weights, threads):
    helper = onnx.helper
    inputs = [helper.make_tensor_value_info(f"x{i}", onnx.TensorProto.FLOAT, ["rows", w.shape[0]])
              for i, w in enumerate(weights)]  # fmt: skip
    nodes = [helper.make_node("MatMul", [f"x{i}", f"w{i}"], [f"y{i}"]) for i in range(len(weights))]
    nodes += [helper.make_node("ReduceSum", [f"y{i}"], [f"s{i}"], keepdims=0)
              for i in range(len(weights))]  # fmt: skip
    nodes.append(helper.make_node("Sum", [f"s{i}" for i in range(len(weights))], ["total"]))
    outputs = [helper.make_tensor_value_info("total", onnx.TensorProto.FLOAT, None)]
    initializers = [onnx.numpy_helper.from_array(w, f"w{i}") for i, w in enumerate(weights)]
    graph = helper.make_graph(nodes, "products", inputs, outputs, initializers)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=8)
    options = onnxruntime.SessionOptions()
    options.intra_op_num_threads = threads
    session = onnxruntime.InferenceSession(model.SerializeToString(), options)
    names = [f"x{i}" for i in range(len(weights))]
    return {"ONNX Runtime float32": lambda inputs: session.run(None, dict(zip(names, inputs)))[0]}


def median_times(kernels, inputs, rounds, repeats):
    """{name: median seconds of one call}, the kernels taking turns each round. TensorFlow's
    kernels are given tensors, ONNX Runtime's arrays: neither times a conversion."""
    tensors = [tf.constant(x) for x in inputs]
    given = {name: inputs if name.startswith("ONNX") else tensors for name in kernels}
    times = {name: [] for name in kernels}
    for name, run in kernels.items():
        np.asarray(run(given[name]))  # warm-up (XLA compiles here)
    for _ in range(rounds):
        for name, run in kernels.items():
            start = time.perf_counter()
            for _ in range(repeats):
                np.asarray(run(given[name]))
            times[name].append((time.perf_counter() - start) / repeats)
    return {name: statistics.median(values) for name, values in times.items()}


def report(title, times):
    onnx_time = times["ONNX Runtime float32"]
    print(f"\n{title}:")
    for name, seconds in times.items():
        print(f"  {name:30} {seconds * 1000:8.3f} ms  {onnx_time / seconds:5.2f}x ONNX Runtime")


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "--rows", type=lambda text: [int(n) for n in text.split(",")], default=[4, 128]
    )
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--threads", type=int, default=1)
    args = parser.parse_args()
    tf.config.threading.set_intra_op_parallelism_threads(args.threads)
    tf.config.threading.set_inter_op_parallelism_threads(1)
    rng = np.random.default_rng(0)

    def draw(shape):
        return (rng.standard_normal(shape) * 0.02).astype(np.float32)

    projection = [draw((DEPTH, VOCABULARY))]
    layers = [draw(shape) for _ in range(LAYERS) for shape in LAYER_SHAPES]
    suites = {
        "projection": (projection, PROJECTIONS),
        f"{len(layers)} layer products": (layers, 1),
    }
    print(f"{machine(model=True)}; {args.threads} thread(s), median of {args.rounds} rounds")
    for title, (weights, repeats) in suites.items():
        kernels = {**tensorflow_kernels(weights), **onnx_kernel(weights, args.threads)}
        for rows in args.rows:
            inputs = [rng.standard_normal((rows, w.shape[0])).astype(np.float32) for w in weights]
            times = median_times(kernels, inputs, args.rounds, repeats)
            report(f"{title}, M = {rows}", times)


if __name__ == "__main__":
    main()
