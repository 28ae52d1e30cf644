"""A TF Serving client for the exported model: gRPC `PredictRequest`s and REST JSON bodies.

    python -m export.client --grpc localhost:8500 "Ein Hund läuft über eine Wiese."
    python -m export.client --rest http://localhost:8501 --model-name translator < input.de

Requests carry strings (`serving_default`) or token ids with optional search settings
(`beam_search`); see the README for the server's docker command.
"""

import argparse
import json
import sys
import urllib.request

from export.signature import (
    BEAM_SEARCH,
    SCORES,
    SENTENCES,
    SERVING_DEFAULT,
    SOURCE_IDS,
    TRANSLATIONS,
    option_dtypes,
)


def _search_inputs(source_ids, options):
    inputs = {SOURCE_IDS: (source_ids, "int32")}
    for name, dtype in option_dtypes(options).items():
        if options[name] is not None:
            inputs[name] = (options[name], dtype)
    return inputs


def _predict_request(model_name, signature_name, inputs, version=None):
    import tensorflow as tf
    from tensorflow_serving.apis import predict_pb2

    request = predict_pb2.PredictRequest()
    request.model_spec.name = model_name
    request.model_spec.signature_name = signature_name
    if version is not None:
        request.model_spec.version.value = version
    for name, (value, dtype) in inputs.items():
        request.inputs[name].CopyFrom(tf.make_tensor_proto(value, dtype=dtype))
    return request


def translate_request(sentences, model_name, version=None):
    """A gRPC `PredictRequest` for `serving_default`: a `[batch]` string tensor."""
    sentences = [s.encode("utf-8") if isinstance(s, str) else s for s in sentences]
    return _predict_request(
        model_name, SERVING_DEFAULT, {SENTENCES: (sentences, "string")}, version
    )


def beam_search_request(source_ids, model_name, version=None, **options):
    """A gRPC `PredictRequest` for `beam_search`: right-padded int32 ids `[batch, src_len]`
    and any of `pipeline.decoding.search_options.EXPORTED_OPTIONS` (the others take their
    defaults)."""
    return _predict_request(model_name, BEAM_SEARCH, _search_inputs(source_ids, options), version)


def translate_body(sentences):
    """The REST body for `serving_default` (row format: one sentence an instance)."""
    return {"signature_name": SERVING_DEFAULT, "instances": list(sentences)}


def beam_search_body(source_ids, **options):
    """The REST body for `beam_search` (columnar format, so that scalars may be left out)."""
    inputs = {name: value for name, (value, _) in _search_inputs(source_ids, options).items()}
    return {"signature_name": BEAM_SEARCH, "inputs": inputs}


def translations_from_response(response):
    """(translations, scores) from a `PredictResponse` of `serving_default`."""
    import tensorflow as tf

    texts = tf.make_ndarray(response.outputs[TRANSLATIONS])
    return [t.decode("utf-8") for t in texts], tf.make_ndarray(response.outputs[SCORES]).tolist()


def translate_grpc(address, sentences, model_name, timeout=30.0):
    import grpc
    from tensorflow_serving.apis import prediction_service_pb2_grpc

    with grpc.insecure_channel(address) as channel:
        stub = prediction_service_pb2_grpc.PredictionServiceStub(channel)
        response = stub.Predict(translate_request(sentences, model_name), timeout)
    return translations_from_response(response)[0]


def translate_rest(url, sentences, model_name, timeout=30.0):
    request = urllib.request.Request(
        f"{url.rstrip('/')}/v1/models/{model_name}:predict",
        data=json.dumps(translate_body(sentences)).encode("utf-8"),
        headers={"Content-Type": "application/json"},
    )
    with urllib.request.urlopen(request, timeout=timeout) as response:
        predictions = json.load(response)["predictions"]
    return [p[TRANSLATIONS] for p in predictions]


def main(argv=None):
    parser = argparse.ArgumentParser(prog="python -m export.client", description=__doc__)
    where = parser.add_mutually_exclusive_group(required=True)
    where.add_argument("--grpc", metavar="HOST:PORT", help="TF Serving's gRPC address")
    where.add_argument("--rest", metavar="URL", help="TF Serving's REST address")
    parser.add_argument("--model-name", default="translator")
    parser.add_argument("sentences", nargs="*", help="default: one sentence a line on stdin")
    args = parser.parse_args(argv)
    sentences = args.sentences or [line.rstrip("\n") for line in sys.stdin]
    if args.grpc:
        translations = translate_grpc(args.grpc, sentences, args.model_name)
    else:
        translations = translate_rest(args.rest, sentences, args.model_name)
    print("\n".join(translations))


if __name__ == "__main__":
    main()
