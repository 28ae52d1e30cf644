"""One model for many directions, trained on one multi-way parallel set.

A target-language tag (`<2fr>`) before each source sentence tells one shared model which
language to translate into (Johnson et al., 2017, "Google's Multilingual Neural Machine
Translation System"). The tags are user-defined symbols of one shared SentencePiece
vocabulary over every language, so they are never split into pieces; every runtime adds the
same text before a sentence and so gives the same ids.

The set is a file per language, aligned line by line across all of them (`data.multiway_*`).
`data.directions` picks the ordered pairs to train; the others are left for zero-shot
translation, or learnt from the model's own translations of a pivot language
(`data.synthetic_directions`, which `pipeline.backtranslate` writes);
`pipeline.data.corpus.scan_multiway` reads the set and mixes the directions.
Plain Python: the configuration, the data pipeline and every runtime read it.
"""

import dataclasses
import itertools
import re
from pathlib import Path

from pipeline.core.errors import UserError

# A language code: two or three letters, maybe a region or script (NLLB's deu_Latn); and a
# file name ending in a two-letter one (.de, .pt_BR; three letters would take .txt).
LANGUAGE_CODE = re.compile(r"[a-z]{2,3}(?:[_-][A-Za-z]{2,4})?")
LANGUAGE_SUFFIX = re.compile(r"\.([a-z]{2}(?:[_-][A-Za-z]{2,4})?)(?:\.gz)?$")
SPLITS = ("train", "valid", "test")
SPLIT_KEYS = {split: f"multiway_{split}" for split in SPLITS}
ALL_DIRECTIONS = "all"
TO_AND_FROM = "to_and_from:"  # the directions into and out of one language (English-centric)


TAG_OPEN, TAG_CLOSE = "<2", ">"  # around a language code: the tag asking for that language


def language_tag(language):
    """The symbol that asks for a translation into `language`."""
    return f"{TAG_OPEN}{language}{TAG_CLOSE}"


def leading_tag_pieces(pieces, tags):
    """How many of a tagged source's first SentencePiece `pieces` spell its tag (the tag and
    a lone word boundary before it, or a piece that holds both); 0 when it starts with no tag
    of `tags` ({code: tag})."""
    spelled = set(tags.values())
    for index, piece in enumerate(pieces[:2]):
        if piece in spelled or piece.lstrip("\u2581") in spelled:
            return index + 1
        if piece != "\u2581":
            return 0
    return 0


def tagged(sentences, tag):
    """`sentences` (str or bytes), each asking with `tag` (see `language_tags`) for a
    translation into its language; a blank one stays as it is (nothing to translate)."""
    prefix = tag + " "
    return [
        s if not s.strip() else prefix.encode("utf-8") + s if isinstance(s, bytes) else prefix + s
        for s in sentences
    ]


@dataclasses.dataclass(frozen=True, order=True)
class Direction:
    source: str
    target: str

    def __str__(self):
        return f"{self.source}-{self.target}"


def languages(data):
    """The languages of a multi-way configuration, sorted; [] for a bilingual one."""
    return sorted(data.get(SPLIT_KEYS["train"]) or {})


def language_tags(data):
    """{code: the tag asking for it} of each language a model translates into, by code ({}
    for a model of one target language): a multi-way model's `<2xx>` symbols, or an imported
    multi-target checkpoint's own tokens (`data.language_tags`, such as Marian's `>>fra<<`)."""
    if data.get("language_tags"):
        return dict(sorted(data["language_tags"].items()))
    return {code: language_tag(code) for code in languages(data)}


def is_multilingual(data):
    return bool(data.get(SPLIT_KEYS["train"]))


def parse_directions(text, known, where="data.directions"):
    """The directions `text` names among the languages `known`: "all" (every ordered pair),
    "to_and_from:XX" (into and out of XX) or a comma-separated list of "src-tgt"."""
    known = sorted(known)
    if text == ALL_DIRECTIONS:
        return [Direction(s, t) for s, t in itertools.permutations(known, 2)]
    if text.startswith(TO_AND_FROM):
        pivot = text[len(TO_AND_FROM) :]
        _check_language(pivot, known, where)
        others = [language for language in known if language != pivot]
        return sorted([Direction(pivot, o) for o in others] + [Direction(o, pivot) for o in others])
    chosen = []
    for item in (part.strip() for part in text.split(",")):
        source, dash, target = item.partition("-")
        if not dash or not source or not target:
            raise UserError(f"{where}: {item!r} is not a direction such as de-en; give "
                            f"{ALL_DIRECTIONS}, {TO_AND_FROM}XX or a list of them")  # fmt: skip
        for language in (source, target):
            _check_language(language, known, where)
        if source == target:
            raise UserError(f"{where}: {item!r} translates a language into itself")
        if Direction(source, target) in chosen:
            raise UserError(f"{where}: {item!r} is listed twice")
        chosen.append(Direction(source, target))
    return chosen


def _check_language(language, known, where):
    if language not in known:
        raise UserError(f"{where}: unknown language {language!r}; the set has "
                        f"{', '.join(known)}")  # fmt: skip


def synthetic_directions(data):
    """The directions trained from `data.multiway_synthetic`'s sources ([] without)."""
    text = data.get("synthetic_directions")
    return parse_directions(text, languages(data), "data.synthetic_directions") if text else []


def training_directions(data):
    """Every direction the model trains: from the set's own pairs, then from synthetic
    sources."""
    return parse_directions(data["directions"], languages(data)) + synthetic_directions(data)


def tag_requests(sentences, languages_asked, known, own_target=None, name="target_language",
                 error=UserError):  # fmt: skip
    """`sentences` as a model takes them. A multilingual model (`known`: {code: tag} of the
    languages it translates into, `language_tags`; or, `name` being a source language's, of
    those it translates from, `source_language_tags`) takes each tagged with its language
    (`languages_asked`: one code, or one a sentence); a bilingual one (`known` empty) takes
    them unchanged, and a language asked must be its `own_target`. A missing or unknown
    language raises `error` naming `name` and the model's languages."""
    asked = _checked(_as_list(languages_asked, sentences, error), known, own_target, name, error)
    if not known:
        return list(sentences)
    return [tagged([sentence], known[language])[0] for sentence, language in zip(sentences, asked)]


def _checked(asked, known, own_target, name, error):
    """`asked` (a language a sentence), each one that `known` holds, or for a model without
    tags (`known` empty) None or `own_target`; else `error` naming `name`."""
    side = "from" if "source" in name else "into"
    if not known:
        wrong = set(asked) - {None, own_target}
        if wrong:
            raise error(f"{name}: this model translates {side} {own_target or 'one language'} "
                        f"only, not {sorted(wrong)[0]}")  # fmt: skip
        return asked
    for language in asked:
        if language is None:
            raise error(f"this model translates {side} {listed(known)}: give {name}")
        if language not in known:
            raise error(f"{name}: unknown language {language!r}; this model translates {side} "
                        f"{listed(known)}")  # fmt: skip
    return asked


def listed(codes, shown=12):
    """The language `codes`, the first `shown` of a long list and where the others are."""
    codes = sorted(codes)
    if len(codes) <= shown:
        return ", ".join(codes)
    return (f"{', '.join(codes[:shown])} and {len(codes) - shown} more (their codes are the "
            "checkpoint's own; the work directory's config.yaml and the ONNX export's "
            "model.json list them)")  # fmt: skip


def source_language_tags(data):
    """{code: the token before a source in that language} of an imported many-to-many model
    (M2M100's `__de__`, NLLB's `deu_Latn`); {} for the others."""
    return dict(sorted((data.get("source_language_tags") or {}).items()))


def target_language_tokens(data):
    """{code: the token its targets start with} of a model whose first target token names
    the language (`model.target_language_first`); {} for the others."""
    return dict(sorted((data.get("target_language_tokens") or {}).items()))


def language_prefixes(sentences, languages_asked, tokens, target_prefix=None,
                      name="target_language", error=UserError):  # fmt: skip
    """The target prefix of each of `sentences` for a model whose targets start with their
    language's token (`tokens`: {code: token}): that token, then the sentence's own prefix
    (`target_prefix`: a text a sentence, or None). A missing or unknown language raises
    `error` naming `name`."""
    asked = _checked(_as_list(languages_asked, sentences, error), tokens, None, name, error)
    own = list(target_prefix) if target_prefix is not None else [""] * len(sentences)
    return [f"{tokens[language]} {prefix}".strip() for language, prefix in zip(asked, own)]


LANGUAGE_NAMES = ("target_language", "source_language")  # the arguments naming languages


@dataclasses.dataclass(frozen=True)
class RequestLanguages:
    """How a model is told the languages of a request, read from `model_languages`'s
    description of it (the configuration's, or an ONNX export's model.json), so that every
    Python runtime asks alike: a multilingual model takes its target's tag before the source
    (`tags`); a bilingual one only checks a language asked against its own (`target`); a
    many-to-many import takes its source language's token before the source (`source_tags`)
    and its target language's token first in the target (`target_tokens`)."""

    tags: dict
    target: str | None
    source_tags: dict
    target_tokens: dict

    @classmethod
    def of(cls, description):
        return cls(dict(description.get("tags", {})), description.get("target"),
                   dict(description.get("source_tags", {})),
                   dict(description.get("target_tokens", {})))  # fmt: skip

    @property
    def inputs(self):
        """The language arguments a request gives (`LANGUAGE_NAMES`): none for a bilingual
        model, the target's for a multilingual one, both for a many-to-many import."""
        if self.source_tags:
            return LANGUAGE_NAMES
        return LANGUAGE_NAMES[:1] if self.tags else ()

    @property
    def source_side_tags(self):
        """{code: tag} of the tags a source may start with."""
        return self.source_tags or self.tags

    def requests(self, sentences, target_language=None, source_language=None,
                 names=LANGUAGE_NAMES, error=ValueError):  # fmt: skip
        """`sentences` as the model takes them (`tag_requests`): tagged with their source
        language for a many-to-many import, else their target language for a multilingual
        model; a missing or unknown language raises `error` naming it as `names` (target's,
        source's) do."""
        if self.source_tags:
            return tag_requests(list(sentences), source_language, self.source_tags, None,
                                names[1], error)  # fmt: skip
        return tag_requests(list(sentences), target_language, self.tags, self.target,
                            names[0], error)  # fmt: skip

    def target_prefixes(self, sentences, target_language=None, target_prefix=None,
                        name=LANGUAGE_NAMES[0], error=ValueError):  # fmt: skip
        """The target prefix of each sentence: `target_prefix` as it is, or for a model whose
        targets start with their language's token, that token before it
        (`language_prefixes`)."""
        if not self.target_tokens:
            return target_prefix
        return language_prefixes(sentences, target_language, self.target_tokens,
                                 target_prefix, name, error)  # fmt: skip


def _as_list(languages_asked, sentences, error):
    if isinstance(languages_asked, str) or languages_asked is None:
        return [languages_asked] * len(sentences)
    if len(languages_asked) != len(sentences):
        raise error(f"{len(languages_asked)} target languages for {len(sentences)} sentences: "
                    "one a sentence, or one for all")  # fmt: skip
    return list(languages_asked)


def _language_suffix(path):
    match = LANGUAGE_SUFFIX.search(Path(path).name)
    return match[1] if match else None


def model_languages(data):
    """{"source": code, "target": code}: each side's `data.<side>_language`, else the language
    suffix its training files all share (train.de.gz -> de); a side with neither is left out.
    A multilingual model: {"targets": the languages it translates into, "tags": {code: its
    tag}} (an imported multi-target one has its source language too); a many-to-many import:
    {"sources", "targets", "source_tags": {code: token}, "target_tokens": {code: token}}; so
    that a runtime in another language needs no rule of its own (`RequestLanguages`)."""
    if is_multilingual(data):
        return {"targets": languages(data), "tags": language_tags(data)}
    if data.get("target_language_tokens"):  # a many-to-many import: `RequestLanguages`
        sources, targets = source_language_tags(data), target_language_tokens(data)
        return {"sources": sorted(sources), "targets": sorted(targets), "source_tags": sources,
                "target_tokens": targets}  # fmt: skip
    found = {"targets": sorted(data["language_tags"]), "tags": language_tags(data)} if data.get(
        "language_tags") else {}  # fmt: skip
    return {**found, **pair_languages(data)}


def pair_languages(data):
    """{"source": code, "target": code} of a configuration's pairs: each side's
    `data.<side>_language`, else the language suffix its training files all share
    (train.de.gz -> de); a side with neither is left out."""
    found = {}
    for side in ("source", "target"):
        paths = [data.get(f"train_{side}")] + [c.get(side) for c in data.get("train_corpora") or []]
        codes = {_language_suffix(path) for path in paths if path}
        code = data.get(f"{side}_language") or (codes.pop() if len(codes) == 1 else None)
        if code:
            found[side] = code
    return found


def told_languages(data):
    """The languages (`LANGUAGE_NAMES`) an imported model is told of a split's pairs: both for
    a many-to-many import, the target for a multi-target one; () for the others (a multi-way
    model's splits are tagged by direction)."""
    if data.get("target_language_tokens"):
        return LANGUAGE_NAMES
    return LANGUAGE_NAMES[:1] if data.get("language_tags") and not is_multilingual(data) else ()


def pair_tokens(data, where="data", languages=None):
    """(source token, target token) that an imported model's training, validation and test
    pairs start with, as transformers tokenises them for fine-tuning, the languages being
    `languages` ({"source": code, "target": code}) or `pair_languages`' (by the checkpoint's
    codes): for a many-to-many import, the source
    language's token before the source and the target language's first in the target; for a
    multi-target one, the target language's tag before the source; ("", "") for the other
    models. A missing or unknown language is a `UserError` naming its key."""
    told = told_languages(data)
    if not told:
        return "", ""
    sides = ((("source", source_language_tags(data)), ("target", target_language_tokens(data)))
             if told == LANGUAGE_NAMES else (("target", language_tags(data)),))  # fmt: skip
    languages = languages or pair_languages(data)
    tokens = []
    for side, known in sides:
        code, preposition = languages.get(side), "from" if side == "source" else "into"
        if code not in known:
            what = f"unknown language {code!r}" if code else (
                f"give the training pairs' {side} language by the checkpoint's code")  # fmt: skip
            raise UserError(f"{where}.{side}_language: {what}; this model translates "
                            f"{preposition} {listed(known)}")  # fmt: skip
        tokens.append(known[code])
    return tuple(tokens) if len(tokens) == 2 else (tokens[0], "")
