"""What the exported models take and give, declared once for every side that speaks to them.

The serving graph builds its signatures from these declarations, the ONNX export gives each
search option its default and lists them in `model.json`, and the ONNX runtime, the TF
Serving client and the Node.js example fill their requests from them. No TensorFlow here: the
runtime and the client import this module without it.
"""

import dataclasses

SERVING_DEFAULT = "serving_default"  # sentences string [batch] -> translations, scores
BEAM_SEARCH = "beam_search"  # source ids and the search options -> SEARCH_OUTPUTS
# sentences and TARGET_PREFIX strings [batch] -> translations, scores: `serving_default`
# with a prefix per sentence ("" for none), both inputs required (serving_default's inputs
# stay as they were, so that no caller of it has to change).
WITH_PREFIX = "translate_with_prefix"

SENTENCES = "sentences"  # string [batch]: the input of `serving_default`
SOURCE_IDS = "source_ids"  # int32 [batch, src_len], right-padded with 0
# What each translation must start with. `beam_search`: int32 [batch, len] target ids,
# right-padded with 0, optional (rows past those given, as in the default, which has none,
# are empty prefixes); `translate_with_prefix`: string [batch].
TARGET_PREFIX = "target_prefix"
SEARCH_OUTPUTS = ("ids", "lengths", "scores", "attention")
MAX_BEAM_SIZE = 64  # a larger requested beam is clipped to it
# The ONNX export's description (model files, vocabularies, inputs, special ids), beside it.
METADATA_FILE = "model.json"


@dataclasses.dataclass(frozen=True)
class SearchOption:
    """A scalar input of `beam_search` that a request may leave out."""

    name: str
    dtype: str  # a numpy and TensorFlow dtype name
    meaning: str
    decode_key: str | None = None  # the default comes from this key of the decode config
    fixed_default: int | float | None = None  # ... or is this value for every model

    def default(self, decode_config):
        value = decode_config[self.decode_key] if self.decode_key else self.fixed_default
        return float(value) if self.dtype.startswith("float") else int(value)


SEARCH_OPTIONS = (
    SearchOption(
        "beam_size", "int32", f"hypotheses kept per sentence, within [1, {MAX_BEAM_SIZE}]",
        decode_key="beam_size",
    ),
    SearchOption(
        "n_best", "int32", "hypotheses returned per sentence (at most beam_size)",
        fixed_default=1,
    ),
    SearchOption(
        "length_penalty", "float32", "alpha of the length penalty (decode.length_penalty_type)",
        decode_key="length_penalty",
    ),
    SearchOption(
        "max_length", "int32",
        "the most tokens of each sentence's translation (capped at decode.max_length_cap); "
        "0: decode.max_length_ratio x its source length + decode.max_length_offset",
        fixed_default=0,
    ),
    SearchOption(
        "no_repeat_ngram_size", "int32",
        "no n-gram of this size appears twice in a hypothesis; 0: off",
        decode_key="no_repeat_ngram_size",
    ),
)  # fmt: skip
SEARCH_OPTION_NAMES = tuple(option.name for option in SEARCH_OPTIONS)


def search_defaults(decode_config):
    """{option name: default} for a model's decode configuration."""
    return {option.name: option.default(decode_config) for option in SEARCH_OPTIONS}


def option_dtypes(options):
    """{name: dtype name} of `options`, refusing a name that is not a search option."""
    dtypes = {option.name: option.dtype for option in SEARCH_OPTIONS}
    unknown = sorted(set(options) - set(dtypes))
    if unknown:
        raise TypeError(f"unknown search option {unknown[0]!r}; expected {SEARCH_OPTION_NAMES}")
    return {name: dtypes[name] for name in options}
