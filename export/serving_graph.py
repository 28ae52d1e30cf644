"""The exported graph: a `tf.Module` whose functions become the SavedModel's signatures.

The module tracks only the model's underlying `tf.Variable`s (and the tokenizers' resources),
never the Keras model itself: a tracked Keras 3 model saves a graph that `tf.saved_model.load`
reads but the session-based loader of TF Serving and `saved_model_cli run` cannot.
Search runs on the model's step function (`pipeline.decoding.search`), as it does in process.
"""

import dataclasses
import functools
import inspect

import keras
import tensorflow as tf
import tensorflow_text as tf_text

from export.signature import (
    BEAM_SEARCH,
    SCORES,
    SEARCH_OUTPUTS,
    SENTENCES,
    SERVING_DEFAULT,
    SOURCE_IDS,
    TARGET_PREFIX,
    TRANSLATIONS,
    WITH_PREFIX,
)
from pipeline.core import multilingual
from pipeline.core.graph_function import graph_function
from pipeline.core.translation_text import EDGE_SPACES
from pipeline.data.tokenizer import PAD_ID, UNK_ID
from pipeline.decoding.search import search as run_search
from pipeline.decoding.search_options import (
    EXPORTED_OPTIONS,
    GREEDY_EXPORTED_OPTIONS,
    OPTIONS_BY_NAME,
    SearchOptions,
    exported_defaults,
)

WEIGHT_INPUT = "weight_{}"  # the model's i-th variable, as an input of `with_weight_inputs`


def _search_signature(search, defaults, options=EXPORTED_OPTIONS, prefix_required=False,
                      variables=()):  # fmt: skip
    """`search(source_ids, target_prefix, **options)` as a `tf.function` whose inputs are
    `SOURCE_IDS`, `TARGET_PREFIX` (default: none, unless `prefix_required`) and `options`,
    each with its default (a tensor default becomes the SignatureDef's default, so that a
    request may leave the input out). With `variables` (the model's), each is read from an
    input of its own, `WEIGHT_INPUT`, before the others (`keras.StatelessScope`): a graph
    without the weights, whatever their size."""
    kind = inspect.Parameter.POSITIONAL_OR_KEYWORD
    no_prefix = inspect.Parameter.empty if prefix_required else tf.zeros([0, 0], tf.int32)
    weight_names = [WEIGHT_INPUT.format(i) for i in range(len(variables))]
    signature = inspect.Signature(
        [inspect.Parameter(name, kind) for name in weight_names]
        + [
            inspect.Parameter(SOURCE_IDS, kind),
            inspect.Parameter(TARGET_PREFIX, kind, default=no_prefix),
        ]
        + [inspect.Parameter(o.name, kind, default=tf.constant(defaults[o.name])) for o in options]
    )

    def search_with_options(*args, **kwargs):
        bound = signature.bind(*args, **kwargs)
        bound.apply_defaults()
        weights = [bound.arguments.pop(name) for name in weight_names]
        with keras.StatelessScope(state_mapping=list(zip(variables, weights))):
            return search(**bound.arguments)

    search_with_options.__signature__ = signature
    input_signature = (
        [tf.TensorSpec(v.shape, v.dtype, name=n) for v, n in zip(variables, weight_names)]
        + [
            tf.TensorSpec([None, None], tf.int32, name=SOURCE_IDS),
            tf.TensorSpec([None, None], tf.int32, name=TARGET_PREFIX),
        ]
        + [tf.TensorSpec([], o.dtype, name=o.name) for o in options]
    )
    return graph_function(search_with_options, input_signature=input_signature)


def _language_lookup(values, name, side):
    """`lookup(languages, sentences)`: the string of `values` ({code: string}) of each
    sentence's language, in the graph; a language the model does not have, or not one a
    sentence, fails the request with a message naming `name`, the model's languages and those
    asked."""
    known = tf.constant(list(values))
    strings = tf.constant(list(values.values()))
    message = (f"{name}: an unknown language, or not one a sentence; this model translates "
               f"{side} {multilingual.listed(values)}")  # fmt: skip

    def lookup(languages, sentences):
        matches = tf.equal(languages[:, None], known[None, :])
        fits = tf.logical_and(tf.equal(tf.size(languages), tf.size(sentences)),
                              tf.reduce_all(tf.reduce_any(matches, axis=1)))  # fmt: skip
        with tf.control_dependencies([tf.debugging.Assert(fits, [message, "asked:", languages])]):
            return tf.gather(strings, tf.argmax(tf.cast(matches, tf.int32), axis=1))

    return lookup


def _requests(languages):
    """`requests(sentences, target_prefix, asked)` -> (sentences, target prefixes) as the model
    takes them, in the graph, as `multilingual.RequestLanguages` makes them in Python (`asked`:
    {input name: a language a sentence}): each non-blank sentence after its language's tag,
    and for a model whose targets start with their language's token, that token before each
    prefix."""
    target_name, source_name = multilingual.LANGUAGE_NAMES
    tag_name, tag, first = None, None, None
    if languages.source_tags:
        tag_name, tag = source_name, _language_lookup(languages.source_tags, source_name, "from")
    elif languages.tags:
        tag_name, tag = target_name, _language_lookup(languages.tags, target_name, "into")
    if languages.target_tokens:
        first = _language_lookup(languages.target_tokens, target_name, "into")

    def requests(sentences, target_prefix, asked):
        if tag:
            tagged = tf.strings.join([tag(asked[tag_name], sentences), " ", sentences])
            sentences = tf.where(tf.equal(tf.strings.strip(sentences), ""), sentences, tagged)
        if first:
            tokens = first(asked[target_name], sentences)
            own = target_prefix if target_prefix is not None else tf.fill(tf.shape(tokens), "")
            target_prefix = tf.strings.strip(tf.strings.join([tokens, " ", own]))
        return sentences, target_prefix

    return requests


def _within_range(option, value):
    """A request's `value` of a search `option`, clipped to the option's declared range."""
    value = tf.convert_to_tensor(value, option.dtype)
    if option.minimum is not None:
        value = tf.maximum(value, tf.cast(option.minimum, option.dtype))
    maximum = option.request_maximum if option.maximum is None else option.maximum
    if maximum is not None:
        value = tf.minimum(value, tf.cast(maximum, option.dtype))
    return value


def _text_signature(translate_text, languages, with_prefix):
    """`translate` (`with_prefix`: `translate_with_prefix`) as a `tf.function` of the
    sentences, the prefixes and the model's language inputs (`languages.inputs`), in that
    order, the requests made as `_requests` makes them, then `translate_text(sentences,
    target_prefix)`."""
    requests = _requests(languages)
    specs = [tf.TensorSpec([None], tf.string, name=SENTENCES)]
    specs += [tf.TensorSpec([None], tf.string, name=TARGET_PREFIX)] * with_prefix
    specs += [tf.TensorSpec([None], tf.string, name=n) for n in languages.inputs]

    @graph_function(input_signature=specs)
    def translate(sentences, *inputs):
        target_prefix = inputs[0] if with_prefix else None
        asked = dict(zip(languages.inputs, inputs[with_prefix:]))
        sentences, target_prefix = requests(sentences, target_prefix, asked)
        if target_prefix is None:
            target_prefix = tf.constant([], tf.string)
        return translate_text(sentences, target_prefix)

    return translate


class TranslationGraph(tf.Module):
    """Signatures of a trained model, with the decoding defaults of its configuration.

    `beam_search`: source ids int32 `[batch, src_len]` (right-padded with 0) and the optional
    scalars of `pipeline.decoding.search_options.EXPORTED_OPTIONS` -> `ids` int32 `[batch,
    n_best, width]`, `lengths` int32 `[batch, n_best]`, `scores` float32 `[batch, n_best]` and
    `attention` float32 `[batch, n_best, width, src_len]`. Each sentence has its own length
    limit (`max_length`, or else from its own source length; capped at `max_length_cap` whatever
    is asked), so that its translation does not depend on the rest of the batch; `width` is the
    batch's longest limit. Sources are cut at `decode.max_source_length`; ids outside the
    vocabulary read as <unk>; an all-padding source gives ids all 0, length 0 and score 0.

    `search_function(greedy_only=True)` (ONNX only, `export.onnx_search: greedy`):
    `beam_search` with the greedy search alone, whose loop is a fraction of the beam search's;
    its inputs are the source ids, the prefix and `GREEDY_EXPORTED_OPTIONS`, the other options
    as configured, and its outputs are `beam_search`'s with n = 1.

    `beam_search` takes an optional `target_prefix` (`export.signature.TARGET_PREFIX`), and
    `translate_with_prefix` is `translate` with a text prefix per sentence: what each
    translation must start with; it is part of the output and of its score.

    `translate` (the `serving_default` signature): sentences string `[batch]` ->
    `translations` string `[batch]` and `scores` float32 `[batch]`, with SentencePiece
    tokenisation (sources cut at `decode.max_source_length` pieces), beam search with the defaults
    and detokenisation in the graph. An empty sentence translates to an empty string.
    """

    def __init__(self, model, source_model_proto, target_model_proto, decode, languages=None,
                 strip_translation_spaces=False):  # fmt: skip
        """`languages`: how requests name their languages (`multilingual.RequestLanguages`),
        whose `inputs` the text signatures take, a language a sentence; None: a bilingual
        model's, which takes none."""
        super().__init__(name="translation")
        # The variables, not the model: see the module docstring.
        self.model_variables = [variable.value for variable in model.variables]
        self.weight_bytes = sum(v.shape.num_elements() * v.dtype.size for v in self.model_variables)
        # Distinct names matter: the SentencePiece kernel shares its model resource by node
        # name, so two unnamed tokenizers restored from a SavedModel both get the first model.
        self.source_tokenizer = tf_text.SentencepieceTokenizer(
            source_model_proto, tf.int32, name="source_sentencepiece"
        )
        self.target_tokenizer = tf_text.SentencepieceTokenizer(
            target_model_proto, tf.int32, name="target_sentencepiece"
        )
        self.strip_translation_spaces = strip_translation_spaces
        self.max_source_length = max_source_length = decode["max_source_length"]
        self.defaults = defaults = exported_defaults(decode)
        configured = SearchOptions.from_config(decode)
        cap = self.max_length_cap = decode["max_length_cap"]

        source_vocab_size, target_vocab_size = model.source_vocab_size, model.target_vocab_size

        def within_vocabulary(ids, size):
            return tf.where(tf.logical_and(ids >= 0, ids < size), ids, UNK_ID)

        def search(source_ids, target_prefix, base=configured, **options):
            # Requests are untrusted: ids outside the vocabulary read as <unk>, long sources
            # and prefixes are cut, and each option is clipped to its declared range.
            source_ids = within_vocabulary(source_ids, source_vocab_size)[:, :max_source_length]
            target_prefix = within_vocabulary(target_prefix, target_vocab_size)[:, : cap - 1]
            options = dataclasses.replace(base, **{
                name: _within_range(OPTIONS_BY_NAME[name], value)
                for name, value in options.items()
            })  # fmt: skip
            outputs = run_search(model, source_ids, options, target_prefix)
            return dict(zip(SEARCH_OUTPUTS, outputs))

        # Python ints, not inputs: the search that `run_search` picks is the greedy one.
        greedy = dataclasses.replace(configured, beam_size=1, n_best=1)
        self.greedy_defaults = exported_defaults(decode, GREEDY_EXPORTED_OPTIONS)
        # A model whose targets start with their language's token needs that token as the
        # prefix of `beam_search` (the text signatures make it from the language asked).
        self.prefix_required = model.target_language_first
        variables = list(model.variables)

        def search_function(greedy_only=False, with_weight_inputs=False):
            """`beam_search`, or with `greedy_only` `greedy_search` (ONNX only), as a new
            `tf.function`; `with_weight_inputs`: the model's variables as its first inputs
            (`WEIGHT_INPUT`, in `weight_variables`' order)."""
            return _search_signature(
                functools.partial(search, base=greedy) if greedy_only else search,
                self.greedy_defaults if greedy_only else defaults,
                GREEDY_EXPORTED_OPTIONS if greedy_only else EXPORTED_OPTIONS,
                self.prefix_required, variables if with_weight_inputs else (),
            )  # fmt: skip

        self.search_function = search_function
        self.weight_variables = lambda: variables

        def translate_text(sentences, target_prefix):
            pieces = self.source_tokenizer.tokenize(sentences)[:, :max_source_length]
            source_ids = pieces.to_tensor(PAD_ID)
            # A batch of empty sentences still needs one (padding) column to encode.
            width = tf.maximum(tf.shape(source_ids)[1], 1)
            source_ids = tf.pad(source_ids, [[0, 0], [0, width - tf.shape(source_ids)[1]]])
            prefix_ids = self.target_tokenizer.tokenize(target_prefix).to_tensor(PAD_ID)
            best = search(source_ids, prefix_ids, **defaults)
            return {
                TRANSLATIONS: self.translation_text(best["ids"][:, 0]),
                SCORES: best["scores"][:, 0],
            }

        languages = languages or multilingual.RequestLanguages.of({})
        self.beam_search = search_function()
        self.translate = _text_signature(translate_text, languages, with_prefix=False)
        self.translate_with_prefix = _text_signature(translate_text, languages, with_prefix=True)

    def translation_text(self, ids):
        """Target ids int32 `[batch, length]` -> their translations, string `[batch]`, as
        `pipeline.core.translation_text` writes them."""
        text = self.target_tokenizer.detokenize(ids)
        if not self.strip_translation_spaces:
            return text
        return tf.strings.regex_replace(text, EDGE_SPACES, "")

    def signatures(self):
        return {
            SERVING_DEFAULT: self.translate,
            BEAM_SEARCH: self.beam_search,
            WITH_PREFIX: self.translate_with_prefix,
        }
