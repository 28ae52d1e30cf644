"""Where a SavedModel's search spends its time in TF Serving's runtime: one `beam_search`
request through the session loader, traced (`RunOptions(trace_level=FULL_TRACE)`), broken
down per decoder step.

    python bench/serving_profile.py SAVED_MODEL_DIR [SAVED_MODEL_DIR ...] [--batch 1] [--beam 4]
        [--source-tokens 20] [--target-tokens 30] [--threads 1] [--rounds 5] [--top 15]

The source is `--source-tokens` random ids of ordinary tokens; max_length is
`--target-tokens`, which the export's min_length should equal (`bench/pretrained.py speed`'s
exports do), so that every hypothesis runs the same number of steps whatever the weights.
Prints the request's wall time untraced (the best of `--rounds`; given several SavedModels, for
instance one exported before a change and one after, they take turns and each is given as a
ratio to the first's), then, for each, the traced run's kernels: the ops
executed per step, the time inside kernels against the wall time (the rest is the
executor's dispatch between them), and the op types and nodes that take the most kernel
time. With `--threads 1` (and one inter-op thread) kernels run one after another, so kernel
time plus dispatch is the wall time.
"""

import argparse
import collections
import os
import time

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")

import numpy as np  # noqa: E402
import tensorflow as tf  # noqa: E402
import tensorflow_text  # noqa: E402, F401  (the SavedModel's tokenizer ops)
from common import machine  # noqa: E402

from export.signature import BEAM_SEARCH, SOURCE_IDS  # noqa: E402


def load(saved_model, threads):
    config = tf.compat.v1.ConfigProto(
        intra_op_parallelism_threads=threads, inter_op_parallelism_threads=1
    )
    session = tf.compat.v1.Session(graph=tf.Graph(), config=config)
    with session.graph.as_default():
        meta = tf.compat.v1.saved_model.loader.load(session, ["serve"], str(saved_model))
    return session, meta.signature_def[BEAM_SEARCH]


def kernel_stats(run_metadata):
    """[(op type, node name, kernel microseconds)] of every op the run executed."""
    ops = []
    for device in run_metadata.step_stats.dev_stats:
        for node in device.node_stats:
            if node.node_name in ("_SOURCE", "_SINK"):
                continue
            # timeline_label: "name = Op(inputs)"; the op type is the word before "(".
            label = node.timeline_label
            op = label.split(" = ", 1)[1].split("(", 1)[0] if " = " in label else node.node_name
            ops.append((op, node.node_name, node.op_end_rel_micros - node.op_start_rel_micros))
    return ops


def request(saved_model, args):
    """(run, traced run) of one `beam_search` request to `saved_model`: each returns
    (seconds, the first output length, run metadata or None)."""
    session, signature = load(saved_model, args.threads)
    inputs = {name: info.name for name, info in signature.inputs.items()}
    rng = np.random.default_rng(0)
    source = rng.integers(10, 2000, size=(1, args.source_tokens), dtype=np.int32)
    feeds = {inputs[SOURCE_IDS]: np.repeat(source, args.batch, 0),
             inputs["beam_size"]: args.beam, inputs["max_length"]: args.target_tokens}  # fmt: skip
    lengths = signature.outputs["lengths"].name

    def run(traced=False):
        options, metadata = None, None
        if traced:
            options = tf.compat.v1.RunOptions(trace_level=tf.compat.v1.RunOptions.FULL_TRACE)
            metadata = tf.compat.v1.RunMetadata()
        start = time.perf_counter()
        out = session.run(lengths, feeds, options=options, run_metadata=metadata)
        return time.perf_counter() - start, int(out.ravel()[0]), metadata

    run()  # warm-up
    return run


def profile(name, run, wall, args):
    traced_wall, length, metadata = run(traced=True)
    ops = kernel_stats(metadata)
    steps = args.target_tokens
    kernel = sum(micros for _, _, micros in ops) / 1e6
    print(f"\n{name}: batch {args.batch}, beam {args.beam}, {args.source_tokens} source "
          f"tokens, {steps} target tokens, {args.threads} intra-op thread(s); {length} tokens "
          "out")  # fmt: skip
    print(f"wall {wall * 1000:.1f} ms untraced (best of {args.rounds}); traced "
          f"{traced_wall * 1000:.1f} ms")  # fmt: skip
    print(f"ops executed {len(ops)}: {len(ops) / steps:.0f} a step; kernels {kernel * 1000:.1f} "
          f"ms = {kernel / traced_wall:.0%} of the traced wall; dispatch and the rest "
          f"{(traced_wall - kernel) * 1000:.1f} ms, {(traced_wall - kernel) / len(ops) * 1e6:.1f}"
          " us an op")  # fmt: skip
    by_type = collections.defaultdict(lambda: [0, 0])
    by_node = collections.defaultdict(lambda: [0, 0])
    for op, node, micros in ops:
        by_type[op][0] += 1
        by_type[op][1] += micros
        by_node[(op, node)][0] += 1
        by_node[(op, node)][1] += micros
    print(f"\n{'op type':28} {'count':>7} {'a step':>7} {'kernel ms':>10} {'share':>6}")
    for op, (count, micros) in sorted(by_type.items(), key=lambda kv: -kv[1][1])[: args.top]:
        print(f"{op:28} {count:7} {count / steps:7.1f} {micros / 1000:10.1f} "
              f"{micros / 1e6 / kernel:6.1%}")  # fmt: skip
    print(f"\n{'node':60} {'count':>6} {'kernel ms':>10}")
    for (op, node), (count, micros) in sorted(by_node.items(), key=lambda kv: -kv[1][1])[
        : args.top
    ]:
        print(f"{(op + ' ' + node)[-60:]:60} {count:6} {micros / 1000:10.1f}")


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("saved_models", nargs="+", metavar="saved_model")
    parser.add_argument("--batch", type=int, default=1)
    parser.add_argument("--beam", type=int, default=4)
    parser.add_argument("--source-tokens", type=int, default=20)
    parser.add_argument("--target-tokens", type=int, default=30)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--top", type=int, default=15)
    args = parser.parse_args()
    runs = {name: request(name, args) for name in args.saved_models}
    walls = {name: [] for name in runs}
    for _ in range(args.rounds):
        for name, run in runs.items():
            walls[name].append(run()[0])
    best = {name: min(times) for name, times in walls.items()}
    first = best[args.saved_models[0]]
    print(f"untraced wall, best of {args.rounds} rounds taking turns, {machine()}:")
    for name, wall in best.items():
        print(f"  {wall * 1000:8.1f} ms  {first / wall:5.2f}x the first  {name}")
    for name, run in runs.items():
        profile(name, run, best[name], args)


if __name__ == "__main__":
    main()
