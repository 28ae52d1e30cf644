"""Every search option, declared once: name, type, default, range and meaning.

From `SEARCH_OPTIONS` come the config's `decode` keys (`configured`), `SearchOptions`, the
search flags of `pipeline.translate` and `pipeline.evaluate`, and the scalar inputs of the
exported `beam_search` signature and of `model.json` (`exported`). A new option is one
declaration here plus its search code. No TensorFlow here: the ONNX runtime imports it.
"""

import dataclasses
import math
import numbers
from typing import Any

from pipeline.core.errors import UserError

MAX_BEAM_SIZE = 64  # an exported graph clips a larger requested beam to it
BEAM_STOPPING = ("k_finished", "no_improvement", "never")
CAPPED_HYPOTHESES = ("fill", "rank")


# What a value of each option kind may be (numpy's scalars too), and its name in an error.
KIND_CHECKS = {int: numbers.Integral, float: numbers.Real, str: str, bool: bool}
KIND_NAMES = {int: "an integer", float: "a number", str: "a string", bool: "true or false"}


@dataclasses.dataclass(frozen=True)
class SearchOption:
    name: str
    kind: type  # int, float, str or bool
    default: Any
    meaning: str
    minimum: float | None = None
    maximum: float | None = None
    positive: bool = False  # above 0 (a minimum of 0 excluded)
    choices: tuple = ()
    nullable: bool = False
    configured: bool = False  # a key of the config's decode section: each model's default
    exported: bool = False  # a scalar input of the exported beam_search signature
    greedy_exported: bool = False  # also one of a greedy ONNX export (export.onnx_search)
    request_maximum: float | None = None  # an exported graph clips a request above it

    @property
    def dtype(self):
        """Its numpy and TensorFlow dtype name in an exported graph."""
        return {int: "int32", float: "float32"}[self.kind]

    @property
    def flag(self):
        return "--" + self.name.replace("_", "-")

    def problem(self, value):
        """What is wrong with `value` for this option, or None."""
        if value is None:
            return None if self.nullable else "cannot be null"
        if not isinstance(value, KIND_CHECKS[self.kind]) or (
            self.kind is not bool and isinstance(value, bool)
        ):
            return f"must be {KIND_NAMES[self.kind]}, got {value!r}"
        if self.kind is float and not math.isfinite(value):
            return f"must be a finite number, got {value!r}"
        if self.choices and value not in self.choices:
            return f"must be one of {', '.join(map(str, self.choices))}; got {value!r}"
        if self.positive and value <= 0:
            return f"must be above 0, got {value!r}"
        if self.minimum is not None and value < self.minimum:
            return f"must be at least {self.minimum}, got {value!r}"
        if self.maximum is not None and value > self.maximum:
            return f"must be at most {self.maximum}, got {value!r}"
        return None


SEARCH_OPTIONS = (
    SearchOption("beam_size", int, 5, f"hypotheses kept per sentence (1: greedy; exports clip "
                 f"to {MAX_BEAM_SIZE})", minimum=1, configured=True, exported=True,
                 request_maximum=MAX_BEAM_SIZE),
    SearchOption("n_best", int, 1, "hypotheses returned per sentence, best first (at most "
                 "beam_size)", minimum=1, exported=True),
    SearchOption("length_penalty", float, 0.6, "alpha of the length penalty "
                 "(length_penalty_type)", minimum=0.0, configured=True, exported=True),
    SearchOption("length_penalty_type", str, "gnmt", "gnmt: Wu et al.'s ((5 + length) / 6) "
                 "^ alpha; average: the score per token", choices=("gnmt", "average"),
                 configured=True),
    SearchOption("coverage_penalty", float, 0.0, "beta of Wu et al.'s coverage penalty",
                 minimum=0.0, configured=True),
    # no_improvement and never are transformers' early_stopping false and "never" (true is
    # k_finished): `search._is_done` says how each decides.
    SearchOption("beam_stopping", str, "k_finished", "a sentence's beam search ends with k "
                 "hypotheses ended, or also none open that can still rank above them",
                 choices=BEAM_STOPPING, configured=True),
    SearchOption("force_eos_at_limit", bool, False, "a hypothesis at the length limit ends "
                 "with </s>, at log-probability 0 (transformers' forced_eos_token_id)",
                 configured=True),
    SearchOption("capped_hypotheses", str, "fill", "hypotheses cut at the length limit fill "
                 "places no ended one took, or rank with them (transformers' generate())",
                 choices=CAPPED_HYPOTHESES, configured=True),
    SearchOption("min_length", int, 0, "no end of sentence before this many tokens",
                 minimum=0, configured=True),
    SearchOption("no_repeat_ngram_size", int, 0, "no n-gram of this size appears twice in a "
                 "hypothesis; 0: off", minimum=0, configured=True, exported=True),
    SearchOption("max_length", int, 0, "the most tokens of each translation (within "
                 "max_length_cap); 0: max_length_ratio x its source length + "
                 "max_length_offset", minimum=0, exported=True, greedy_exported=True),
    SearchOption("max_length_ratio", float, 1.5, "a translation's length limit per source "
                 "token", minimum=0.0, configured=True),
    SearchOption("max_length_offset", int, 10, "tokens added to max_length_ratio x the "
                 "source length, a translation's length limit", minimum=0, configured=True),
    SearchOption("max_length_cap", int, 250, "no translation is ever longer, whatever is "
                 "asked", minimum=1, configured=True),
    SearchOption("max_source_length", int, 250, "longer inputs are cut to this many pieces, "
                 "in every runtime", minimum=1, configured=True),
    SearchOption("replace_unknown", bool, False, "each <unk> becomes the source piece it "
                 "attends to most", configured=True),
    SearchOption("sampling_temperature", float, None, "sample with this temperature instead "
                 "of searching (null: search)", positive=True, nullable=True),
    SearchOption("sampling_topk", int, 0, "sampling: from the k likeliest tokens (0: all)",
                 minimum=0),
    SearchOption("sampling_topp", float, 1.0, "sampling: from the smallest set of tokens "
                 "holding this probability", positive=True, maximum=1.0),
    SearchOption("seed", int, 0, "sampling: each sentence draws from it and its own text"),
)  # fmt: skip
OPTIONS_BY_NAME = {option.name: option for option in SEARCH_OPTIONS}
CONFIGURED_OPTIONS = tuple(option for option in SEARCH_OPTIONS if option.configured)
EXPORTED_OPTIONS = tuple(option for option in SEARCH_OPTIONS if option.exported)
GREEDY_EXPORTED_OPTIONS = tuple(option for option in SEARCH_OPTIONS if option.greedy_exported)


def check_values(values, name_of=lambda option: option.name):
    """Raises a `UserError` naming (by `name_of`) the first option whose value is wrong, a
    `TypeError` for a name that is no search option (a caller's mistake)."""
    for name, value in values.items():
        if name not in OPTIONS_BY_NAME:
            raise TypeError(f"unknown search option {name!r}: the options are "
                            f"{', '.join(OPTIONS_BY_NAME)}")  # fmt: skip
        problem = OPTIONS_BY_NAME[name].problem(value)
        if problem:
            raise UserError(f"{name_of(OPTIONS_BY_NAME[name])} {problem}")
    n_best, beam_size = values.get("n_best", 1), values.get("beam_size")
    n_best_name, beam_size_name, sampling_name = (
        name_of(OPTIONS_BY_NAME[name]) for name in ("n_best", "beam_size", "sampling_temperature")
    )
    if beam_size is not None and n_best > beam_size:
        raise UserError(f"{n_best_name} ({n_best}) cannot exceed {beam_size_name} ({beam_size})")
    if values.get("sampling_temperature") is not None and n_best > 1:
        raise UserError(f"{n_best_name} needs beam search, not sampling ({sampling_name})")


def _from_config(cls, decode_config, **overrides):
    """The model's decode section, then `overrides` (as `with_overrides`)."""
    values = {option.name: decode_config[option.name] for option in CONFIGURED_OPTIONS
              if option.name in decode_config}  # fmt: skip
    return cls(**values).with_overrides(**overrides)


def _with_overrides(self, **overrides):
    """These options with `overrides` (None: not given), checked; a beam narrower than a
    requested `n_best` widens to it unless the beam was asked for too."""
    overrides = {name: value for name, value in overrides.items() if value is not None}
    check_values(overrides)
    if "beam_size" not in overrides:
        overrides["beam_size"] = max(self.beam_size, overrides.get("n_best", self.n_best))
    return dataclasses.replace(self, **overrides)


SearchOptions = dataclasses.make_dataclass(
    "SearchOptions",
    [
        (o.name, o.kind | None if o.nullable else o.kind, dataclasses.field(default=o.default))
        for o in SEARCH_OPTIONS
    ],  # fmt: skip
    namespace={
        "__doc__": "How to search, one field per `SEARCH_OPTIONS` entry: beam search (beam_size "
        "1 is greedy) or, with a sampling_temperature, sampling. In a graph that takes an "
        "option as an input, its field holds that input's tensor.",
        "__module__": __name__,
        "from_config": classmethod(_from_config),
        "with_overrides": _with_overrides,
    },
    frozen=True,
)


def exported_defaults(decode_config, options=EXPORTED_OPTIONS):
    """{exported option: its default} for a model's decode configuration."""
    return {o.name: o.kind(decode_config[o.name] if o.configured else o.default) for o in options}


def add_search_arguments(parser, exclude=()):
    """One flag per search option not in `exclude`, its default None (the model's own)."""
    group = parser.add_argument_group("search (defaults: the decode section of the config)")
    for option in SEARCH_OPTIONS:
        if option.name in exclude:
            continue
        if option.kind is bool:
            group.add_argument(option.flag, action="store_true", default=None,
                               help=option.meaning)  # fmt: skip
        else:
            group.add_argument(option.flag, type=option.kind, choices=option.choices or None,
                               help=option.meaning)  # fmt: skip
    return group


def search_arguments(args):
    """The search options given on the command line, checked and named by their flags."""
    given = {option.name: getattr(args, option.name) for option in SEARCH_OPTIONS
             if getattr(args, option.name, None) is not None}  # fmt: skip
    check_values(given, name_of=lambda option: option.flag)
    return given
