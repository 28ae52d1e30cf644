"""The REST server (`python -m export.serve`) under load, beside the offline `OnnxTranslator`.

    python bench/serving.py --export runs/default/export [--requests 150] [--rounds 2]
        [--clients 1 4 16 64] [--beams 1 5] [--source FILE] [--compare-flags FLAGS]
        [-- SERVER FLAGS...]

For greedy and beam 5 (the server started with `--beam-size`), in rounds that alternate the
sides: the offline translator at batch 64 and at batch 1 (the reference; at batch 64 it
sorts all the sentences by length first), the same sentences in the order the clients send
them in batches of 64 run side by side as the server's batch threads run them (what
batches of the sentences that arrive together cost), one request of one
sentence at a time on an idle server, then 1, 4, 16 and 64 concurrent clients over loopback,
each sending requests of 1 to 8 test sentences (`serving_default`, row format) on a
keep-alive connection until `--requests` have been answered. Reports sentences/s, latency
percentiles and errors, and checks every response against the offline translations of the
same sentences (a differing translation counts as an error). With `--compare-flags`, a second
server started with those flags added takes turns with the first at each level. The CPU
time of the server and of this process (the clients, or the offline translator) a sentence
shows where the CPUs went. Ends with
the ratios the server is held to: served sentences/s at 16 and more clients over the
offline batch-64 rate, and an idle one-sentence request's median latency over the offline
batch-1 time per sentence.
"""

import argparse
import functools
import gzip
import http.client
import json
import os
import statistics
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numpy as np

PROJECT_ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(PROJECT_ROOT))

from common import machine  # noqa: E402

from export.batching import BatchingParameters  # noqa: E402
from export.runtime import OnnxTranslator  # noqa: E402

DEFAULT_SOURCE = PROJECT_ROOT / "data" / "multi30k" / "test_2016_flickr.de.gz"
IDLE_REQUESTS = 50  # one-sentence requests on an idle server, one at a time
MODEL_NAME = "translator"
# The offline reference that batches sentences as they arrive, not length-sorted as a whole.
ARRIVAL_ORDER = "offline, batches of 64 in arrival order, side by side"


def read_lines(path):
    opener = gzip.open if str(path).endswith(".gz") else open
    with opener(path, "rt", encoding="utf-8") as lines:
        return [line.rstrip("\n") for line in lines]


def make_requests(sentences, count, seed=0):
    """`count` requests of 1 to 8 sentences, drawn in turn from a shuffled `sentences`."""
    rng = np.random.default_rng(seed)
    order = [sentences[i] for i in rng.permutation(len(sentences))]
    requests, at = [], 0
    for size in rng.integers(1, 9, count):
        requests.append([order[(at + i) % len(order)] for i in range(size)])
        at += size
    return requests


class Server:
    def __init__(self, export, port, beam_size, flags):
        self.port = port
        self.process = subprocess.Popen(
            [sys.executable, "-m", "export.serve", str(export), "--port", str(port),
             "--beam-size", str(beam_size), *flags],
            cwd=PROJECT_ROOT, stdout=subprocess.DEVNULL, stderr=subprocess.STDOUT,
        )  # fmt: skip
        deadline = time.monotonic() + 300
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                sys.exit("the server stopped; run it alone to see why")
            try:
                connection = http.client.HTTPConnection("127.0.0.1", port, timeout=5)
                connection.request("GET", f"/v1/models/{MODEL_NAME}")
                if connection.getresponse().status == 200:
                    return
            except OSError:
                time.sleep(0.2)
        sys.exit("the server did not answer within 300 s")

    def stop(self):
        self.process.terminate()
        self.process.wait(60)


def cpu_seconds(pid=None):
    """CPU time (user + system) used so far by process `pid`, or by this one."""
    if pid is None:
        times = os.times()
        return times.user + times.system
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def drive(port, requests, clients, expected):
    """`requests` sent by `clients` threads, each on its own connection: (sentences/s,
    latencies in seconds, errors)."""
    pending = iter(list(enumerate(requests)))
    latencies, errors = [None] * len(requests), []

    def client():
        connection = http.client.HTTPConnection("127.0.0.1", port, timeout=300)
        for index, sentences in pending:  # the iterator is shared: each request once
            body = json.dumps({"instances": sentences})
            started = time.perf_counter()
            try:
                connection.request("POST", f"/v1/models/{MODEL_NAME}:predict", body,
                                   {"Content-Type": "application/json"})  # fmt: skip
                response = connection.getresponse()
                answer = json.loads(response.read())
            except (OSError, http.client.HTTPException, ValueError) as error:
                errors.append(f"request {index}: {error}")
                connection = http.client.HTTPConnection("127.0.0.1", port, timeout=300)
                continue
            latencies[index] = time.perf_counter() - started
            if response.status != 200:
                errors.append(f"request {index}: {response.status} {answer}")
            elif [p["translations"] for p in answer["predictions"]] != [
                expected[s] for s in sentences
            ]:
                errors.append(f"request {index}: a translation differs from the offline one")
        connection.close()

    started = time.perf_counter()
    with ThreadPoolExecutor(clients) as pool:
        for future in [pool.submit(client) for _ in range(clients)]:
            future.result()
    seconds = time.perf_counter() - started
    sentences = sum(len(r) for r in requests)
    return sentences / seconds, [t for t in latencies if t is not None], errors


def percentiles(latencies):
    return {f"p{q}": float(np.percentile(latencies, q)) * 1000 for q in (50, 95, 99)}


def main():
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--export", type=Path, required=True, help="an export (OUT or OUT/onnx)")
    parser.add_argument("--source", type=Path, default=DEFAULT_SOURCE)
    parser.add_argument("--requests", type=int, default=150, help="per concurrency level")
    parser.add_argument("--clients", type=int, nargs="+", default=[1, 4, 16, 64])
    parser.add_argument("--beams", type=int, nargs="+", default=[1, 5])
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--port", type=int, default=8601)
    parser.add_argument("--output", type=Path, help="also write the results as JSON")
    parser.add_argument("--compare-flags", metavar="FLAGS",
                        help="a second server with these flags added (one string), the two "
                        "taking turns at each level")  # fmt: skip
    parser.add_argument("server_flags", nargs="*", help="after --: more export.serve flags")
    args = parser.parse_args()

    sources = read_lines(args.source)
    requests = make_requests(sources, args.requests)
    used = sorted({s for r in requests for s in r})
    idle = [[s] for s in sources[:IDLE_REQUESTS]]
    print(f"# {machine(model=True)}; "
          f"export {args.export}; {len(requests)} requests, {sum(map(len, requests))} "
          f"sentences a level; server flags {args.server_flags or 'none'}", flush=True)  # fmt: skip
    offline = {64: OnnxTranslator(args.export, batch_size=64),
               1: OnnxTranslator(args.export, batch_size=1)}  # fmt: skip
    # The server's batches, as its default batch threads run them, each on its share of the
    # CPUs: a reference for what a batch composed of the sentences that arrive together costs.
    workers = BatchingParameters().num_batch_threads
    side_by_side = OnnxTranslator(args.export, batch_size=64, inter_threads=workers)
    arrival = [s for r in requests for s in r]
    arrival_batches = [arrival[i : i + 64] for i in range(0, len(arrival), 64)]
    results = []
    for beam in args.beams:
        expected = dict(zip(used, offline[64].translate(used, beam_size=beam)))
        idle_sentences = [s for (s,) in idle]
        expected.update(zip(idle_sentences, offline[64].translate(idle_sentences, beam_size=beam)))
        servers = {"": Server(args.export, args.port, beam, args.server_flags)}
        if args.compare_flags is not None:
            servers[f" ({args.compare_flags})"] = Server(
                args.export, args.port + 1, beam, [*args.server_flags, *args.compare_flags.split()]
            )
        rows = {}
        try:
            for round_index in range(args.rounds):
                started, cpu = time.perf_counter(), cpu_seconds()
                offline[64].translate(used, beam_size=beam)
                rate = len(used) / (time.perf_counter() - started)
                rows.setdefault(("offline, batch 64", None), []).append(
                    {"sentences_per_s": rate, "errors": 0,
                     "client_cpu_ms": (cpu_seconds() - cpu) * 1000 / len(used)})  # fmt: skip
                started = time.perf_counter()
                with ThreadPoolExecutor(workers) as pool:
                    list(pool.map(functools.partial(side_by_side.translate, beam_size=beam),
                                  arrival_batches))  # fmt: skip
                rows.setdefault((ARRIVAL_ORDER, None), []).append(
                    {"sentences_per_s": len(arrival) / (time.perf_counter() - started),
                     "errors": 0})  # fmt: skip
                times = []
                for (sentence,) in idle:
                    started = time.perf_counter()
                    offline[1].translate([sentence], beam_size=beam)
                    times.append(time.perf_counter() - started)
                rows.setdefault(("offline, batch 1", None), []).append(
                    {"sentences_per_s": len(times) / sum(times), "errors": 0,
                     **percentiles(times)})  # fmt: skip
                for side, clients, load in [("idle, 1 sentence", 1, idle)] + [
                    ("served", c, requests) for c in args.clients
                ]:
                    for suffix, server in servers.items():  # taking turns at each level
                        label = side + suffix
                        before = cpu_seconds(server.process.pid), cpu_seconds()
                        rate, latencies, errors = drive(server.port, load, clients, expected)
                        sentences = sum(map(len, load))
                        server_cpu, client_cpu = (
                            (after - began) * 1000 / sentences for after, began in
                            zip((cpu_seconds(server.process.pid), cpu_seconds()), before)
                        )  # fmt: skip
                        rows.setdefault((label, clients), []).append(
                            {"sentences_per_s": rate, "errors": len(errors),
                             "server_cpu_ms": server_cpu, "client_cpu_ms": client_cpu,
                             **percentiles(latencies)})  # fmt: skip
                        for error in errors[:3]:
                            print(f"  beam {beam}, {label} {clients}: {error}", flush=True)
                print(f"beam {beam}: round {round_index + 1} done", flush=True)
        finally:
            for server in servers.values():
                server.stop()
        report(beam, rows)
        results.append({"beam": beam, "rows": [
            {"side": label, "clients": clients, "rounds": measured}
            for (label, clients), measured in rows.items()]})  # fmt: skip
    if args.output:
        args.output.write_text(json.dumps(results, indent=1), encoding="utf-8")


def report(beam, rows):
    def median(label, clients, key):
        return statistics.median(r[key] for r in rows[(label, clients)])

    print(f"\n### beam {beam}\n")
    print("| side | clients | sentences/s (each round) | p50 ms | p95 ms | p99 ms | server CPU "
          "ms a sentence | this process's CPU ms a sentence | errors |")  # fmt: skip
    print("|---|---:|---|---:|---:|---:|---:|---:|---:|")
    for (label, clients), measured in rows.items():
        each = ", ".join(f"{r['sentences_per_s']:,.1f}" for r in measured)
        cells = [f"{statistics.median(r[q] for r in measured):,.1f}" if q in measured[0] else "-"
                 for q in ("p50", "p95", "p99", "server_cpu_ms", "client_cpu_ms")]  # fmt: skip
        errors = sum(r["errors"] for r in measured)
        print(f"| {label} | {clients or '-'} | {each} | {' | '.join(cells)} | {errors} |")
    offline_rate = median("offline, batch 64", None, "sentences_per_s")
    arrival_rate = median(ARRIVAL_ORDER, None, "sentences_per_s")
    for label, clients in rows:
        if label.startswith("served") and clients >= 16:
            rate = median(label, clients, "sentences_per_s")
            print(f"\n{label} at {clients} clients / offline batch 64: {rate / offline_rate:.2f}x "
                  f"(goal >= 0.8); / {ARRIVAL_ORDER}: {rate / arrival_rate:.2f}x")  # fmt: skip
    single = median("offline, batch 1", None, "p50")
    goal = 1.3 * single + 5
    for label, clients in rows:
        if label.startswith("idle"):
            idle = median(label, clients, "p50")
            print(f"{label} request, median: {idle:.1f} ms; offline batch 1: {single:.1f} ms "
                  f"({idle / single:.2f}x; goal <= 1.3x + 5 ms = {goal:.1f} ms)")  # fmt: skip


if __name__ == "__main__":
    main()
