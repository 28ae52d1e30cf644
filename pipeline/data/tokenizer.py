"""Subword vocabularies: SentencePiece models trained on the training data.

SentencePiece is the one format read by tensorflow-text (inside the tf.data pipeline and the
exported SavedModel), by the `sentencepiece` package (a TensorFlow-free runtime) and by
onnxruntime-extensions, so every consumer tokenises identically from the same file.
"""

import copy
import io
import os
from pathlib import Path

import sentencepiece
import tensorflow as tf
import tensorflow_text as tf_text

from layers.special_tokens import BOS_ID, EOS_ID, PAD_ID, UNK_ID
from pipeline.core import multilingual
from pipeline.core.atomic_files import atomic_path
from pipeline.core.errors import UnusableFileError, UserError

SPECIAL_PIECES = {
    "pad_piece": "<pad>",
    "unk_piece": "<unk>",
    "bos_piece": "<s>",
    "eos_piece": "</s>",
}


def train_sentencepiece(sentences, vocab_size, model_type, path, symbols=()):
    """Trains a model on `sentences` and writes it to `path` (`write_sentencepiece`);
    `symbols` are pieces of their own, never split (a multilingual model's language tags)."""
    model = io.BytesIO()
    try:
        sentencepiece.SentencePieceTrainer.train(
            sentence_iterator=iter(sentences),
            model_writer=model,
            vocab_size=vocab_size,
            model_type=model_type,
            character_coverage=1.0,
            pad_id=PAD_ID,
            unk_id=UNK_ID,
            bos_id=BOS_ID,
            eos_id=EOS_ID,
            # A small corpus may not support the requested size; take what it supports.
            hard_vocab_limit=False,
            num_threads=os.cpu_count() or 1,
            minloglevel=2,
            user_defined_symbols=list(symbols),
            **SPECIAL_PIECES,
        )
    except RuntimeError as error:
        raise UserError(f"cannot build the vocabulary {path}: {error}") from None
    write_sentencepiece(model.getvalue(), path)


def write_sentencepiece(model_proto, path):
    """Writes a SentencePiece model to `path` (.model) and its `.vocab` text beside it,
    atomically: a half-written vocabulary never sits under the final name."""
    processor = sentencepiece.SentencePieceProcessor(model_proto=model_proto)
    vocab_text = "".join(
        f"{processor.id_to_piece(i)}\t{processor.get_score(i):g}\n"
        for i in range(processor.get_piece_size())
    )
    path = Path(path)
    for target, payload in ((path, model_proto), (path.with_suffix(".vocab"), vocab_text.encode())):
        with atomic_path(target) as tmp:
            tmp.write_bytes(payload)


class Tokenizer:
    """A SentencePiece model in TensorFlow ops: strings <-> int32 ids."""

    def __init__(self, model_path):
        self.model_path = Path(model_path)
        try:
            self.model_proto = self.model_path.read_bytes()
            processor = sentencepiece.SentencePieceProcessor(model_proto=self.model_proto)
        except (OSError, RuntimeError) as error:
            raise UnusableFileError(
                model_path, f"not a readable SentencePiece model ({error})"
            ) from None
        specials = [processor.pad_id(), processor.unk_id(), processor.bos_id(), processor.eos_id()]
        if specials != [PAD_ID, UNK_ID, BOS_ID, EOS_ID]:
            raise UnusableFileError(
                model_path, f"special token ids {specials}, expected 0, 1, 2, 3"
            )
        self.vocab_size = processor.get_piece_size()
        self.processor = processor  # for piece-level work in Python (n-best, alignments)
        self._tokenizer = tf_text.SentencepieceTokenizer(model=self.model_proto, out_type=tf.int32)

    def tokenize(self, strings):
        """`[batch]` strings -> ragged int32 ids `[batch, (tokens)]`, without <s> or </s>."""
        return self._tokenizer.tokenize(strings)

    def sampling(self, alpha, nbest):
        """This vocabulary segmenting each sentence at random, anew at every call (subword
        regularisation): a unigram model draws among its `nbest` best segmentations (-1: all)
        with probabilities P^alpha, a BPE model drops merges at rate `alpha`. Unseeded: the
        TensorFlow op offers no seed."""
        sampler = copy.copy(self)
        sampler._tokenizer = tf_text.SentencepieceTokenizer(
            model=self.model_proto, out_type=tf.int32, nbest_size=nbest, alpha=alpha
        )
        return sampler

    def detokenize(self, ids):
        """int32 ids `[batch, length]` (dense or ragged) -> `[batch]` strings.

        Special tokens decode to nothing, so padded or </s>-terminated rows are fine.
        """
        return self._tokenizer.detokenize(ids)


def training_tokenizers(tokenizers, data_config):
    """The (source, target) tokenizers that segment training pairs: `tokenizers`, or with
    `data.subword_sampling_alpha` set, samplers of them (`Tokenizer.sampling`)."""
    alpha = data_config["subword_sampling_alpha"]
    if alpha is None:
        return tokenizers
    return tuple(t.sampling(alpha, data_config["subword_sampling_nbest"]) for t in tokenizers)


SHARED_VOCABULARY = "shared.model"  # one vocabulary for both sides (data.shared_vocabulary)


def vocabulary_paths(workdir, shared=None):
    """The (source, target) SentencePiece models of `workdir`: `vocab/source.model` and
    `vocab/target.model`, or `vocab/shared.model` twice for a shared vocabulary (`shared`:
    whether it is; None: whether that file is there)."""
    vocab_dir = Path(workdir) / "vocab"
    if shared is None:
        shared = (vocab_dir / SHARED_VOCABULARY).exists()
    if shared:
        return vocab_dir / SHARED_VOCABULARY, vocab_dir / SHARED_VOCABULARY
    return vocab_dir / "source.model", vocab_dir / "target.model"


SIDES = ("source", "target")


def vocabularies_to_build(workdir, data_config):
    """The sides ("source", "target") whose vocabulary is neither in `workdir` nor given."""
    paths = vocabulary_paths(workdir, data_config["shared_vocabulary"])
    return [
        side
        for side, path in zip(SIDES, paths)
        if not path.exists() and not data_config[f"{side}_vocabulary"]
    ]


def _sentences(sample):
    """The non-blank sentences of a sample of raw lines (bytes)."""
    for line in sample:
        text = line.decode("utf-8", errors="replace").rstrip("\r")
        if text.strip():
            yield text


def _adopt(given, path, log):
    """Copies the SentencePiece model `given` to `path` (with its .vocab, made if absent)."""
    model_proto = Tokenizer(given).model_proto  # refuses a model with other special ids
    if path.exists():
        if path.read_bytes() != model_proto:
            raise UserError(
                f"{path} differs from {given}: this work directory was trained with another "
                "vocabulary; use a new --workdir"
            )
        return
    log(f"Using the vocabulary {given}")
    write_sentencepiece(model_proto, path)


def prepare_tokenizers(workdir, data_config, samples, log=print):
    """The source and target tokenizers of `workdir`: an existing SentencePiece model the
    configuration names (copied in), or one trained on `samples[side]` (sampled raw lines) on
    first use; reused after."""
    shared = data_config["shared_vocabulary"]
    paths = vocabulary_paths(workdir, shared)
    paths[0].parent.mkdir(parents=True, exist_ok=True)
    if shared:
        _prepare_shared(paths[0], data_config, samples, log)
        tokenizers = Tokenizer(paths[0]), Tokenizer(paths[1])
        _check_language_tags(tokenizers[0], multilingual.languages(data_config))
        return tokenizers
    to_build = []
    for side, path in zip(SIDES, paths):
        given = data_config[f"{side}_vocabulary"]
        if given:
            _adopt(given, path, log)
        elif path.exists():
            log(f"Reusing the vocabulary {path}")
        else:
            to_build.append((side, path))
    if to_build:
        kind = data_config["subword_model"]
        sizes = ", ".join(f"{side} {data_config[f'{side}_vocab_size']}" for side, _ in to_build)
        log(f"Building {kind} vocabularies ({sizes} pieces) from "
            f"{len(samples[to_build[0][0]]):,} sampled sentences a side: "
            f"{paths[0].parent}")  # fmt: skip
    for side, path in to_build:
        size = data_config[f"{side}_vocab_size"]
        train_sentencepiece(_sentences(samples[side]), size, data_config["subword_model"], path)
    return Tokenizer(paths[0]), Tokenizer(paths[1])


def _prepare_shared(path, data_config, samples, log):
    """The one vocabulary of both sides: given (the same model for both), reused, or trained
    on both sides' samples together."""
    given = {data_config[f"{side}_vocabulary"] for side in SIDES} - {None}
    if len(given) > 1:
        raise UserError(
            "data.shared_vocabulary: data.source_vocabulary and data.target_vocabulary name "
            "two different models"
        )
    if given:
        _adopt(given.pop(), path, log)
    elif path.exists():
        log(f"Reusing the shared vocabulary {path}")
    else:
        size, kind = data_config["source_vocab_size"], data_config["subword_model"]
        if multilingual.is_multilingual(data_config):
            sentences = list(_sentences(samples["languages"]))
            tags = [multilingual.language_tag(language)
                    for language in multilingual.languages(data_config)]  # fmt: skip
            log(f"Building a {size}-piece {kind} vocabulary shared by "
                f"{', '.join(multilingual.languages(data_config))} from {len(sentences):,} "
                f"sampled sentences, as many of each, with the tags {' '.join(tags)}: "
                f"{path}")  # fmt: skip
            train_sentencepiece(sentences, size, kind, path, tags)
            return
        sentences = [*_sentences(samples["source"]), *_sentences(samples["target"])]
        log(f"Building a {size}-piece {kind} vocabulary shared by both sides from "
            f"{len(sentences):,} sampled sentences: {path}")  # fmt: skip
        train_sentencepiece(sentences, size, kind, path)


def _check_language_tags(tokenizer, languages):
    """Refuses a vocabulary in which a language's tag is not one piece of its own."""
    for language in languages:
        tag = multilingual.language_tag(language)
        if tokenizer.processor.encode(tag, out_type=str)[-1:] != [tag]:
            raise UnusableFileError(tokenizer.model_path, f"has no piece {tag}: a multilingual "
                                    "model's vocabulary holds each language's tag")  # fmt: skip
