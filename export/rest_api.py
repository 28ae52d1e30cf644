"""TF Serving's REST API for the exported signatures (`export.signature.SIGNATURES`), without
a server: a `:predict` body parsed and checked in the row (`instances`) or the columnar
(`inputs`) format, responses shaped as TF Serving shapes them, and the model's status and
metadata documents. `export.serve` puts these behind HTTP.

A request that cannot be served raises `RequestError` with TF Serving's HTTP status and a
one-line message, which the server sends as `{"error": message}`. Whatever a body holds (any
JSON value, nested however deep, numbers of any size, strings that are not Unicode text), the
parser answers it or refuses it so: a malformed body never reaches the model.
"""

import dataclasses
import json
import reprlib

from export.signature import SERVING_DEFAULT, TEXT_SIGNATURES, signatures_of

BAD_REQUEST, NOT_FOUND, TOO_LARGE, UNAVAILABLE = 400, 404, 413, 503
INT32_RANGE = (-(2**31), 2**31 - 1)
FLOAT32_MAX = 3.4028234663852886e38
# A request nests 4 deep at most ({"inputs": {"source_ids": [[...]]}}); deeper is refused, as
# are integers of more digits than any input could take (Python refuses past 4300 digits).
MAX_NESTING, MAX_DIGITS = 32, 100
# TF Serving's names for the dtypes in its metadata.
TENSORFLOW_DTYPES = {"string": "DT_STRING", "int32": "DT_INT32", "float32": "DT_FLOAT"}


class RequestError(Exception):
    """A request that cannot be served: `status` is the HTTP status, the message one line."""

    def __init__(self, status, message):
        super().__init__(message)
        self.status = status


@dataclasses.dataclass(frozen=True)
class Prediction:
    """A checked `:predict` request: its signature, its inputs by name (strings as lists of
    `str`, ids as lists of lists of `int`, options as numbers), the number of rows, and
    whether the answer goes back in the row format."""

    signature: str
    inputs: dict
    rows: int
    row_format: bool


def parse_predict(body, language_inputs=()):
    """The `Prediction` in a `:predict` body (bytes) to an export whose text signatures take
    `language_inputs` (`export.signature.signatures_of`); `RequestError` when it is not JSON,
    names an unknown signature or input, lacks a required input, or holds values of the wrong
    type or shape."""
    signatures, required = signatures_of(language_inputs)
    request = _json_of(body)
    if not isinstance(request, dict):
        raise RequestError(BAD_REQUEST, f"the body must be a JSON object, not {_kind(request)}")
    signature = request.get("signature_name", SERVING_DEFAULT)
    if not isinstance(signature, str):
        raise RequestError(BAD_REQUEST, f"signature_name must be a string, not "
                           f"{_shown(signature)}")  # fmt: skip
    if signature not in signatures:
        raise RequestError(NOT_FOUND, f"signature_name {_shown(signature)} not found; this model "
                           f"has {', '.join(signatures)}")  # fmt: skip
    if ("instances" in request) == ("inputs" in request):
        raise RequestError(BAD_REQUEST, "a request has either 'instances' (row format) or "
                           "'inputs' (columnar format), not both and not neither")  # fmt: skip
    row_format = "instances" in request
    if row_format:
        inputs = _columns_of_instances(signatures[signature], required[signature], signature,
                                       request["instances"])  # fmt: skip
    else:
        inputs = _named_inputs(required[signature], signature, request["inputs"])
    unknown = sorted(set(inputs) - set(signatures[signature]["inputs"]))
    if unknown:
        raise RequestError(BAD_REQUEST, f"{signature} has no input {_shown(unknown[0])}; it takes "
                           f"{', '.join(signatures[signature]['inputs'])}")  # fmt: skip
    missing = [name for name in required[signature] if name not in inputs]
    if missing:
        raise RequestError(BAD_REQUEST, f"{signature} needs the input {missing[0]!r}")
    checked = {name: _checked(name, value, *signatures[signature]["inputs"][name])
               for name, value in inputs.items()}  # fmt: skip
    first = required[signature][0]
    rows = len(checked[first])
    for name, value in checked.items():
        if (
            name != first
            and signatures[signature]["inputs"][name][1]
            and (len(value) != rows if signature in TEXT_SIGNATURES else len(value) > rows)
        ):
            raise RequestError(BAD_REQUEST, f"{name!r} has {len(value)} rows and {first!r} "
                               f"{rows}")  # fmt: skip
    return Prediction(signature, checked, rows, row_format)


def _json_of(body):
    """The JSON value of `body`, or `RequestError` 400 naming why there is none: not JSON, an
    integer too long, arrays and objects nested deeper than `MAX_NESTING`."""
    too_deep = f"the body nests arrays and objects more than {MAX_NESTING} deep"
    try:
        value = json.loads(body, parse_int=_integer)
    except RecursionError:  # far deeper than MAX_NESTING: the parser gave up
        raise RequestError(BAD_REQUEST, too_deep) from None
    except (UnicodeDecodeError, ValueError) as error:
        raise RequestError(BAD_REQUEST, f"the body is not JSON: {error}") from None
    # Depth first, without recursion: each array or object with its depth (the body's is 1).
    pending = [(value, 1)] if isinstance(value, (dict, list)) else []
    while pending:
        container, depth = pending.pop()
        if depth > MAX_NESTING:
            raise RequestError(BAD_REQUEST, too_deep)
        children = container.values() if isinstance(container, dict) else container
        pending.extend((child, depth + 1) for child in children
                       if isinstance(child, (dict, list)))  # fmt: skip
    return value


def _integer(digits):
    """`json.loads`' integers: `RequestError` 400 past `MAX_DIGITS` digits."""
    if len(digits.lstrip("-")) > MAX_DIGITS:
        raise RequestError(BAD_REQUEST, f"the body has an integer of {len(digits.lstrip('-'))} "
                           f"digits; no input takes one of more than {MAX_DIGITS}")  # fmt: skip
    return int(digits)


_SHORT = reprlib.Repr()
_SHORT.maxlevel, _SHORT.maxstring, _SHORT.maxother, _SHORT.maxlong = 2, 40, 40, 40
_SHORT.maxlist = _SHORT.maxdict = 4


def _shown(value):
    """`value` in a message: its repr, shortened (a client's value may be of any size)."""
    return _SHORT.repr(value)


def _kind(value):
    """The JSON type of a parsed `value`, as a message names it."""
    if isinstance(value, bool):
        return "a boolean"
    return {dict: "an object", list: "an array", str: "a string", int: "a number",
            float: "a number"}.get(type(value), "null")  # fmt: skip


def _columns_of_instances(declared, required, signature, instances):
    """The row format's instances as {input: column}: each instance is an object of named
    inputs, or, for a signature with one required input, that input's value alone."""
    if not isinstance(instances, list):
        raise RequestError(BAD_REQUEST, f"'instances' must be a list, not {_kind(instances)}")
    if all(not isinstance(instance, dict) for instance in instances):
        if len(required) > 1:
            raise RequestError(BAD_REQUEST, f"each instance of {signature} is an object with "
                               f"{' and '.join(map(repr, required))}")  # fmt: skip
        return {required[0]: instances}
    if not all(isinstance(instance, dict) for instance in instances):
        raise RequestError(BAD_REQUEST, "the instances mix objects and bare values")
    names = set(instances[0])
    if any(set(instance) != names for instance in instances):
        raise RequestError(BAD_REQUEST, "every instance must name the same inputs")
    scalars = [n for n in names if n in declared["inputs"] and declared["inputs"][n][1] == 0]
    if scalars:
        raise RequestError(BAD_REQUEST, f"{scalars[0]!r} is one value for the whole request: "
                           "send it in the columnar format ('inputs')")  # fmt: skip
    return {name: [instance[name] for instance in instances] for name in names}


def _named_inputs(required, signature, inputs):
    """The columnar format's inputs as {input: value}: an object of named inputs, or, for a
    signature with one required input, that input's value alone."""
    if isinstance(inputs, dict):
        return inputs
    if len(required) > 1:
        raise RequestError(BAD_REQUEST, f"'inputs' of {signature} is an object with "
                           f"{' and '.join(map(repr, required))}")  # fmt: skip
    return {required[0]: inputs}


def _checked(name, value, dtype, rank):
    """`value` as the input `name` of `dtype` and `rank` (0: a number; 1: a list of strings;
    2: a rectangular list of lists of int32), or `RequestError` saying what is wrong."""
    if rank == 0:
        return _number(name, value, dtype)
    if rank == 1:
        if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
            raise RequestError(BAD_REQUEST, f"{name!r} must be a list of strings")
        for text in value:
            if not text.isascii():
                try:
                    text.encode("utf-8")
                except UnicodeEncodeError:  # a lone surrogate ("\ud800"), which JSON lets by
                    raise RequestError(BAD_REQUEST, f"{name!r}: {_shown(text)} is not Unicode "
                                       "text (it holds a lone surrogate)") from None  # fmt: skip
        return value
    if not isinstance(value, list) or not all(isinstance(row, list) for row in value):
        raise RequestError(BAD_REQUEST, f"{name!r} must be a list of lists of integers")
    if len({len(row) for row in value}) > 1:
        raise RequestError(BAD_REQUEST, f"the rows of {name!r} differ in length: pad them "
                           "with 0 on the right")  # fmt: skip
    return [[_number(name, v, dtype) for v in row] for row in value]


def _number(name, value, dtype):
    if dtype == "int32":
        if isinstance(value, bool) or not isinstance(value, int):
            raise RequestError(BAD_REQUEST, f"{name!r} takes integers, not {_shown(value)}")
        if not INT32_RANGE[0] <= value <= INT32_RANGE[1]:
            raise RequestError(BAD_REQUEST, f"{name!r}: {_shown(value)} is outside int32")
        return value
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise RequestError(BAD_REQUEST, f"{name!r} takes numbers, not {_shown(value)}")
    value = float(value)  # an int of MAX_DIGITS digits at most: within float64
    if FLOAT32_MAX < abs(value) < float("inf"):  # infinities and NaN: check_search says why
        raise RequestError(BAD_REQUEST, f"{name!r}: {_shown(value)} is outside float32")
    return value


def predict_response(prediction, outputs):
    """TF Serving's answer to `prediction`: {output: one value a row} becomes
    `{"predictions": [one object a row]}` in the row format, `{"outputs": {...}}` in the
    columnar one."""
    if prediction.row_format:
        return {"predictions": [dict(zip(outputs, row)) for row in zip(*outputs.values())]}
    return {"outputs": outputs}


def version_status(version):
    """`GET /v1/models/NAME`: the version served, as TF Serving reports it."""
    status = {"error_code": "OK", "error_message": ""}
    return {"model_version_status": [
        {"version": str(version), "state": "AVAILABLE", "status": status}
    ]}  # fmt: skip


def _tensor_info(name, dtype, rank):
    return {"dtype": TENSORFLOW_DTYPES[dtype], "name": name,
            "tensor_shape": {"dim": [{"size": "-1", "name": ""}] * rank,
                             "unknown_rank": False}}  # fmt: skip


def model_metadata(model_name, version, language_inputs=()):
    """`GET /v1/models/NAME/metadata`: the signatures, in TF Serving's JSON shape."""
    signature_defs = {
        name: {
            "inputs": {n: _tensor_info(n, *spec) for n, spec in declared["inputs"].items()},
            "outputs": {n: _tensor_info(n, *spec) for n, spec in declared["outputs"].items()},
            "method_name": "tensorflow/serving/predict",
        }
        for name, declared in signatures_of(language_inputs)[0].items()
    }
    return {
        "model_spec": {"name": model_name, "signature_name": "", "version": str(version)},
        "metadata": {"signature_def": {"signature_def": signature_defs}},
    }
