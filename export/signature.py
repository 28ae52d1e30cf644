"""What the exported models take and give, declared once for every side that speaks to them.

The serving graph builds its signatures from these declarations and from the exported options
of `pipeline.decoding.search_options`, the ONNX export gives each of those its default and
lists them in `model.json`, and the ONNX runtime, the TF Serving client and the Node.js example fill
their requests from them. No TensorFlow here: the runtime and the client import this module
without it.
"""

from pipeline.core.multilingual import LANGUAGE_NAMES
from pipeline.decoding.search_options import EXPORTED_OPTIONS

SERVING_DEFAULT = "serving_default"  # sentences string [batch] -> translations, scores
BEAM_SEARCH = "beam_search"  # source ids and the search options -> SEARCH_OUTPUTS
# sentences and TARGET_PREFIX strings [batch] -> translations, scores: `serving_default`
# with a prefix per sentence ("" for none), both inputs required (serving_default's inputs
# stay as they were, so that no caller of it has to change).
WITH_PREFIX = "translate_with_prefix"

SENTENCES = "sentences"  # string [batch]: the input of `serving_default`
SOURCE_IDS = "source_ids"  # int32 [batch, src_len], right-padded with 0
# string [batch]: the language each sentence is translated into, and the one it is in;
# inputs of the text signatures of the models that take them (`RequestLanguages.inputs`):
# the target's of a multilingual model, both of a many-to-many import (a bilingual export's
# signatures are as above).
TARGET_LANGUAGE, SOURCE_LANGUAGE = LANGUAGE_NAMES
# What each translation must start with. `beam_search`: int32 [batch, len] target ids,
# right-padded with 0, optional (rows past those given, as in the default, which has none,
# are empty prefixes); `translate_with_prefix`: string [batch].
TARGET_PREFIX = "target_prefix"
SEARCH_OUTPUTS = ("ids", "lengths", "scores", "attention")
TRANSLATIONS, SCORES = "translations", "scores"  # the outputs of the text signatures
# The ONNX export's description (model files, vocabularies, inputs, special ids), beside it.
METADATA_FILE = "model.json"
EXPORTED_OPTION_NAMES = tuple(option.name for option in EXPORTED_OPTIONS)


# Each signature's inputs and outputs as {name: (dtype, rank)}, in the SavedModel's terms; the
# server (export.serve) describes and checks requests by it, and a test holds the SavedModel
# to it. `beam_search` takes the exported options as scalars.
SIGNATURES = {
    SERVING_DEFAULT: {
        "inputs": {SENTENCES: ("string", 1)},
        "outputs": {TRANSLATIONS: ("string", 1), SCORES: ("float32", 1)},
    },
    WITH_PREFIX: {
        "inputs": {SENTENCES: ("string", 1), TARGET_PREFIX: ("string", 1)},
        "outputs": {TRANSLATIONS: ("string", 1), SCORES: ("float32", 1)},
    },
    BEAM_SEARCH: {
        "inputs": {SOURCE_IDS: ("int32", 2), TARGET_PREFIX: ("int32", 2),
                   **{option.name: (option.dtype, 0) for option in EXPORTED_OPTIONS}},
        "outputs": dict(zip(SEARCH_OUTPUTS, [("int32", 3), ("int32", 2), ("float32", 2),
                                             ("float32", 4)])),
    },
}  # fmt: skip
# The inputs a request must give; the others take the SavedModel's defaults.
REQUIRED_INPUTS = {SERVING_DEFAULT: (SENTENCES,), WITH_PREFIX: (SENTENCES, TARGET_PREFIX),
                   BEAM_SEARCH: (SOURCE_IDS,)}  # fmt: skip
TEXT_SIGNATURES = (SERVING_DEFAULT, WITH_PREFIX)  # strings in, translations out


def signatures_of(language_inputs=()):
    """(`SIGNATURES`, `REQUIRED_INPUTS`) of an export whose text signatures also take, and
    need, `language_inputs` (`TARGET_LANGUAGE`, and `SOURCE_LANGUAGE` where the model takes
    it; none for a bilingual model). A model that takes its source's language (a many-to-many
    import) starts its targets with their language's token: its `beam_search` needs
    `TARGET_PREFIX`, which holds that token."""
    languages = {name: ("string", 1) for name in language_inputs}
    signatures = {name: {**declared, "inputs": {**declared["inputs"], **languages}}
                  if name in TEXT_SIGNATURES else declared
                  for name, declared in SIGNATURES.items()}  # fmt: skip
    required = {name: (*inputs, *language_inputs) if name in TEXT_SIGNATURES else inputs
                for name, inputs in REQUIRED_INPUTS.items()}  # fmt: skip
    if SOURCE_LANGUAGE in language_inputs:
        required[BEAM_SEARCH] = (*required[BEAM_SEARCH], TARGET_PREFIX)
    return signatures, required


def option_dtypes(options):
    """{name: dtype name} of `options`, refusing a name that is not an exported option."""
    dtypes = {option.name: option.dtype for option in EXPORTED_OPTIONS}
    unknown = sorted(set(options) - set(dtypes))
    if unknown:
        raise TypeError(
            f"unknown search option {unknown[0]!r}: an exported model takes "
            f"{', '.join(EXPORTED_OPTION_NAMES)}"
        )
    return {name: dtypes[name] for name in options}
