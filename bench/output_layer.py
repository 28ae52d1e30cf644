"""What the output layer costs a sentence at batch 1, beside the sentence's whole time.

    python bench/output_layer.py NAME=EXPORT [NAME=EXPORT ...] [--sentences 64] [--rounds 3]

At batch 1 a greedy step multiplies one row by the output layer's kernel and a beam-5 step
five rows; either reads the whole kernel. For each export (each with its recipe's search:
greedy for a greedy export, else beam 5), in ONNX Runtime, float32 and int8, the cases taking
turns each round:
- its translations of the first test_2016_flickr sentences, one at a time (ms a sentence);
- the product alone, its own kernel (the decoding loop's initializer of shape [width, target
  vocabulary]) as a one-node graph, float32 and quantised as the int8 export is
  (`export.int8.write_int8`), with the search's rows, less an empty graph's call (µs a step);
- the steps a sentence (the greedy or beam translation's pieces and its end).
It prints each export's share of a sentence spent in the output layer, and each export's
sentences/s over the first's, as measured and with the output layer free: medians of the
rounds' ratios.
"""

import argparse
import gzip
import logging
import statistics
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import onnx
import onnxruntime
from onnx import helper, numpy_helper

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from export.int8 import write_int8  # noqa: E402
from export.runtime import OnnxTranslator, session_options  # noqa: E402

TEST_SOURCE = Path(__file__).resolve().parents[1] / "data/multi30k/test_2016_flickr.de.gz"


def output_kernel(model_path, vocabulary_size):
    """The float kernel [width, vocabulary] of the decoding loop's output layer."""

    def graphs(graph):
        yield graph
        for node in graph.node:
            for attribute in node.attribute:
                if attribute.type == onnx.AttributeProto.GRAPH:
                    yield from graphs(attribute.g)

    found = [numpy_helper.to_array(tensor) for graph in graphs(onnx.load(model_path).graph)
             for tensor in graph.initializer
             if len(tensor.dims) == 2 and tensor.dims[1] == vocabulary_size]  # fmt: skip
    if len(found) != 1:
        raise SystemExit(f"{model_path}: {len(found)} kernels of [width, {vocabulary_size}]")
    return found[0]


def one_node_session(path, rows, kernel=None, int8=False):
    """A session of one node and its feed of `rows` rows: `kernel`'s product (int8: quantised
    as the int8 export is), or without one an Identity, what a call costs whatever its graph."""
    width = 16 if kernel is None else kernel.shape[0]
    out_width = width if kernel is None else kernel.shape[1]
    source = helper.make_tensor_value_info("x", onnx.TensorProto.FLOAT, [rows, width])
    target = helper.make_tensor_value_info("y", onnx.TensorProto.FLOAT, [rows, out_width])
    if kernel is None:
        node, weights = helper.make_node("Identity", ["x"], ["y"]), []
    else:
        node, weights = (
            helper.make_node("MatMul", ["x", "w"], ["y"]),
            [numpy_helper.from_array(kernel, "w")],
        )
    graph = helper.make_graph([node], "one_node", [source], [target], weights)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=8)
    onnx.save(model, path)
    if int8:
        write_int8(path, path)
    session = onnxruntime.InferenceSession(str(path), session_options())
    return session, {"x": np.random.default_rng(0).standard_normal((rows, width), np.float32)}


def microseconds_a_call(session, feed, calls):
    started = time.perf_counter()
    for _ in range(calls):
        session.run(None, feed)
    return (time.perf_counter() - started) / calls * 1e6


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("exports", nargs="+", help="NAME=EXPORT (OUT or OUT/onnx); the first "
                        "is the one the others' ratios are to")  # fmt: skip
    parser.add_argument("--sentences", type=int, default=64)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--calls", type=int, default=2000, help="product calls a round")
    args = parser.parse_args()

    with gzip.open(TEST_SOURCE, "rt", encoding="utf-8") as lines:
        sentences = [line.strip() for line in lines][: args.sentences]
    systems, products = {}, {}
    folder = Path(tempfile.mkdtemp(prefix="output_layer_"))
    logging.getLogger().setLevel(logging.ERROR)  # quantize_dynamic's advice, at every call
    for entry in args.exports:
        name, _, path = entry.partition("=")
        for int8 in (False, True):
            translator = OnnxTranslator(path, batch_size=1, int8=int8)
            metadata = translator.metadata
            beam = 1 if metadata.get("search") == "greedy" else 5
            systems[(name, int8)] = (translator, beam)
        kernel = output_kernel(translator.directory / metadata["model"],
                               translator.target.get_piece_size())  # fmt: skip
        for int8 in (False, True):
            path = folder / f"{name}_{int8}.onnx"
            products[(name, int8)] = one_node_session(path, beam, kernel, int8)
    empty = one_node_session(folder / "empty.onnx", 1)

    seconds = {system: [] for system in systems}
    net = {system: [] for system in systems}
    for _ in range(args.rounds):
        for system, (translator, beam) in systems.items():  # the cases take turns
            started = time.perf_counter()
            for sentence in sentences:
                translator.translate([sentence], beam_size=beam)
            seconds[system].append((time.perf_counter() - started) / len(sentences))
            call = microseconds_a_call(*empty, args.calls)
            net[system].append(microseconds_a_call(*products[system], args.calls) - call)

    first = args.exports[0].partition("=")[0]
    print("| export | weights | search | ms a sentence | steps | output layer, ms (share) |"
          " ratio to the first | with the output layer free |")  # fmt: skip
    print("|---|---|---|---:|---:|---:|---:|---:|")
    for (name, int8), (translator, beam) in systems.items():
        outputs = translator.translate(sentences, beam_size=beam)
        steps = statistics.mean(len(translator.target.encode(text)) + 1 for text in outputs)
        # Each round's milliseconds a sentence: in all, and in the output layer.
        rounds = [(1e3 * taken, steps * us / 1e3)
                  for taken, us in zip(seconds[(name, int8)], net[(name, int8)])]  # fmt: skip
        firsts = [1e3 * taken for taken in seconds[(first, int8)]]
        sentence_ms = statistics.median(ms for ms, _ in rounds)
        layer_ms = statistics.median(layer for _, layer in rounds)
        ratio = statistics.median(base / ms for base, (ms, _) in zip(firsts, rounds))
        free = "-" if name == first else "{:.2f}".format(statistics.median(
            base / (ms - layer) for base, (ms, layer) in zip(firsts, rounds)))  # fmt: skip
        weights = "int8" if int8 else "float32"
        search = "greedy" if beam == 1 else f"beam {beam}"
        print(
            f"| {name} | {weights} | {search} | {sentence_ms:.3f} | {steps:.1f} | "
            f"{layer_ms:.3f} ({layer_ms / sentence_ms:.0%}) | {ratio:.2f} | {free} |"
        )


if __name__ == "__main__":
    main()
