"""One rule for the languages a request names (tests/fixtures/request_languages.json), followed
alike by the Python runtimes, the SavedModel's text signatures and the JavaScript the page and
Node.js share."""

import json
import shutil
import subprocess

import pytest
import tensorflow as tf

from export import serving_graph
from pipeline.config import PROJECT_ROOT
from pipeline.core.multilingual import LANGUAGE_NAMES, RequestLanguages

CASES_FILE = PROJECT_ROOT / "tests" / "fixtures" / "request_languages.json"
CASES = json.loads(CASES_FILE.read_text(encoding="utf-8"))
TARGET, SOURCE = LANGUAGE_NAMES


def case_id(case):
    asked = [case.get(name) for name in LANGUAGE_NAMES]
    return f"{case['model']}:{'-'.join(str(a) for a in asked)}:{case['sentence'][:8]}"


def cases_with(condition):
    return [pytest.param(c, id=case_id(c)) for c in CASES["cases"] if condition(c)]


def languages_of(case):
    return RequestLanguages.of(CASES["models"][case["model"]])


def expect(case, outcome):
    """Asserts `outcome` (`{"source", "prefix"}`, or `{"error": message}`) is the case's; an
    error must name the argument refused and the language it was given (`names_language`)."""
    if "error" not in case:
        assert outcome == {"source": case["source"], "prefix": case["prefix"]}
        return
    assert "error" in outcome, f"accepted: {outcome}"
    refused = case["error"]
    assert refused["argument"] in outcome["error"]
    if refused["language"] is not None:
        assert refused["language"] in outcome["error"]


@pytest.mark.parametrize("case", cases_with(lambda c: True))
def test_the_python_runtimes_follow_the_rule(case):
    languages, asked = languages_of(case), {n: case.get(n) for n in LANGUAGE_NAMES}
    try:
        [source] = languages.requests([case["sentence"]], **asked)
        prefixes = languages.target_prefixes([case["sentence"]], asked[TARGET])
    except ValueError as error:
        outcome = {"error": str(error)}
    else:
        outcome = {"source": source, "prefix": None if prefixes is None else prefixes[0]}
    expect(case, outcome)


def signature_takes(case):
    """Whether the SavedModel's text signature takes the case's request: it has an input for
    each language the model's requests name (`RequestLanguages.inputs`) and no other, and TF
    Serving refuses a request whose inputs differ from the signature's before the graph runs."""
    given = {name for name in LANGUAGE_NAMES if case.get(name) is not None}
    inputs = set(languages_of(case).inputs)
    return given == inputs or (given > inputs and "error" not in case)


@pytest.mark.parametrize("case", cases_with(signature_takes))
def test_the_saved_models_signatures_follow_the_rule(case):
    languages = languages_of(case)
    requests = serving_graph._requests(languages)
    asked = {name: tf.constant([case[name]]) for name in languages.inputs}
    try:
        sentences, prefixes = requests(tf.constant([case["sentence"]]), None, asked)
    except tf.errors.InvalidArgumentError as error:
        outcome = {"error": error.message}
    else:
        prefix = None if prefixes is None else prefixes.numpy()[0].decode()
        outcome = {"source": sentences.numpy()[0].decode(), "prefix": prefix}
    expect(case, outcome)


def test_the_pages_and_node_javascript_follows_the_rule():
    node = shutil.which("node")
    if node is None:
        pytest.skip("node is needed for the JavaScript examples")
    script = PROJECT_ROOT / "tests" / "request_languages.mjs"
    result = subprocess.run([node, str(script), str(CASES_FILE)], capture_output=True,
                            text=True, timeout=120, check=True)  # fmt: skip
    outcomes = [json.loads(line) for line in result.stdout.splitlines()]
    assert len(outcomes) == len(CASES["cases"])
    for case, outcome in zip(CASES["cases"], outcomes):
        expect(case, outcome)
