"""The search options' one declaration (`pipeline.decoding.search_options`) and all that
derives from it: the config's decode section, `SearchOptions`, the commands' flags, the
exported inputs."""

import dataclasses

import pytest

from pipeline import evaluate, translate
from pipeline.config import PROJECT_ROOT, SCHEMA, defaults
from pipeline.core.errors import UserError
from pipeline.decoding.search_options import (
    CONFIGURED_OPTIONS,
    EXPORTED_OPTIONS,
    SEARCH_OPTIONS,
    SearchOptions,
    exported_defaults,
)

LIBRARY = ("pipeline", "export", "layers")
# Where an option's code lives besides its declaration: the search (and, for an option that
# changes the output text, the translator that writes it).
SEARCH_CODE = {"pipeline/decoding/search_options.py", "pipeline/decoding/search.py"}
# A checkpoint family's translation of its library's generation settings into our options:
# a table of names, as its weight names are.
GENERATION_MAPPINGS = {"pipeline/pretrained/generation.py"}


def files_naming(name):
    """The library's modules that name `name`."""
    return {
        str(path.relative_to(PROJECT_ROOT))
        for package in LIBRARY
        for path in (PROJECT_ROOT / package).rglob("*.py")
        if name in path.read_text(encoding="utf-8")
    }


def test_the_decode_section_holds_the_configured_options():
    decode = defaults()["decode"]
    assert set(decode) == {"batch_size"} | {o.name for o in CONFIGURED_OPTIONS}
    for option in CONFIGURED_OPTIONS:
        assert decode[option.name] == option.default, option.name
        assert SCHEMA["decode"][option.name].choices == option.choices


def test_search_options_have_a_field_per_option_with_its_default():
    fields = {f.name: f.default for f in dataclasses.fields(SearchOptions)}
    assert fields == {o.name: o.default for o in SEARCH_OPTIONS}


def test_from_config_overrides_checks_and_widens_the_beam_for_n_best():
    decode = {**defaults()["decode"], "beam_size": 2}
    assert SearchOptions.from_config(decode).beam_size == 2
    assert SearchOptions.from_config(decode, n_best=4).beam_size == 4
    assert SearchOptions.from_config(decode, beam_size=6, min_length=None).min_length == 0
    with pytest.raises(UserError, match="n_best \\(4\\) cannot exceed beam_size \\(3\\)"):
        SearchOptions.from_config(decode, beam_size=3, n_best=4)
    with pytest.raises(UserError, match="length_penalty_type must be one of gnmt, average"):
        SearchOptions.from_config(decode, length_penalty_type="none")


@pytest.mark.parametrize(
    "command,left_out", [(translate, set()), (evaluate, {"n_best"})], ids=["translate", "evaluate"]
)
def test_each_command_has_a_flag_per_option(command, left_out):
    args = command.parse_args(["--workdir", "w"])
    assert {o.name for o in SEARCH_OPTIONS} - left_out <= set(vars(args))
    assert all(getattr(args, o.name) is None for o in SEARCH_OPTIONS if o.name not in left_out)


@pytest.mark.parametrize(
    "flags,message",
    [
        (["--sampling-topp", "2"], "--sampling-topp must be at most 1.0, got 2.0"),
        (["--sampling-temperature", "0"], "--sampling-temperature must be above 0"),
        (["--no-repeat-ngram-size", "-1"], "--no-repeat-ngram-size must be at least 0"),
        (["--sampling-temperature", "1", "--n-best", "2"], "--n-best needs beam search"),
    ],
)
def test_a_bad_flag_is_named_before_the_model_loads(tmp_path, capsys, flags, message):
    with pytest.raises(SystemExit) as exit_info:
        translate.main(["--workdir", str(tmp_path), *flags])
    assert exit_info.value.code == 2
    assert message in capsys.readouterr().err


def test_exported_defaults_come_from_the_decode_section():
    decode = {**defaults()["decode"], "beam_size": 3, "no_repeat_ngram_size": 2}
    assert exported_defaults(decode) == {
        o.name: decode[o.name] if o.configured else o.default for o in EXPORTED_OPTIONS
    }


@pytest.mark.parametrize(
    "option",
    ["coverage_penalty", "min_length", "max_length_ratio", "sampling_topk",
     "no_repeat_ngram_size"],
)  # fmt: skip
def test_an_option_lives_in_its_declaration_and_the_search_only(option):
    """What a new option touches: its declaration and its search code; the config, the
    flags, `SearchOptions`, the exported signatures and `model.json` derive from it."""
    assert files_naming(option) - GENERATION_MAPPINGS == SEARCH_CODE


def test_an_unknown_option_is_named_as_a_type_error():
    with pytest.raises(TypeError, match="unknown search option 'beam_width'"):
        SearchOptions().with_overrides(beam_width=4)


def test_overrides_widen_the_beam_to_n_best_unless_the_beam_is_given():
    options = SearchOptions(beam_size=2)
    assert options.with_overrides(n_best=3).beam_size == 3
    assert options.with_overrides(n_best=1).beam_size == 2
    with pytest.raises(UserError, match="cannot exceed"):
        options.with_overrides(n_best=3, beam_size=2)
    assert SearchOptions.from_config({"beam_size": 2}, n_best=4).beam_size == 4
