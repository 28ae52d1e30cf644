"""A TF Serving client for the exported model: gRPC `PredictRequest`s and REST JSON bodies.

    python -m export.client --grpc localhost:8500 "Ein Hund läuft über eine Wiese."
    python -m export.client --rest http://localhost:8501 --model-name translator < input.de
    python -m export.client --rest http://localhost:8501 --target-language fr < input.de
    python -m export.client --rest http://localhost:8501 --source-language deu_Latn \
        --target-language fra_Latn < input.de

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
    SOURCE_LANGUAGE,
    TARGET_LANGUAGE,
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


def _utf8(texts):
    return [s.encode("utf-8") if isinstance(s, str) else s for s in texts]


def _languages(sentences, target_language, source_language):
    """{input name: a language a sentence} of the languages given (each one for all, or one a
    sentence): a multilingual model's target language, a many-to-many import's source
    language too; {} for a bilingual model."""
    given = {TARGET_LANGUAGE: target_language, SOURCE_LANGUAGE: source_language}
    return {name: [language] * len(sentences) if isinstance(language, str) else list(language)
            for name, language in given.items() if language is not None}  # fmt: skip


def translate_request(sentences, model_name, version=None, target_language=None,
                      source_language=None):  # fmt: skip
    """A gRPC `PredictRequest` for `serving_default`: a `[batch]` string tensor, and for a
    multilingual model the language of each (`target_language`, and `source_language` for a
    model that takes it: one for all, or one a sentence)."""
    inputs = {SENTENCES: (_utf8(sentences), "string")}
    for name, languages in _languages(sentences, target_language, source_language).items():
        inputs[name] = (_utf8(languages), "string")
    return _predict_request(model_name, SERVING_DEFAULT, inputs, version)


def beam_search_request(source_ids, model_name, version=None, **options):
    """A gRPC `PredictRequest` for `beam_search`: right-padded int32 ids `[batch, src_len]`
    and any of `pipeline.decoding.search_options.EXPORTED_OPTIONS` (the others take their
    defaults)."""
    return _predict_request(model_name, BEAM_SEARCH, _search_inputs(source_ids, options), version)


def translate_body(sentences, target_language=None, source_language=None):
    """The REST body for `serving_default` (row format: one sentence an instance, with its
    languages for a model that takes them)."""
    languages = _languages(sentences, target_language, source_language)
    if not languages:
        return {"signature_name": SERVING_DEFAULT, "instances": list(sentences)}
    instances = [{SENTENCES: s, **{name: each[i] for name, each in languages.items()}}
                 for i, s in enumerate(sentences)]  # fmt: skip
    return {"signature_name": SERVING_DEFAULT, "instances": instances}


def beam_search_body(source_ids, **options):
    """The REST body for `beam_search` (columnar format, so that scalars may be left out)."""
    inputs = {name: value for name, (value, _) in _search_inputs(source_ids, options).items()}
    return {"signature_name": BEAM_SEARCH, "inputs": inputs}


def translations_from_response(response):
    """(translations, scores) from a `PredictResponse` of `serving_default`."""
    import tensorflow as tf

    texts = tf.make_ndarray(response.outputs[TRANSLATIONS])
    return [t.decode("utf-8") for t in texts], tf.make_ndarray(response.outputs[SCORES]).tolist()


def translate_grpc(address, sentences, model_name, timeout=30.0, target_language=None,
                   source_language=None):  # fmt: skip
    import grpc
    from tensorflow_serving.apis import prediction_service_pb2_grpc

    with grpc.insecure_channel(address) as channel:
        stub = prediction_service_pb2_grpc.PredictionServiceStub(channel)
        request = translate_request(sentences, model_name, target_language=target_language,
                                    source_language=source_language)  # fmt: skip
        response = stub.Predict(request, timeout)
    return translations_from_response(response)[0]


def translate_rest(url, sentences, model_name, timeout=30.0, target_language=None,
                   source_language=None):  # fmt: skip
    body = translate_body(sentences, target_language, source_language)
    request = urllib.request.Request(
        f"{url.rstrip('/')}/v1/models/{model_name}:predict",
        data=json.dumps(body).encode("utf-8"),
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
    parser.add_argument("--target-language", metavar="CODE",
                        help="a multilingual model: the language to translate into")  # fmt: skip
    parser.add_argument("--source-language", metavar="CODE",
                        help="a many-to-many import (M2M100, NLLB): the language of the "
                        "sentences")  # fmt: skip
    parser.add_argument("sentences", nargs="*", help="default: one sentence a line on stdin")
    args = parser.parse_args(argv)
    sentences = args.sentences or [line.rstrip("\n") for line in sys.stdin]
    languages = {"target_language": args.target_language,
                 "source_language": args.source_language}  # fmt: skip
    if args.grpc:
        translations = translate_grpc(args.grpc, sentences, args.model_name, **languages)
    else:
        translations = translate_rest(args.rest, sentences, args.model_name, **languages)
    print("\n".join(translations))


if __name__ == "__main__":
    main()
