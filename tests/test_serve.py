"""`python -m export.serve`: TF Serving's REST API on ONNX Runtime, each server in a subprocess
on a free port, every answer held to the offline `OnnxTranslator`'s."""

import json
import random
import shutil
import signal
import socket
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request
from concurrent.futures import ThreadPoolExecutor

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from export import client, serve
from export.batching import BatchingParameters, BatchQueue, QueueClosed, QueueFull
from export.rest_api import RequestError, parse_predict
from export.runtime import OnnxTranslator
from export.signature import BEAM_SEARCH, SEARCH_OUTPUTS, SIGNATURES, WITH_PREFIX
from helpers import free_port, real_sentences
from pipeline.config import PROJECT_ROOT
from pipeline.core.errors import UserError
from pipeline.decoding.search_options import search_arguments

MODEL = "translator"


class Server:
    """`python -m export.serve BASE --port P ARGS...`, ready when it answers; as a context
    manager, stopped on the way out whatever happened inside."""

    def __init__(self, base, *args, model_name=MODEL):
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.model_url = f"{self.url}/v1/models/{model_name}"
        self.process = subprocess.Popen(
            [sys.executable, "-m", "export.serve", str(base), "--port", str(self.port),
             "--model-name", model_name, "--poll-seconds", "0.2", *map(str, args)],
            cwd=PROJECT_ROOT, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
        )  # fmt: skip
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                pytest.fail(f"the server stopped: {self.process.stdout.read()}")
            try:
                if get(self.model_url)[0] == 200:
                    return
            except OSError:
                time.sleep(0.2)
        self.process.kill()
        pytest.fail(f"the server did not answer within 120 s: {self.process.communicate()[0]}")

    def __enter__(self):
        return self

    def __exit__(self, *exc_info):
        self.stop()

    def metric(self, series):
        with urllib.request.urlopen(self.url + "/monitoring/prometheus/metrics") as answer:
            return float(_metric(answer.read().decode("utf-8"), series))

    def predict(self, body, version=None):
        where = self.model_url + (f"/versions/{version}" if version else "") + ":predict"
        return post(where, body)

    def stop(self):
        """(exit status, output) after SIGTERM; a server still running 60 s later is killed
        and the test fails, so that no server outlives its test."""
        if self.process.poll() is None:
            self.process.send_signal(signal.SIGTERM)
        try:
            self.process.wait(60)
        except subprocess.TimeoutExpired:
            self.process.kill()
            pytest.fail(f"SIGTERM did not stop the server: {self.process.communicate()[0]}")
        return self.process.returncode, self.process.stdout.read()


def post(url, body):
    """(status, JSON answer) of POST `body` (an object, sent as JSON, or bytes)."""
    data = body if isinstance(body, bytes) else json.dumps(body).encode("utf-8")
    request = urllib.request.Request(url, data=data, headers={"Content-Type": "application/json"})
    return _answer(request)


def get(url):
    return _answer(urllib.request.Request(url))


def _answer(request):
    try:
        with urllib.request.urlopen(request, timeout=120) as response:
            return response.status, json.loads(response.read())
    except urllib.error.HTTPError as error:
        return error.code, json.loads(error.read())


@pytest.fixture(scope="module")
def export_dir(exported_workdir):
    return exported_workdir / "export" / "onnx"


@pytest.fixture(scope="module")
def offline(export_dir):
    return OnnxTranslator(export_dir)


@pytest.fixture(scope="module")
def server(export_dir):
    with Server(export_dir) as running:
        yield running


@pytest.fixture(scope="module")
def sentences():
    return real_sentences(40)


def offline_text(offline, sentences, prefixes=None, **options):
    ids = offline.translate_ids(offline.encode(sentences), offline.encode_prefixes(prefixes),
                                **options)  # fmt: skip
    return [offline.target.decode(best[0][0]) for best in ids], [best[0][1] for best in ids]


def test_serving_default_in_every_request_shape_gives_the_offline_translations(
    server, offline, sentences
):
    texts, scores = offline_text(offline, sentences[:5])
    rows = [{"translations": t, "scores": s} for t, s in zip(texts, scores)]
    columns = {"translations": texts, "scores": scores}
    for body, key, expected in [
        ({"instances": sentences[:5]}, "predictions", rows),
        ({"instances": [{"sentences": s} for s in sentences[:5]]}, "predictions", rows),
        ({"signature_name": "serving_default", "inputs": sentences[:5]}, "outputs", columns),
        ({"inputs": {"sentences": sentences[:5]}}, "outputs", columns),
    ]:
        assert server.predict(body) == (200, {key: expected}), body
    assert server.predict({"instances": ["", sentences[0]]})[1]["predictions"][0] == {
        "translations": "", "scores": 0.0}  # fmt: skip
    assert server.predict({"instances": []}) == (200, {"predictions": []})
    assert server.predict({"instances": sentences[:2]}, version=1)[0] == 200


def test_translate_with_prefix_gives_the_offline_translations(server, offline, sentences):
    prefixes = ["A", "", "The man"]
    texts, scores = offline_text(offline, sentences[:3], prefixes)
    assert all(t.startswith(p) for t, p in zip(texts, prefixes))
    instances = [{"sentences": s, "target_prefix": p} for s, p in zip(sentences, prefixes)]
    status, answer = server.predict({"signature_name": WITH_PREFIX, "instances": instances})
    assert status == 200
    assert answer["predictions"] == [{"translations": t, "scores": s}
                                     for t, s in zip(texts, scores)]  # fmt: skip
    status, answer = server.predict({"signature_name": WITH_PREFIX, "inputs": {
        "sentences": sentences[:3], "target_prefix": prefixes}})  # fmt: skip
    assert (status, answer["outputs"]["translations"]) == (200, texts)


def test_beam_search_gives_the_offline_search_outputs(server, offline, sentences):
    source = offline._padded(offline.encode(sentences[:3]))
    options = {"beam_size": 3, "n_best": 2, "length_penalty": 0.5, "max_length": 12}
    expected = {k: v.tolist() for k, v in offline.search(source, **options).items()}
    inputs = {"source_ids": source.tolist(), **options}
    status, answer = server.predict({"signature_name": BEAM_SEARCH, "inputs": inputs})
    assert status == 200 and set(answer["outputs"]) == set(SEARCH_OUTPUTS)
    assert answer["outputs"] == expected
    assert np.asarray(answer["outputs"]["ids"]).shape[:2] == (3, 2)
    # The row format: one object a sentence, the options at their exported defaults.
    expected = {k: v.tolist() for k, v in offline.search(source).items()}
    status, answer = server.predict({"signature_name": BEAM_SEARCH, "instances": [
        {"source_ids": row} for row in source.tolist()]})  # fmt: skip
    assert status == 200
    assert answer["predictions"] == [dict(zip(expected, row)) for row in zip(*expected.values())]


def test_export_client_rest_works_against_it(server, offline, sentences):
    assert client.translate_rest(server.url, sentences[:4], MODEL) == offline_text(
        offline, sentences[:4])[0]  # fmt: skip


def test_32_concurrent_clients_get_the_offline_translations(server, offline, sentences):
    expected, _ = offline_text(offline, sentences)
    requests = [sentences[i : i + 1 + i % 6] for i in range(32)]  # 1 to 6 sentences each

    def ask(request):
        return server.predict({"instances": request})

    with ThreadPoolExecutor(32) as pool:
        answers = list(pool.map(ask, requests))
    for i, (status, answer) in enumerate(answers):
        assert status == 200
        assert [p["translations"] for p in answer["predictions"]] == expected[i : i + 1 + i % 6]
    with urllib.request.urlopen(server.url + "/monitoring/prometheus/metrics") as metrics:
        text = metrics.read().decode("utf-8")
    # Every sentence went through a batch (how they were shared depends on arrival times; the
    # batch queue's own tests show sentences of several requests sharing batches).
    served = sum(len(r) for r in requests)
    assert float(_metric(text, 'translation_batch_size_sum{model="translator"}')) >= served
    assert float(_metric(text, 'translation_requests_total{model="translator",'
                         'signature="serving_default",status="200"}')) >= 32  # fmt: skip
    assert _metric(text, 'translation_queue_depth{model="translator"}') == "0.0"
    assert _metric(text, 'translation_model_version{model="translator"}') == "1.0"


def _metric(text, series):
    lines = [line for line in text.splitlines() if line.startswith(series + " ")]
    assert lines, f"{series} not in the metrics"
    return lines[0].split()[-1]


@pytest.mark.parametrize("body,status,says", [
    (b'{"instances": ["Ein Hund."]', 400, "not JSON"),
    (b"\xff\xfe", 400, "not JSON"),
    ([], 400, "JSON object"),
    ({"instances": [1, 2]}, 400, "list of strings"),
    ({"inputs": {"sentences": "Ein Hund."}}, 400, "list of strings"),
    ({"instances": ["a"], "inputs": ["a"]}, 400, "either"),
    ({}, 400, "either"),
    ({"signature_name": "classify", "instances": ["a"]}, 404, "classify"),
    ({"instances": [{"sentence": "a"}]}, 400, "no input 'sentence'"),
    ({"signature_name": WITH_PREFIX, "instances": ["a"]}, 400, "target_prefix"),
    ({"signature_name": WITH_PREFIX, "inputs": {"sentences": ["a", "b"], "target_prefix": ["c"]}},
     400, "rows"),
    ({"signature_name": BEAM_SEARCH, "inputs": {"source_ids": [[5, 6], [7]]}}, 400, "pad"),
    ({"signature_name": BEAM_SEARCH, "inputs": {"source_ids": [[5, 6]], "beam_size": 2.5}},
     400, "integers"),
    ({"signature_name": BEAM_SEARCH, "inputs": {"source_ids": [[5, 2**40]]}}, 400, "int32"),
    ({"signature_name": BEAM_SEARCH, "inputs": {"source_ids": [[5]], "top_k": 2}}, 400, "top_k"),
    ({"signature_name": BEAM_SEARCH, "instances": [{"source_ids": [5], "beam_size": 2}]},
     400, "columnar"),
    ({"instances": ["Ein Hund."] * 300}, 400, "the most is 256"),
    (b"null", 400, "JSON object"),
    ({"signature_name": 3, "instances": ["a"]}, 400, "signature_name must be a string"),
    ({"instances": "Ein Hund."}, 400, "must be a list"),
    # What the commands refuse, the server refuses, naming the input.
    ({"signature_name": BEAM_SEARCH, "inputs": {"source_ids": [[5]], "beam_size": -1}},
     400, "beam_size must be at least 1"),
    ({"signature_name": BEAM_SEARCH, "inputs": {"source_ids": [[5]], "beam_size": 2,
                                                "n_best": 3}}, 400, "n_best (3) cannot exceed"),
    ({"signature_name": BEAM_SEARCH, "inputs": {"source_ids": [[5]], "length_penalty": -0.5}},
     400, "length_penalty must be at least 0"),
    ({"signature_name": BEAM_SEARCH, "inputs": {"source_ids": [[5]], "max_length": -2}},
     400, "max_length must be at least 0"),
    (b'{"signature_name": "beam_search", "inputs": {"source_ids": [[5]], "length_penalty": NaN}}',
     400, "length_penalty must be a finite number"),
    ({"signature_name": BEAM_SEARCH, "inputs": {"source_ids": [[5, 1_000_000]]}},
     400, "source_ids: id 1000000 is outside the vocabulary"),
    ({"signature_name": BEAM_SEARCH, "inputs": {"source_ids": [[-3]]}}, 400, "source_ids: id -3"),
    ({"signature_name": BEAM_SEARCH, "inputs": {"source_ids": [[5]], "target_prefix": [[99999]]}},
     400, "target_prefix: id 99999 is outside the vocabulary"),
    # Malformed bodies of any shape: refused before the model, naming what is wrong.
    (b"[" * 5000 + b"]" * 5000, 400, "nests arrays and objects more than 32 deep"),
    (b'{"instances": ' + b"[" * 5000 + b"]" * 5000 + b"}", 400, "more than 32 deep"),
    (b'{"a": ' * 5000 + b"1" + b"}" * 5000, 400, "more than 32 deep"),
    (b'{"inputs": ' + b"[" * 32 + b"]" * 32 + b"}", 400, "more than 32 deep"),
    (b'{"inputs": ' + b"[" * 31 + b"]" * 31 + b"}", 400, "list of strings"),  # 32 deep: read
    (b'{"instances": [' + b"9" * 5000 + b"]}", 400, "an integer of 5000 digits"),
    ({"signature_name": BEAM_SEARCH, "inputs": {"source_ids": [[5]], "length_penalty": 10**400}},
     400, "an integer of 401 digits"),
    ({"signature_name": BEAM_SEARCH, "inputs": {"source_ids": [[5]], "length_penalty": 1e300}},
     400, "'length_penalty': 1e+300 is outside float32"),
    ({"signature_name": BEAM_SEARCH, "inputs": {"source_ids": [[2**31]]}}, 400, "outside int32"),
    ({"instances": ["Ein Hund.", "\ud800"]}, 400, "'sentences': '\\ud800' is not Unicode text"),
    ({"signature_name": WITH_PREFIX, "inputs": {"sentences": ["a"], "target_prefix": ["\udfff"]}},
     400, "'target_prefix': '\\udfff' is not Unicode text"),
    ("Ein Hund.", 400, "JSON object, not a string"),
    (12, 400, "JSON object, not a number"),
    (True, 400, "JSON object, not a boolean"),
    (b"", 400, "not JSON"),
    ({"instances": {"sentences": ["a"]}}, 400, "'instances' must be a list, not an object"),
    ({"instances": 3}, 400, "'instances' must be a list, not a number"),
    ({"instances": [{"sentences": "a"}, "b"]}, 400, "mix objects and bare values"),
    ({"instances": [{"sentences": "a"}, {"sentences": "b", "x": 1}]}, 400, "same inputs"),
    ({"instances": [{"sentences": ["a"]}]}, 400, "list of strings"),
    ({"inputs": {}}, 400, "needs the input 'sentences'"),
    ({"inputs": {"sentences": ["a"], "target_language": ["de"]}}, 400,
     "no input 'target_language'"),
    ({"signature_name": BEAM_SEARCH, "inputs": {"source_ids": "5 6"}}, 400, "list of lists"),
    ({"signature_name": BEAM_SEARCH, "inputs": {"source_ids": [[5]], "beam_size": "2"}},
     400, "'beam_size' takes integers, not '2'"),
    ({"signature_name": BEAM_SEARCH, "inputs": {"source_ids": [[5]], "beam_size": [2] * 10**5}},
     400, "'beam_size' takes integers, not [2, 2, 2, 2, ...]"),
    ({"signature_name": "x" * 10**5, "instances": ["a"]}, 404, "not found"),
    ({"signature_name": [[["serving_default"]]], "instances": ["a"]}, 400, "must be a string"),
])  # fmt: skip
def test_a_bad_request_gets_its_status_and_a_one_line_error_and_the_server_goes_on(
    server, sentences, body, status, says
):
    answer_status, answer = server.predict(body)
    assert answer_status == status
    assert list(answer) == ["error"] and says in answer["error"]
    assert "\n" not in answer["error"] and len(answer["error"]) < 200
    assert server.predict({"instances": sentences[:1]})[0] == 200


# JSON values built from the names a request uses, so that most bodies get past the first check.
INPUT_NAMES = sorted({name for declared in SIGNATURES.values() for name in declared["inputs"]})
REQUEST_NAMES = ["instances", "inputs", "signature_name", *SIGNATURES, *INPUT_NAMES]
JSON_VALUES = st.recursive(
    st.none() | st.booleans() | st.integers(-3, 40) | st.floats(-2, 70) | st.text(max_size=8)
    | st.sampled_from(REQUEST_NAMES),
    lambda inner: st.lists(inner, max_size=4)
    | st.dictionaries(st.sampled_from(REQUEST_NAMES) | st.text(max_size=4), inner, max_size=4),
    max_leaves=12,
)  # fmt: skip


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow],
          derandomize=True)  # fmt: skip
@given(body=JSON_VALUES)
def test_a_body_of_any_shape_is_answered_200_or_a_one_line_400_or_404_never_500(server, body):
    status, answer = server.predict(body)
    assert status in (200, 400, 404), answer
    if status != 200:
        assert list(answer) == ["error"] and "\n" not in answer["error"]


# What the fuzzed bodies below are made of: a request's names, and values of every JSON type,
# the awkward ones among them (a lone surrogate, numbers outside int32 and float32, NaN).
FUZZ_KEYS = [*REQUEST_NAMES, "target_language", "", "x"]
FUZZ_STRINGS = ["", "Ein Hund.", "ü", "\x00", "\ud800", "de", *FUZZ_KEYS]
FUZZ_NUMBERS = [0, 1, -1, 3, 12, 2**31, -(2**31) - 1, 10**60, 10**400, 0.5, -2.5, 1e308,
                float("inf"), float("nan")]  # fmt: skip


def fuzz_value(rng, depth=0):
    """A random JSON value, of the shapes of a request's parts more often than not."""
    kind = rng.randrange(9 if depth < 4 else 4)
    if kind == 0:
        return rng.choice([None, True, False])
    if kind == 1:
        return rng.choice(FUZZ_NUMBERS) if rng.random() < 0.5 else rng.randint(-2, 300)
    if kind in (2, 3):
        return rng.choice(FUZZ_STRINGS)
    if kind == 4:  # sentences
        return [rng.choice(FUZZ_STRINGS) for _ in range(rng.randrange(4))]
    if kind == 5:  # ids
        width = rng.randrange(3)
        return [[rng.randint(-1, 300) for _ in range(width)] for _ in range(rng.randrange(3))]
    if kind == 6:
        return [fuzz_value(rng, depth + 1) for _ in range(rng.randrange(4))]
    return {rng.choice(FUZZ_KEYS): fuzz_value(rng, depth + 1) for _ in range(rng.randrange(4))}


def fuzz_body(rng):
    """A random body: mostly an object of a request's names, some bare values, a few nested
    far too deep."""
    if rng.random() < 0.15:
        body = json.dumps(fuzz_value(rng))
    else:
        request = {rng.choice(FUZZ_KEYS): fuzz_value(rng, 1) for _ in range(rng.randrange(3))}
        if rng.random() < 0.6:
            request["signature_name"] = rng.choice([*SIGNATURES, *SIGNATURES, "x", 3, None])
        request[rng.choice(["instances", "inputs"])] = fuzz_value(rng, 1)
        body = json.dumps(request)
    if rng.random() < 0.05:
        depth = rng.choice([31, 33, 5000])
        body = '{"inputs": ' + "[" * depth + body + "]" * depth + "}"
    return body.encode("utf-8")


def test_300_random_bodies_against_the_in_process_app_get_no_5xx(export_dir, sentences):
    """A seeded fuzz of the request parser: every body is answered (200, or a one-line 4xx
    naming what is wrong), and the server goes on serving."""
    rng = random.Random(20240611)
    with InProcessServer(export_dir) as server:
        answers = [(body, *server.predict(body)) for body in (fuzz_body(rng) for _ in range(300))]
        assert server.predict({"instances": sentences[:1]})[0] == 200
    for body, status, answer in answers:
        assert status < 500, (body[:200], answer)
        if status != 200:
            assert 400 <= status < 500 and list(answer) == ["error"], (body[:200], answer)
            assert answer["error"] and "\n" not in answer["error"], (body[:200], answer)
    # Not all refused at the first check: the fuzz reaches the model and every check on the way.
    statuses = {status for _, status, _ in answers}
    assert {200, 400, 404} <= statuses, statuses


def test_an_oversize_body_is_413_before_it_is_read(server, sentences):
    """Refused on its declared length, so a client that waits for the answer gets it (one that
    keeps sending after the refusal may see the connection close instead)."""
    with socket.create_connection(("127.0.0.1", server.port), timeout=60) as connection:
        connection.sendall(b"POST /v1/models/translator:predict HTTP/1.1\r\nHost: x\r\n"
                           b"Content-Type: application/json\r\n"
                           b"Content-Length: %d\r\n\r\n" % (2 << 20))  # fmt: skip
        answer = b""
        while b"\r\n\r\n" not in answer or not answer.rstrip().endswith(b"}"):
            chunk = connection.recv(65536)
            if not chunk:
                break
            answer += chunk
    head, body = answer.split(b"\r\n\r\n", 1)
    assert head.startswith(b"HTTP/1.1 413")
    error = json.loads(body)["error"]
    assert "bytes" in error and "\n" not in error
    assert server.predict({"instances": sentences[:1]})[0] == 200


@pytest.mark.parametrize("path,says", [
    ("/v1/models/other:predict", "Latest(other)"),
    ("/v1/models/translator/versions/7:predict", "Specific(translator, 7)"),
])  # fmt: skip
def test_an_unknown_model_or_version_is_404(server, sentences, path, says):
    status, answer = post(server.url + path, {"instances": sentences[:1]})
    assert status == 404 and says in answer["error"]


def test_status_and_metadata_are_tf_servings(server):
    assert get(server.model_url) == (200, {"model_version_status": [{
        "version": "1", "state": "AVAILABLE", "status": {"error_code": "OK", "error_message": ""}
    }]})  # fmt: skip
    status, metadata = get(server.model_url + "/metadata")
    assert status == 200 and metadata["model_spec"] == {
        "name": MODEL, "signature_name": "", "version": "1"}  # fmt: skip
    defs = metadata["metadata"]["signature_def"]["signature_def"]
    assert set(defs) == set(SIGNATURES)
    sentences = defs["serving_default"]["inputs"]["sentences"]
    assert sentences["dtype"] == "DT_STRING" and len(sentences["tensor_shape"]["dim"]) == 1
    assert defs[BEAM_SEARCH]["outputs"]["ids"]["dtype"] == "DT_INT32"
    assert get(server.url + "/v1/models/translator/versions/3/metadata")[0] == 404


def test_a_client_that_disconnects_does_not_disturb_the_others(server, sentences):
    body = json.dumps({"instances": sentences * 6}).encode("utf-8")
    for sent in (len(body) // 2, len(body)):  # in mid-body, then while it is translated
        with socket.create_connection(("127.0.0.1", server.port)) as connection:
            connection.sendall(b"POST /v1/models/translator:predict HTTP/1.1\r\nHost: x\r\n"
                               b"Content-Type: application/json\r\n"
                               b"Content-Length: %d\r\n\r\n" % len(body) + body[:sent])  # fmt: skip
    assert server.predict({"instances": sentences[:3]})[0] == 200


def copy_version(export_dir, base, number):
    """BASE/number/, written beside and renamed into place, as an export is."""
    staging = base / f".staging-{number}"
    shutil.copytree(export_dir, staging)
    staging.rename(base / str(number))


def test_a_new_version_is_served_while_requests_go_on_and_sigterm_finishes_them(
    export_dir, offline, sentences, tmp_path
):
    copy_version(export_dir, tmp_path, 1)
    with Server(tmp_path) as server:
        expected, _ = offline_text(offline, sentences[:4])
        answers, stop = [], threading.Event()

        def keep_asking():
            while not stop.is_set():
                answers.append(server.predict({"instances": sentences[:4]}))

        asking = threading.Thread(target=keep_asking)
        asking.start()
        try:
            copy_version(export_dir, tmp_path, 2)
            deadline = time.monotonic() + 60
            while get(server.model_url)[1]["model_version_status"][0]["version"] != "2":
                assert time.monotonic() < deadline, "version 2 was not picked up"
                time.sleep(0.1)
            assert server.predict({"instances": sentences[:1]}, version=2)[0] == 200
            assert server.predict({"instances": sentences[:1]}, version=1)[0] == 404
        finally:
            stop.set()
            asking.join()
        assert answers and all(status == 200 for status, _ in answers)
        assert all([p["translations"] for p in a["predictions"]] == expected for _, a in answers)
        # SIGTERM while a long request is being translated: it is answered, then the server exits.
        slow = ThreadPoolExecutor(1).submit(
            server.predict, {"signature_name": BEAM_SEARCH, "inputs": {
                "source_ids": offline._padded(offline.encode(sentences * 4)).tolist(),
                "beam_size": 8}})  # fmt: skip
        until(lambda: server.metric(f'translation_requests_in_flight{{model="{MODEL}"}}') == 1,
              "the long request in the server")  # fmt: skip
        returncode, output = server.stop()
        assert slow.result()[0] == 200
        assert returncode in (0, -signal.SIGTERM), output  # uvicorn re-raises it once it is done
        assert "Serving version 2" in output


class InProcessServer:
    """`export.serve.create_app(export_dir, **kwargs)` served by uvicorn on a thread of this
    process, so that a test can hold its batches; stopped on the way out."""

    def __init__(self, export_dir, **kwargs):
        import uvicorn

        self.app = serve.create_app(export_dir, model_name=MODEL, log=lambda *_: None, **kwargs)
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.model_url = f"{self.url}/v1/models/{MODEL}"
        config = uvicorn.Config(self.app, host="127.0.0.1", port=self.port, log_level="warning")
        self.uvicorn = uvicorn.Server(config)
        self.thread = threading.Thread(target=self.uvicorn.run, daemon=True)

    def __enter__(self):
        self.thread.start()
        until(lambda: self.uvicorn.started or not self.thread.is_alive(), "uvicorn started")
        assert self.thread.is_alive(), "uvicorn stopped"
        return self

    def __exit__(self, *exc_info):
        self.uvicorn.should_exit = True
        self.thread.join(60)
        assert not self.thread.is_alive(), "uvicorn did not stop"

    def predict(self, body):
        return post(self.model_url + ":predict", body)

    metric = Server.metric


def until(condition, what, seconds=120):
    """Waits for `condition()`, a state the test brings about; the time limit only guards
    against a hang and fails the test, naming `what` it waited for."""
    deadline = time.monotonic() + seconds
    while not condition():
        assert time.monotonic() < deadline, f"waited {seconds} s for: {what}"
        time.sleep(0.01)


def test_a_full_queue_answers_503_at_once_and_the_waiting_requests_are_served(
    export_dir, offline, sentences, monkeypatch
):
    """One batch at a time, of one sentence, and one sentence may wait: while the first batch
    is held, the second request waits and the third is refused at once."""
    started, release = threading.Event(), threading.Event()
    run_batch = serve.TranslationService._run_batch

    def held_batch(service, signature, items):
        started.set()
        assert release.wait(120), "the test never released the batch"
        return run_batch(service, signature, items)

    monkeypatch.setattr(serve.TranslationService, "_run_batch", held_batch)
    parameters = BatchingParameters(max_batch_size=1, max_enqueued_batches=1,
                                    num_batch_threads=1)  # fmt: skip
    limits = serve.ServerLimits(max_sentences_per_request=1)
    with InProcessServer(export_dir, parameters=parameters, limits=limits,
                         text_options={"beam_size": 1}) as server, \
            ThreadPoolExecutor(2) as pool:  # fmt: skip
        first = pool.submit(server.predict, {"instances": sentences[:1]})
        assert started.wait(120), "the first batch never started"
        second = pool.submit(server.predict, {"instances": sentences[1:2]})
        until(lambda: server.metric(f'translation_queue_depth{{model="{MODEL}"}}') == 1,
              "the second request in the queue")  # fmt: skip
        status, answer = server.predict({"instances": sentences[2:3]})
        assert status == 503 and "queue is full" in answer["error"]
        release.set()
        answers = [first.result(120), second.result(120)]
    expected, _ = offline_text(offline, sentences[:2], beam_size=1)
    assert [(s, a["predictions"][0]["translations"]) for s, a in answers] == [
        (200, text) for text in expected]  # fmt: skip


def test_the_search_flags_set_the_text_signatures_search():
    args = serve.parse_args(["EXPORT", "--beam-size", "1", "--length-penalty", "0.2"])
    assert search_arguments(args) == {"beam_size": 1, "length_penalty": 0.2}
    with pytest.raises(UserError, match="--beam-size must be at least 1"):
        search_arguments(serve.parse_args(["EXPORT", "--beam-size", "-1"]))


def test_a_missing_or_damaged_export_is_one_line(tmp_path, export_dir):
    def serve():
        command = [sys.executable, "-m", "export.serve", str(tmp_path)]
        return subprocess.run(command, cwd=PROJECT_ROOT, capture_output=True, text=True,
                              timeout=120)  # fmt: skip

    result = serve()
    assert result.returncode != 0
    assert "no exported ONNX model" in result.stderr and len(result.stderr.splitlines()) == 1
    shutil.copytree(export_dir, tmp_path / "1")
    (tmp_path / "1" / "model.onnx").write_bytes(b"not a model")
    result = serve()
    assert result.returncode != 0 and "model.onnx" in result.stderr
    assert len(result.stderr.splitlines()) == 1


# --- the parts, without a server -------------------------------------------------------------


def test_the_batch_queue_merges_concurrent_submissions_by_key_and_length():
    batches = []

    def run_batch(key, items):
        batches.append((key, list(items)))
        return [f"{key}:{item}" for item in items]

    # No batch leaves on its age within the test: the first leaves when three of a kind wait,
    # the others when the queue closes.
    parameters = BatchingParameters(max_batch_size=3, batch_timeout_micros=3_600_000_000,
                                    num_batch_threads=1)  # fmt: skip
    queue = BatchQueue(run_batch, parameters)
    futures = [queue.submit("a", ["x1", "x9"], [1, 9]), queue.submit("b", ["y"], [2]),
               queue.submit("a", ["x2", "x8", "x3"], [2, 8, 3])]  # fmt: skip
    queue.close()
    assert [f.result(0) for f in futures] == [["a:x1", "a:x9"], ["b:y"], ["a:x2", "a:x8", "a:x3"]]
    # The oldest (x1, length 1) leaves with the two closest in length (x2, x3); never mixed keys.
    assert batches[0] == ("a", ["x1", "x2", "x3"])
    assert sorted(map(tuple, (b[1] for b in batches[1:]))) == [("x9", "x8"), ("y",)]


def test_the_batch_queue_refuses_past_its_bound_and_passes_errors_to_their_requests():
    taken, release = threading.Event(), threading.Event()

    def run_batch(key, items):
        taken.set()
        assert release.wait(120)
        if "bad" in items:
            raise ValueError("bad item")
        return items

    queue = BatchQueue(run_batch, BatchingParameters(max_batch_size=2, max_enqueued_batches=1,
                                                     batch_timeout_micros=0,
                                                     num_batch_threads=1))  # fmt: skip
    first = queue.submit("k", ["bad"], [1])
    assert taken.wait(120)  # by the worker, which waits
    waiting = queue.submit("k", ["a", "b"], [1, 1])
    with pytest.raises(QueueFull, match="queue is full"):
        queue.submit("k", ["c"], [1])
    assert queue.depth == 2
    release.set()
    with pytest.raises(ValueError, match="bad item"):
        first.result(10)
    assert waiting.result(10) == ["a", "b"]
    queue.close()
    with pytest.raises(QueueClosed, match="stopping"):  # a QueueFull: 503 to a client
        queue.submit("k", ["d"], [1])


def test_the_parser_reads_each_shape_and_names_the_problem():
    prediction = parse_predict(b'{"instances": ["a", "b"]}')
    assert (prediction.signature, prediction.inputs, prediction.rows, prediction.row_format) == (
        "serving_default", {"sentences": ["a", "b"]}, 2, True)  # fmt: skip
    prediction = parse_predict(json.dumps({"signature_name": BEAM_SEARCH, "inputs": {
        "source_ids": [[4, 5]], "length_penalty": 1}}).encode())  # fmt: skip
    assert prediction.inputs == {"source_ids": [[4, 5]], "length_penalty": 1.0}
    with pytest.raises(RequestError, match="'beam_size' takes integers") as refused:
        parse_predict(json.dumps({"signature_name": BEAM_SEARCH, "inputs": {
            "source_ids": [[4]], "beam_size": True}}).encode())  # fmt: skip
    assert refused.value.status == 400


def test_the_server_runs_without_tensorflow(export_dir):
    loaded = "sorted(m for m in ('tensorflow', 'keras', 'tf2onnx') if m in sys.modules)"
    code = f"import sys, export.serve as s; s.create_app(sys.argv[1]); print({loaded})"
    result = subprocess.run([sys.executable, "-c", code, str(export_dir)], capture_output=True,
                            text=True, cwd=PROJECT_ROOT, timeout=120, check=True)  # fmt: skip
    assert result.stdout.strip().splitlines()[-1] == "[]"
