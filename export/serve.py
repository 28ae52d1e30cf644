"""A translation server that speaks TF Serving's REST API, on ONNX Runtime (no TensorFlow).

    python -m export.serve runs/default/export [--port 8501] [--model-name translator]

    POST /v1/models/NAME[/versions/N]:predict     signatures serving_default,
                                                   translate_with_prefix, beam_search
    GET  /v1/models/NAME[/versions/N]             the version served
    GET  /v1/models/NAME[/versions/N]/metadata    the signatures
    GET  /monitoring/prometheus/metrics           Prometheus metrics

The same requests as TF Serving's (`python -m export.client --rest URL` works unchanged),
the same answers and error shapes (`{"error": "..."}`). Sentences from concurrent requests are
batched together (`export.batching`, with TF Serving's batching parameters); the highest
numbered version is served and a new one picked up while serving (`export.model_versions`).
SIGTERM or Ctrl-C stops taking connections, finishes the requests in flight, then exits.
"""

import argparse
import asyncio
import contextlib
import dataclasses
import sys
import time
from pathlib import Path

import numpy as np

from export import rest_api
from export.batching import BatchingParameters, BatchQueue, QueueClosed, QueueFull
from export.model_versions import ModelVersions
from export.rest_api import BAD_REQUEST, NOT_FOUND, TOO_LARGE, UNAVAILABLE, RequestError
from export.signature import (
    SCORES,
    SEARCH_OUTPUTS,
    SENTENCES,
    SOURCE_IDS,
    SOURCE_LANGUAGE,
    TARGET_LANGUAGE,
    TARGET_PREFIX,
    TEXT_SIGNATURES,
    TRANSLATIONS,
)
from pipeline.config import SCHEMA
from pipeline.core.errors import UserError, first_line, report_user_errors
from pipeline.decoding.search_options import (
    SEARCH_OPTIONS,
    add_search_arguments,
    search_arguments,
)

DEFAULT_PORT = 8501  # TF Serving's REST port in its documentation and docker image
DEFAULT_MODEL_NAME = SCHEMA["export"]["model_name"].default
# What a text signature's search cannot be told: options an export does not take, and n_best
# (a text signature gives one translation a sentence).
TEXT_FIXED_OPTIONS = [o.name for o in SEARCH_OPTIONS if not o.exported] + ["n_best"]


@dataclasses.dataclass(frozen=True)
class ServerLimits:
    """What one request may ask, so that one client cannot take the server."""

    max_body_bytes: int = dataclasses.field(
        default=1 << 20, metadata={"meaning": "a larger request body is refused (413)"}
    )
    max_sentences_per_request: int = dataclasses.field(
        default=256, metadata={"meaning": "a request with more is refused (400)"}
    )

    def __post_init__(self):
        for field in dataclasses.fields(self):
            if getattr(self, field.name) < 1:
                value = getattr(self, field.name)
                raise ValueError(f"{field.name} must be at least 1, not {value}")


class TranslationService:
    """One version of the model: an `OnnxTranslator` behind a `BatchQueue`. The text
    signatures search with `text_options` (exported options; the others at the export's
    defaults)."""

    def __init__(self, directory, parameters, int8=False, on_batch=None, text_options=None):
        from export.runtime import OnnxTranslator

        self.text_options = text_options or {}
        self.translator = OnnxTranslator(
            directory, batch_size=parameters.max_batch_size, int8=int8,
            inter_threads=parameters.num_batch_threads,
        )  # fmt: skip
        self.queue = BatchQueue(self._run_batch, parameters, on_batch)

    def close(self):
        self.queue.close()

    def submit(self, prediction):
        """A future of `prediction`'s outputs, one value a row by output name; `QueueFull`."""
        inputs = prediction.inputs
        if prediction.signature not in TEXT_SIGNATURES:
            return self.queue.submit_alone(self._checked_search(inputs), prediction.rows)
        try:
            sources, prefixes = self.translator.encode_requests(
                inputs[SENTENCES], inputs.get(TARGET_PREFIX), inputs.get(TARGET_LANGUAGE),
                inputs.get(SOURCE_LANGUAGE),
            )  # fmt: skip
        except ValueError as wrong:
            raise RequestError(BAD_REQUEST, str(wrong)) from None
        prefixes = prefixes or [None] * len(sources)
        return self.queue.submit(
            prediction.signature, list(zip(sources, prefixes)), [len(s) for s in sources]
        )

    def _run_batch(self, signature, items):
        """`signature` None: one `beam_search` request; else sentences (source ids, prefix ids)
        -> (translation, score) each."""
        if signature is None:
            return [self._beam_search(items[0])]
        # A sentence has a prefix where it was asked or where its model's targets start with
        # their language's token: then every sentence of its signature has one.
        prefixes = [prefix for _, prefix in items] if items[0][1] is not None else None
        best = self.translator.translate_ids(
            [source for source, _ in items], prefixes, **self.text_options
        )
        return [(self.translator.text(ids), score) for (ids, score), *_ in best]

    def _checked_search(self, inputs):
        """A `beam_search` request's feeds, checked once, before it is queued; `RequestError`
        400 naming the input the model cannot be asked (an id outside its vocabulary, an
        option out of the range the commands enforce)."""
        options = {k: v for k, v in inputs.items() if k not in (SOURCE_IDS, TARGET_PREFIX)}
        prefix = inputs.get(TARGET_PREFIX)
        try:
            return self.translator.check_search(
                _id_matrix(inputs[SOURCE_IDS]), None if prefix is None else _id_matrix(prefix),
                **options,
            )  # fmt: skip
        except ValueError as wrong:
            raise RequestError(BAD_REQUEST, str(wrong)) from None

    def _beam_search(self, feeds):
        outputs = self.translator.run(feeds)
        return {name: outputs[name].tolist() for name in SEARCH_OUTPUTS}


def _id_matrix(rows):
    """int32 `[len(rows), width]` of rectangular `rows` (`[]` too)."""
    matrix = np.zeros((len(rows), len(rows[0]) if rows else 0), dtype=np.int32)
    if rows and rows[0]:
        matrix[:] = rows
    return matrix


def outputs_of(prediction, results):
    """The batch queue's results as {output: one value a row}."""
    if prediction.signature in TEXT_SIGNATURES:
        return {TRANSLATIONS: [t for t, _ in results], SCORES: [s for _, s in results]}
    (outputs,) = results
    return outputs


class Metrics:
    """Prometheus metrics of one server."""

    def __init__(self, model_name, queue_depth, served_version):
        import prometheus_client as prometheus

        prometheus.disable_created_metrics()  # a `_created` series a metric is noise here
        self.registry = prometheus.CollectorRegistry()
        self.requests = prometheus.Counter(
            "translation_requests", "predict requests answered, by signature and HTTP status",
            ["model", "signature", "status"], registry=self.registry,
        )  # fmt: skip
        self.latency = prometheus.Histogram(
            "translation_request_latency_seconds", "predict requests' time in the server",
            ["model", "signature"], registry=self.registry,
            buckets=(0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30),
        )  # fmt: skip
        self.batch_size = prometheus.Histogram(
            "translation_batch_size", "sentences in each batch run", ["model"],
            registry=self.registry, buckets=(1, 2, 4, 8, 16, 32, 64, 128, 256),
        )  # fmt: skip
        prometheus.Gauge(
            "translation_queue_depth", "sentences waiting for a batch", ["model"],
            registry=self.registry,
        ).labels(model_name).set_function(queue_depth)  # fmt: skip
        prometheus.Gauge(
            "translation_model_version", "the version served", ["model"], registry=self.registry
        ).labels(model_name).set_function(served_version)
        self.in_flight = prometheus.Gauge(
            "translation_requests_in_flight", "predict requests received and not yet answered",
            ["model"], registry=self.registry,
        ).labels(model_name)  # fmt: skip
        self.model_name = model_name
        self.render = lambda: prometheus.generate_latest(self.registry)
        self.content_type = prometheus.CONTENT_TYPE_LATEST

    def observe_batch(self, size):
        self.batch_size.labels(self.model_name).observe(size)

    def observe(self, signature, status, seconds):
        self.requests.labels(self.model_name, signature, str(status)).inc()
        self.latency.labels(self.model_name, signature).observe(seconds)


class TranslationServer:
    """The routes of one server of `export_dir` (loaded here; `UserError` when it cannot be),
    one handler a route, and its lifespan: it polls for new versions while it runs.
    `text_options`: search options of the text signatures, in place of the export's
    defaults."""

    def __init__(self, export_dir, model_name=DEFAULT_MODEL_NAME, parameters=None, limits=None,
                 int8=False, poll_seconds=1.0, text_options=None, log=print):  # fmt: skip
        parameters, self.limits = parameters or BatchingParameters(), limits or ServerLimits()
        most = self.limits.max_sentences_per_request
        if most > parameters.queue_capacity:
            raise UserError(f"max_sentences_per_request ({most}) is more than the queue holds "
                            f"({parameters.queue_capacity})")  # fmt: skip
        self.model_name = model_name
        self.metrics = Metrics(
            model_name,
            queue_depth=lambda: self.versions.served.model.queue.depth,
            served_version=lambda: self.versions.served.number,
        )

        def load(directory):
            return TranslationService(directory, parameters, int8, self.metrics.observe_batch,
                                      text_options)  # fmt: skip

        self.versions = ModelVersions(export_dir, load, poll_seconds, log)

    def routes(self):
        from starlette.routing import Route

        models, version = "/v1/models/{name}", "/versions/{version}"
        return [
            Route(models + ":predict", self.predict, methods=["POST"]),
            Route(models + version + ":predict", self.predict, methods=["POST"]),
            Route(models, self.status, methods=["GET"]),
            Route(models + version, self.status, methods=["GET"]),
            Route(models + "/metadata", self.metadata, methods=["GET"]),
            Route(models + version + "/metadata", self.metadata, methods=["GET"]),
            Route("/monitoring/prometheus/metrics", self.prometheus_metrics, methods=["GET"]),
        ]

    @contextlib.asynccontextmanager
    async def lifespan(self, app):
        self.versions.start()
        try:
            yield
        finally:  # once the server has answered every request in flight
            await asyncio.to_thread(self.versions.stop)

    async def predict(self, request):
        started, signature = time.perf_counter(), ""
        self.metrics.in_flight.inc()
        try:
            # An unknown model or version: 404 before the body is read.
            languages = self.served(request).model.translator.request_languages.inputs
            prediction = rest_api.parse_predict(await self.read_body(request), languages)
            signature = prediction.signature
            most = self.limits.max_sentences_per_request
            if prediction.rows > most:
                raise RequestError(BAD_REQUEST, f"{prediction.rows} sentences in one request; "
                                   f"the most is {most}")  # fmt: skip
            try:
                future = self.submit(request, prediction)
            except QueueFull as full:
                raise RequestError(UNAVAILABLE, str(full)) from None
            results = await asyncio.wrap_future(future)
            response = _json(rest_api.predict_response(prediction, outputs_of(prediction, results)))
        except RequestError as refused:
            response = _error(refused.status, str(refused))
        except Exception as failure:  # the model failed: the client is told, the server goes on
            response = _error(500, f"the model failed: {first_line(failure)}")
        finally:
            self.metrics.in_flight.dec()
        self.metrics.observe(signature, response.status_code, time.perf_counter() - started)
        return response

    async def status(self, request):
        try:
            return _json(rest_api.version_status(self.served(request).number))
        except RequestError as refused:
            return _error(refused.status, str(refused))

    async def metadata(self, request):
        try:
            version = self.served(request)
            languages = version.model.translator.request_languages.inputs
            return _json(rest_api.model_metadata(self.model_name, version.number, languages))
        except RequestError as refused:
            return _error(refused.status, str(refused))

    async def prometheus_metrics(self, request):
        from starlette.responses import Response

        return Response(self.metrics.render(), media_type=self.metrics.content_type)

    def served(self, request):
        """The served version a request names; `RequestError` 404 for another model or version."""
        current = self.versions.served
        name, version = request.path_params["name"], request.path_params.get("version")
        if name != self.model_name:
            raise RequestError(NOT_FOUND, f"Servable not found for request: Latest({name})")
        if version is not None and version != str(current.number):
            raise RequestError(NOT_FOUND, f"Servable not found for request: "
                               f"Specific({name}, {version})")  # fmt: skip
        return current

    def submit(self, request, prediction):
        """`prediction` submitted to the version served now. A version swapped out after the
        lookup closes its queue; the request then goes to the version that replaced it."""
        while True:
            version = self.served(request)
            try:
                return version.model.submit(prediction)
            except QueueClosed:
                if self.versions.served is version:  # no successor: the server is stopping
                    raise

    async def read_body(self, request):
        """The body, refused (413) past `max_body_bytes` as declared or as read."""
        most = self.limits.max_body_bytes
        declared = request.headers.get("content-length", "")
        if declared.isdigit() and int(declared) > most:
            raise RequestError(TOO_LARGE, f"the body is {declared} bytes; the most a request "
                               f"may send is {most}")  # fmt: skip
        chunks, size = [], 0
        async for chunk in request.stream():
            size += len(chunk)
            if size > most:
                raise RequestError(TOO_LARGE, f"the body is over {most} bytes, the most a "
                                   "request may send")  # fmt: skip
            chunks.append(chunk)
        return b"".join(chunks)


def _json(document):
    from starlette.responses import JSONResponse

    return JSONResponse(document)


def _error(status, message):
    """TF Serving's error shape: `{"error": message}`."""
    from starlette.responses import JSONResponse

    return JSONResponse({"error": message}, status_code=status)


def create_app(export_dir, *args, **kwargs):
    """The Starlette application of a `TranslationServer(export_dir, *args, **kwargs)`."""
    from starlette.applications import Starlette
    from starlette.exceptions import HTTPException

    server = TranslationServer(export_dir, *args, **kwargs)

    async def http_error(request, exc):  # starlette's own 404 and 405, in TF Serving's shape
        return _error(exc.status_code, exc.detail)

    app = Starlette(routes=server.routes(), lifespan=server.lifespan,
                    exception_handlers={HTTPException: http_error})  # fmt: skip
    app.state.server = server
    return app


def parse_args(argv):
    parser = argparse.ArgumentParser(
        prog="python -m export.serve", description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )  # fmt: skip
    parser.add_argument("export_dir", type=Path, help="an export (OUT or OUT/onnx), or a "
                        "directory of numbered versions of one")  # fmt: skip
    parser.add_argument("--host", default="127.0.0.1", help="0.0.0.0 to serve other machines")
    parser.add_argument("--port", type=int, default=DEFAULT_PORT)
    parser.add_argument("--model-name", default=DEFAULT_MODEL_NAME, help="NAME in the URLs")
    parser.add_argument("--int8", action="store_true", help="serve model.int8.onnx")
    parser.add_argument("--poll-seconds", type=float, default=1.0,
                        help="how often to look for a new version")  # fmt: skip
    for field in dataclasses.fields(BatchingParameters) + dataclasses.fields(ServerLimits):
        parser.add_argument("--" + field.name.replace("_", "-"), type=int, default=field.default,
                            help=f"{field.metadata['meaning']} (default: %(default)s)")  # fmt: skip
    add_search_arguments(
        parser, exclude=TEXT_FIXED_OPTIONS
    ).title = "search of serving_default and translate_with_prefix (defaults: the export's)"
    return parser.parse_args(argv)


@report_user_errors
def main(argv=None):
    import uvicorn

    args = parse_args(argv)

    def given(kind):
        return kind(**{f.name: getattr(args, f.name) for f in dataclasses.fields(kind)})

    try:
        parameters, limits = given(BatchingParameters), given(ServerLimits)
    except ValueError as invalid:
        raise UserError(str(invalid)) from None
    app = create_app(args.export_dir, args.model_name, parameters, limits, args.int8,
                     args.poll_seconds, search_arguments(args))  # fmt: skip
    print(f"REST API at http://{args.host}:{args.port}/v1/models/{args.model_name}", flush=True)
    uvicorn.run(app, host=args.host, port=args.port, log_level="warning", access_log=False)


if __name__ == "__main__":
    sys.exit(main())
