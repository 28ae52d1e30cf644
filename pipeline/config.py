"""Experiment configuration: one YAML file, validated at load, overridable from the command line.

Every key has a declared type, default, allowed range and meaning in `SCHEMA` (the `model`
section's in `pipeline.model_types`, by model type), from which `tools/config_reference.py`
writes docs/configuration.md. Loading refuses an unknown key, a key of another model type, a
wrong type or an impossible value with a message naming the key and the file.
"""

import copy
import difflib
import os
from pathlib import Path

import yaml

from pipeline.core import multilingual
from pipeline.core.atomic_files import write_text_atomically
from pipeline.core.errors import UnusableFileError, UserError
from pipeline.core.fields import Field, check_value, path_field, positive_int, rate
from pipeline.decoding.search_options import CONFIGURED_OPTIONS
from pipeline.model_types import DEFAULT_MODEL_TYPE, MODEL_TYPES, model_keys

PROJECT_ROOT = Path(__file__).resolve().parent.parent
# The shipped recipes: configs/ in a checkout, seq2seq_tf/configs/ in an installed wheel (see
# setup.py), each beside the bundled corpus that their `../data/...` paths name.
RECIPES = next((d for d in (PROJECT_ROOT / "configs", PROJECT_ROOT / "seq2seq_tf" / "configs")
                if d.is_dir()), PROJECT_ROOT / "configs")  # fmt: skip
DEFAULT_CONFIG = RECIPES / "default.yaml"
# Keras dtype policies a model may train under; its variables and exports stay float32.
PRECISIONS = ("auto", "float32", "mixed_bfloat16", "mixed_float16")  # auto: training.precision
LOSS_NORMALIZATIONS = ("tokens", "sentences")  # what a batch's loss sum is divided by
STOPPING_METRICS = ("loss", "bleu", "chrf")  # see pipeline.training.callbacks.EarlyStopping
SCHEDULE_KINDS = ("constant", "inverse_sqrt", "exponential")  # see pipeline.training.schedules
EXPORT_FORMATS = ("saved_model", "onnx", "ctranslate2")
DEFAULT_EXPORT_FORMATS = ("saved_model", "onnx")
# The search inside an ONNX export: the beam search, its options inputs, or the greedy alone.
ONNX_SEARCHES = ("beam", "greedy")
# The SavedModel's weights and matrix products: float32 gives the model's own outputs; bfloat16
# halves the weights and runs the products in bfloat16 (AVX512-BF16 or AMX CPUs, recent GPUs).
SAVED_MODEL_PRECISIONS = ("float32", "bfloat16")
# CTranslate2's weight types (`spec.optimize(quantization=...)`); none keeps float32.
CTRANSLATE2_QUANTIZATIONS = (
    "none", "int8", "int8_float32", "int8_float16", "int8_bfloat16", "int16", "float16",
    "bfloat16",
)  # fmt: skip


def _search_field(option):
    """A configured search option (`pipeline.decoding.search_options`) as a decode key."""
    return Field(
        option.kind,
        option.default,
        option.meaning,
        choices=option.choices,
        minimum=option.minimum,
        maximum=option.maximum,
        nullable=option.nullable,
    )


SCHEMA = {
    "data": {
        "train_source": path_field("training source text, one sentence a line (plain or .gz; a "
                                   "glob pattern: aligned shards, train-*.de.gz)"),
        "train_target": path_field("training target text, aligned line by line with "
                                   "train_source (plain or .gz, or a glob pattern)"),
        "train_tsv": path_field("training pairs as source<TAB>target lines (plain or .gz, or a "
                                "glob pattern), instead of the two files"),
        "valid_source": path_field("validation source text (plain or .gz), for the validation "
                                   "loss, early stopping, BLEU and attention images"),
        "valid_target": path_field("validation target text, aligned line by line with "
                                   "valid_source"),
        "valid_tsv": path_field("validation pairs as source<TAB>target lines, instead of the two "
                                "files"),
        "test_source": path_field("test source text (plain or .gz), translated and scored when "
                                  "training ends and by pipeline.evaluate"),
        "test_target": path_field("test references, aligned line by line with test_source"),
        "test_tsv": path_field("test pairs as source<TAB>target lines, instead of the two files"),
        "train_corpora": Field(list, None, "corpora mixed by weight, instead of train_*: a list of "
                               "{source, target} or {tsv}, each with a weight (1)",
                               nullable=True),
        # One multilingual model (pipeline.core.multilingual): a file a language, aligned.
        "multiway_train": Field(dict, None, "one multi-way parallel training set, instead of "
                                "train_*: {language code: file}, the files aligned line by line",
                                nullable=True),
        "multiway_valid": Field(dict, None, "the multi-way validation set, {language code: "
                                "file}, instead of valid_*", nullable=True),
        "multiway_test": Field(dict, None, "the multi-way test set, {language code: file}, "
                               "instead of test_*", nullable=True),
        "directions": Field(str, "all", "multiway: the directions trained: all, to_and_from:XX "
                            "(into and out of XX), or a list such as de-en,en-de"),
        "multiway_synthetic": Field(dict, None, "multiway: {language code: file} of sources "
                                    "translated from another language of multiway_train, "
                                    "aligned with it", nullable=True),
        "synthetic_directions": Field(str, None, "multiway: directions trained from "
                                      "multiway_synthetic's sources to multiway_train's "
                                      "targets, such as de-fr,fr-de", nullable=True),
        "sampling_temperature": Field(float, 5.0, "multiway: directions mixed with weights "
                                      "proportional to their lines^(1/T)", minimum=1.0),
        "skip_bad_lines": Field(bool, False, "skip training lines not in UTF-8 (or, in a TSV, "
                                "without a tab) rather than stop at the first"),
        "vocab_sample_size": positive_int(1_000_000, "training pairs sampled at random to learn "
                                          "a new vocabulary from"),
        "source_vocabulary": path_field("an existing SentencePiece model as the source "
                                        "vocabulary (null: one is built on the first run)"),
        "target_vocabulary": path_field("an existing SentencePiece model as the target "
                                        "vocabulary (null: one is built on the first run)"),
        "source_vocab_size": positive_int(8000, "pieces of a source vocabulary built here (and "
                                          "of a shared one)"),
        "target_vocab_size": positive_int(8000, "pieces of a target vocabulary built here (equal "
                                          "to source_vocab_size when shared)"),
        "subword_model": Field(str, "unigram", "the SentencePiece algorithm of the vocabularies "
                               "built here", choices=("unigram", "bpe")),
        # Subword regularisation (Kudo 2018): a unigram model samples among the n best
        # segmentations with probabilities P^alpha, a BPE model drops merges (BPE-dropout).
        # Validation, test and exports always take the best segmentation.
        "subword_sampling_alpha": rate(None, "training pairs segmented anew at each pass: unigram "
                                       "alpha, or BPE-dropout rate (null: off)", nullable=True),
        "subword_sampling_nbest": Field(int, 64, "unigram sampling: among this many best "
                                        "segmentations (-1: all; 0 and 1 refused)", minimum=-1),
        "shared_vocabulary": Field(bool, False, "one SentencePiece model for both sides, trained "
                                   "on both (vocab/shared.model)"),
        "max_source_length": positive_int(100, "training and validation pairs with more source "
                                          "pieces are dropped"),
        "max_target_length": positive_int(100, "training and validation pairs whose target needs "
                                          "more pieces, </s> included, are dropped"),
        "language_tags": Field(dict, None, "an imported multi-target model's {target language "
                               "code: the token asking for it} (null: one target, or multiway_*)",
                               nullable=True),
        "source_language_tags": Field(dict, None, "an imported many-to-many model's {source "
                                      "language code: the token before a source in it}",
                                      nullable=True),
        "target_language_tokens": Field(dict, None, "{target language code: the token a "
                                        "target starts with}: of a Transformer whose first "
                                        "target token names the language", nullable=True),
        "strip_translation_spaces": Field(bool, False, "no spaces at either end of a "
                                          "translation, as Marian's and M2M100's tokenizers "
                                          "decode (false: SentencePiece's text)"),
        "source_language": Field(str, None, "the pairs' source language (in model.json; an "
                                 "import's own code, deu_Latn, to fine-tune it), null: the "
                                 "files' suffix", nullable=True),
        "target_language": Field(str, None, "the pairs' target language (in model.json; an "
                                 "import's own code, fra_Latn, to fine-tune it), null: the "
                                 "files' suffix", nullable=True),
    },
    # "model": the keys of the chosen model type, declared in pipeline.model_types.
    "train": {
        "epochs": positive_int(10, "the most epochs to train (a time budget or early stopping "
                                "may end sooner)"),
        "steps_per_epoch": positive_int(None, "training steps per epoch (null: about one pass "
                                        "over the training data)", nullable=True),
        "batch_size": positive_int(64, "sentence pairs per batch on each replica (without "
                                   "batch_tokens)"),
        "batch_tokens": positive_int(None, "tokens per batch on each replica, at the bucket's "
                                     "longest length (null: batch_size pairs)", nullable=True),
        # 1 wastes the least on padding; the shipped recipes keep 5, the width their figures had.
        "accumulate_steps": positive_int(1, "micro-batches whose gradients make one update "
                                         "(gradient accumulation; 1: none)"),
        "effective_batch_tokens": positive_int(None, "tokens per update, all replicas and "
                                               "micro-batches: sets accumulate_steps (null: "
                                               "unset)", nullable=True),
        "effective_batch_size": positive_int(None, "sentence pairs per update, all replicas and "
                                             "micro-batches: sets accumulate_steps (null: "
                                             "unset)", nullable=True),
        "bucket_width": positive_int(1, "width, in pieces, of the length buckets a batch's pairs "
                                     "share (a pair's length: its longer side)"),
        "shuffle_buffer": positive_int(30000, "training pairs the shuffle buffer holds (at most "
                                       "the corpus' lines)"),
        "seed": Field(int, 1234, "seed of the initial weights, dropout, the training data's "
                      "shuffling and mixing, and the vocabulary sample"),
        "init_uniform": Field(float, None, "a new run's weights drawn from U(-x, x), as Luong "
                              "et al. (2015) did (null: each layer's initialiser)", minimum=0.0,
                              nullable=True),
        "learning_rate": Field(float, 1e-3, "the peak learning rate of Adam's schedule (times "
                               "the replicas with distribute.scale_learning_rate)", minimum=0.0),
        "lr_schedule": Field(str, "constant", "decay after the warm-up: none, sqrt(warmup_steps "
                             "/ step), or decay_rate per decay_steps", choices=SCHEDULE_KINDS),
        "warmup_steps": Field(int, 0, "steps over which the learning rate rises linearly to its "
                              "peak (0: no warm-up)", minimum=0),
        "decay_steps": positive_int(1000, "exponential: steps over which the learning rate is "
                                    "multiplied by decay_rate"),
        "decay_rate": Field(float, 0.5, "exponential: the learning rate's factor per "
                            "decay_steps steps", minimum=0.0, maximum=1.0),
        "cooldown_epochs": Field(int, 0, "the last N epochs take the learning rate linearly down "
                                 "to 0 (0: no cool-down)", minimum=0),
        # At each epoch end, when one more epoch and the cool-down would not fit, the cool-down
        # begins (or, without one, training stops); train.epochs stays the most.
        "time_budget_hours": Field(float, None, "training hours (counted across resumes) the run "
                                   "must end within, above 0 (null: no budget)", minimum=0.0,
                                   nullable=True),
        "adam_beta2": Field(float, 0.999, "the decay of Adam's squared-gradient average "
                            "(Transformer recipes commonly use 0.98)", minimum=0.0,
                            maximum=0.9999),
        "clip_norm": Field(float, 5.0, "gradients clipped to this global norm (null or 0: no "
                           "clipping)", minimum=0.0, nullable=True),
        "label_smoothing": Field(float, 0.1, "epsilon of label smoothing in the training loss "
                                 "(0: none)", minimum=0.0, maximum=0.99),
        "loss_normalization": Field(str, "tokens", "a batch's loss sum over its tokens (the mean) "
                                    "or its sentences (OpenNMT-py's normalization: sents)",
                                    choices=LOSS_NORMALIZATIONS),
        "sampling_schedule": Field(str, "none", "rnn: scheduled sampling (Bengio et al., 2015), "
                                   "how teacher forcing decays (none: always teacher forcing)",
                                   choices=("none", "constant", "linear", "inverse_sigmoid")),
        "sampling_probability": rate(0.25, "scheduled sampling: the largest probability of an "
                                     "input token replaced by a sampled one"),
        "sampling_decay_steps": Field(float, 1000.0, "scheduled sampling: steps over which "
                                      "teacher forcing decays (linear), or k (inverse_sigmoid)",
                                      minimum=1.0),
        "checkpoint_every_steps": positive_int(500, "a checkpoint every this many steps, and one "
                                               "at each epoch end"),
        "keep_checkpoints": positive_int(3, "the latest checkpoints kept, older ones deleted"),
        "average_checkpoints": Field(int, 0, "the saved model's weights: the mean of the last N "
                                     "checkpoints (0 or 1: the last weights)", minimum=0),
        "early_stopping_patience": positive_int(None, "stop when early_stopping_metric has not "
                                                "improved for N epochs, keep the best (null: "
                                                "never)", nullable=True),
        "early_stopping_metric": Field(str, "loss", "what early stopping and keep_best watch: "
                                       "the validation loss, or the BLEU or chrF of the "
                                       "validation subset (bleu_subset)",
                                       choices=STOPPING_METRICS),
        "keep_best": Field(int, 0, "the N best checkpoints by early_stopping_metric kept in "
                           "checkpoints/best/ (0: none; pipeline.average --best N)", minimum=0),
        "bleu_every_epochs": Field(int, 0, "validation BLEU (val_bleu; multilingual: also "
                                   "val_bleu_<direction>) every N epochs (0: never; needs "
                                   "validation data)", minimum=0),
        "bleu_subset": positive_int(200, "validation sentences translated for that BLEU, the "
                                    "first N (of each direction, multilingual)"),
        "attention_images": Field(int, 3, "the first N validation sentences' attention drawn "
                                  "each epoch for TensorBoard (0: none)", minimum=0),
        "jit_compile": Field(bool, False, "compile the training step with XLA (Keras' "
                             "jit_compile)"),
        # bench/training_profile.py reads the traces.
        "profile_steps": Field(int, 0, "training steps traced for TensorBoard's Profile tab after "
                               "the first 10 (0: none; pip install xprof)", minimum=0),
        # The saved and exported model is float32 whatever trained it.
        "precision": Field(str, "auto", "the dtype policy training runs under (auto: "
                           "mixed_bfloat16 where it trains the model type faster, else float32)",
                           choices=PRECISIONS),
    },
    "decode": {
        "batch_size": positive_int(64, "sentences searched (or scored) at once by translate, "
                                   "evaluate, score, and training's BLEU and test"),
        # One key per configured option of pipeline.decoding.search_options, its meaning there.
        **{option.name: _search_field(option) for option in CONFIGURED_OPTIONS},
    },
    "distribute": {
        "strategy": Field(str, "default", "tf.distribute strategy: one device, the local GPUs, "
                          "TF_CONFIG's cluster, or a TPU",
                          choices=("default", "mirrored", "multi_worker", "tpu")),
        "cpu_replicas": positive_int(None, "mirrored: split the CPU into N devices, a replica "
                                     "each (null: the local GPUs)", nullable=True),
        "scale_learning_rate": Field(bool, False, "multiply train.learning_rate by the number of "
                                     "replicas"),
        "communication": Field(str, "auto", "multi_worker: the collective communication "
                               "implementation", choices=("auto", "ring", "nccl")),
        "tpu_name": Field(str, None, "tpu: the TPU's name or address for TPUClusterResolver "
                          "(null: its default)", nullable=True),
        "tpu_zone": Field(str, None, "tpu: the TPU's zone for TPUClusterResolver (null: its "
                          "default)", nullable=True),
        "tpu_project": Field(str, None, "tpu: the TPU's cloud project for TPUClusterResolver "
                             "(null: its default)", nullable=True),
    },
    # pipeline.distill: the training targets a teacher translates for this (student) model;
    # pipeline.backtranslate: a multilingual model's own translations into synthetic sources.
    "distill": {
        "int8": Field(bool, False, "the teacher translates with its int8 ONNX model (faster; "
                      "check its quality first)"),
        "beam_size": positive_int(None, "the teacher's beam (null: its export's default, its "
                                  "recipe's)", nullable=True),
        "batch_size": positive_int(64, "sentences the teacher translates at once"),
        # The score: the teacher's search's, its log-probability over the length penalty.
        "min_score": Field(float, None, "drop pairs whose translation the teacher scores below "
                           "this (null: keep all)", nullable=True),
        "keep_references": Field(bool, False, "train on the original pairs too, beside the "
                                 "distilled ones"),
        # Kim and Rush's sequence-level interpolation: the teacher keeps its beam's n-best.
        "interpolate": Field(bool, False, "train on the hypothesis of the teacher's beam "
                             "closest to the reference (sentence BLEU), not its best"),
    },
    "export": {
        "after_training": Field(bool, False, "export in export.formats when training ends (needs "
                                "the exporter installed)"),
        "directory": path_field("where exports go (null: <workdir>/export); python -m export "
                                "--output overrides it"),
        "formats": Field(str, ",".join(DEFAULT_EXPORT_FORMATS), "what after_training exports: "
                         "a comma-separated subset of saved_model, onnx, ctranslate2"),
        "model_name": Field(str, "translator", "the TF Serving model name (saved_model/<name>/"
                            "<version>), of letters, digits, '.', '_' and '-'"),
        # At most 18: tf2onnx 1.17 stops there.
        "onnx_opset": Field(int, 17, "the ONNX export's opset", minimum=13, maximum=18),
        "onnx_int8": Field(bool, True, "also write onnx/model.int8.onnx, with int8 weights in "
                           "every matrix product"),
        "onnx_search": Field(str, "beam", "the ONNX model's search: beam (options as inputs) "
                             "or greedy (alone, far fewer nodes; needs decode.beam_size 1)",
                             choices=ONNX_SEARCHES),
        "saved_model_precision": Field(str, "float32", "the SavedModel's weights and products: "
                                       "float32 (exact) or bfloat16 (half the size, faster on "
                                       "bfloat16 CPUs)", choices=SAVED_MODEL_PRECISIONS),
        "ctranslate2_quantization": Field(str, "none", "the CTranslate2 export's weight type "
                                          "(none: float32)",
                                          choices=CTRANSLATE2_QUANTIZATIONS),
    },
}  # fmt: skip
# Data keys a resumed run may change: where the data is, not what the model learns from.
RELOCATABLE_DATA_KEYS = (
    "train_source", "train_target", "train_tsv", "valid_source", "valid_target", "valid_tsv",
    "test_source", "test_target", "test_tsv", "train_corpora", "multiway_train",
    "multiway_valid", "multiway_test", "multiway_synthetic", "skip_bad_lines",
    "vocab_sample_size", "source_vocabulary", "target_vocabulary", "source_language",
    "target_language",
)  # fmt: skip
# The keys of an entry of data.train_corpora.
CORPUS_FIELDS = {
    "source": Field(str, None, "source text (plain or .gz, or a glob pattern of shards)"),
    "target": Field(str, None, "target text, aligned line by line with source"),
    "tsv": Field(str, None, "source<TAB>target lines, instead of source and target"),
    "weight": Field(float, 1.0, "the corpus' share of the mix, relative to the others' (above 0)"),
}
CORPUS_KEYS = set(CORPUS_FIELDS)


def schema(model_type=DEFAULT_MODEL_TYPE):
    """{section: {key: Field}} of a configuration whose model is of type `model_type`."""
    return {**SCHEMA, "model": model_keys(model_type)}


def defaults(model_type=DEFAULT_MODEL_TYPE):
    return {
        section: {key: copy.deepcopy(field.default) for key, field in fields.items()}
        for section, fields in schema(model_type).items()
    }


def _unknown(key, known, where):
    hint = difflib.get_close_matches(key, known, n=1)
    suggestion = f" (did you mean '{hint[0]}'?)" if hint else ""
    return UserError(f"{where}: unknown key '{key}'{suggestion}")


def _merge(config, overrides, where, base_dir, fields):
    if not isinstance(overrides, dict):
        raise UserError(f"{where}: expected a mapping of sections, got {type(overrides).__name__}")
    for section, values in overrides.items():
        if section not in fields:
            raise _unknown(str(section), fields, where)
        if not isinstance(values, dict):
            raise UserError(f"{where}: section '{section}' must be a mapping of keys")
        for key, value in values.items():
            if key not in fields[section]:
                if section == "model":
                    _refuse_other_types_key(key, config["model"]["type"], where)
                raise _unknown(
                    f"{section}.{key}", [f"{section}.{k}" for k in fields[section]], where
                )
            field = fields[section][key]
            value = check_value(f"{section}.{key}", field, value, where)
            if field.path and value is not None:
                value = _resolve(value, base_dir)
            if key == "train_corpora" and value is not None:
                value = _check_corpora(value, f"{where}: data.train_corpora", base_dir)
            if key.startswith("multiway_") and value is not None:
                value = _check_multiway(value, f"{where}: data.{key}", base_dir,
                                        1 if key == "multiway_synthetic" else 2)  # fmt: skip
            config[section][key] = value


# Model keys of earlier releases: {key: what states it now}.
REMOVED_MODEL_KEYS = {"target_language_first": "data.target_language_tokens states it"}


def _refuse_other_types_key(key, model_type, where):
    if key in REMOVED_MODEL_KEYS:
        raise UserError(f"{where}: model.{key} is no longer a key: {REMOVED_MODEL_KEYS[key]}")
    owners = [name for name, other in MODEL_TYPES.items() if key in other.keys]
    if owners:
        raise UserError(
            f"{where}: model.{key} is a key of {' and '.join(owners)} models; this model's "
            f"model.type is {model_type}"
        )


def _model_type(layer, where, default):
    """The model type a config layer (the file, or the `--set` overrides) sets, else `default`."""
    model = layer.get("model") if isinstance(layer, dict) else None
    if not isinstance(model, dict) or "type" not in model:
        return default
    return check_value("model.type", model_keys(default)["type"], model["type"], where)


def _without_other_types_keys(layer, model_type):
    """`layer` less the model keys that only other model types have, and those of
    `REMOVED_MODEL_KEYS`. They are dropped where `--set model.type` changes the file's type,
    and from the configurations that earlier releases saved in work directories (before
    per-type keys, they held every type's keys)."""
    model = layer.get("model") if isinstance(layer, dict) else None
    if not isinstance(model, dict):
        return layer
    own = model_keys(model_type)
    foreign = {key for other in MODEL_TYPES.values() for key in other.keys} - set(own)
    foreign |= set(REMOVED_MODEL_KEYS)
    return {**layer, "model": {k: v for k, v in model.items() if k not in foreign}}


def _resolve(path, base_dir):
    return str((base_dir / os.path.expanduser(path)).resolve())


def _check_corpora(corpora, where, base_dir):
    """`[{source, target} or {tsv}, optional weight > 0]`, paths resolved against `base_dir`."""
    if not corpora:
        raise UserError(f"{where} must list at least one corpus")
    checked = []
    for number, corpus in enumerate(corpora, start=1):
        here = f"{where}[{number}]"
        if not isinstance(corpus, dict):
            raise UserError(f"{here}: expected a mapping with source and target, or tsv")
        unknown = set(corpus) - CORPUS_KEYS
        if unknown:
            raise _unknown(sorted(unknown)[0], CORPUS_KEYS, here)
        if ("tsv" in corpus) == ("source" in corpus or "target" in corpus):
            raise UserError(f"{here}: give either tsv or both source and target")
        if "tsv" not in corpus and not ("source" in corpus and "target" in corpus):
            missing = "target" if "source" in corpus else "source"
            raise UserError(f"{here}: {missing} is missing")
        weight = check_value("weight", CORPUS_FIELDS["weight"], corpus.get("weight", 1.0), here)
        if weight <= 0:
            raise UserError(f"{here}: weight must be positive, got {weight!r}")
        entry = {"weight": weight}
        for key in ("source", "target", "tsv"):
            if key in corpus:
                entry[key] = _resolve(check_value(key, CORPUS_FIELDS[key], corpus[key], here),
                                      base_dir)  # fmt: skip
        checked.append(entry)
    return checked


def _check_multiway(files, where, base_dir, languages=2):
    """`{language code: file}` of at least `languages` languages, paths resolved against
    `base_dir`."""
    if len(files) < languages:
        raise UserError(f"{where}: a multi-way set needs at least two languages")
    checked = {}
    for language, path in files.items():
        if not isinstance(language, str) or not multilingual.LANGUAGE_CODE.fullmatch(language):
            raise UserError(f"{where}: {language!r} is not a language code such as de or pt_BR")
        path = check_value(language, Field(str, None, "a file"), path, where)
        checked[language] = _resolve(path, base_dir)
    return checked


def parse_overrides(assignments):
    """`["train.epochs=3", ...]` -> `{"train": {"epochs": 3}}`, values parsed as YAML scalars."""
    overrides = {}
    for assignment in assignments:
        key, sep, raw = assignment.partition("=")
        section, dot, name = key.strip().partition(".")
        if not sep or not dot or not name:
            raise UserError(f"--set {assignment!r}: expected SECTION.KEY=VALUE")
        try:
            value = yaml.safe_load(raw) if raw.strip() else None
        except yaml.YAMLError as error:
            raise UserError(f"--set {assignment!r}: cannot parse the value ({error})") from None
        overrides.setdefault(section, {})[name] = value
    return overrides


# The data keys naming the language tokens of an imported model's vocabulary (which a
# fine-tuning run takes from it).
LANGUAGE_TOKEN_KEYS = ("language_tags", "source_language_tags", "target_language_tokens")


def _check_consistency(config, where, saved=False):
    data = config["data"]
    for key in LANGUAGE_TOKEN_KEYS:
        tags = data[key] or {}
        if tags and data["multiway_train"]:
            raise UserError(f"{where}: data.{key} and data.multiway_train are alternatives")
        if not all(isinstance(k, str) and isinstance(v, str) and v.strip()
                   for k, v in tags.items()):  # fmt: skip
            raise UserError(f"{where}: data.{key} must map language codes to tokens, got "
                            f"{tags!r}")  # fmt: skip
    if data["multiway_train"]:
        _check_multiway_consistency(data, where)
        return _check_training_settings(config, where, saved)
    for key in ("multiway_valid", "multiway_test", "multiway_synthetic", "synthetic_directions"):
        if data[key]:
            raise UserError(f"{where}: data.{key} needs data.multiway_train")
    for split in ("train", "valid", "test"):
        pair = data[f"{split}_source"], data[f"{split}_target"]
        tsv = data[f"{split}_tsv"]
        if tsv and any(pair):
            raise UserError(
                f"{where}: data.{split}_tsv and data.{split}_source/target are alternatives; "
                "give one of them"
            )
        if any(pair) and not all(pair):
            missing = f"data.{split}_{'target' if pair[0] else 'source'}"
            raise UserError(f"{where}: {missing} is missing")
    given = [bool(data["train_tsv"] or data["train_source"]), bool(data["train_corpora"])]
    if not any(given) and not saved:  # an imported model's work directory has none
        raise UserError(f"{where}: no training data: set data.train_source and data.train_target")
    if all(given):
        raise UserError(
            f"{where}: data.train_corpora replaces data.train_source/target/tsv; give one of them"
        )
    if any(given):  # an imported model fine-tuned: its pairs' languages
        multilingual.pair_tokens(data, f"{where}: data")
    _check_training_settings(config, where, saved)


def _check_multiway_consistency(data, where):
    """A multi-way set replaces every other form of the splits, needs a shared vocabulary,
    and trains directions between its languages."""
    others = [key for split in ("train", "valid", "test") for key in
              (f"{split}_source", f"{split}_target", f"{split}_tsv") if data[key]]  # fmt: skip
    if data["train_corpora"]:
        others.append("train_corpora")
    if others:
        raise UserError(f"{where}: data.multiway_train replaces data.{others[0]}; give one of "
                        "them")  # fmt: skip
    if not data["shared_vocabulary"]:
        raise UserError(f"{where}: data.multiway_train needs data.shared_vocabulary: true "
                        "(one vocabulary over every language, with the target-language "
                        "tags)")  # fmt: skip
    languages = set(data["multiway_train"])
    for split in ("valid", "test"):
        extra = sorted(set(data[f"multiway_{split}"] or {}) - languages)
        if extra:
            raise UserError(f"{where}: data.multiway_{split} has {extra[0]}, which "
                            "data.multiway_train does not")  # fmt: skip
    trained = multilingual.parse_directions(data["directions"], languages,
                                            f"{where}: data.directions")  # fmt: skip
    _check_synthetic(data, languages, trained, where)


def _check_synthetic(data, languages, trained, where):
    """Synthetic directions and their sources come together, each direction from a language
    given synthetic sources and not also trained from the set's own pairs."""
    files, text = data["multiway_synthetic"] or {}, data["synthetic_directions"]
    extra = sorted(set(files) - languages)
    if extra:
        raise UserError(f"{where}: data.multiway_synthetic has {extra[0]}, which "
                        "data.multiway_train does not")  # fmt: skip
    if bool(files) != bool(text):
        given, missing = (("multiway_synthetic", "synthetic_directions") if files else
                          ("synthetic_directions", "multiway_synthetic"))  # fmt: skip
        raise UserError(f"{where}: data.{given} needs data.{missing}")
    if not text:
        return
    named = f"{where}: data.synthetic_directions"
    for direction in multilingual.parse_directions(text, languages, named):
        if direction.source not in files:
            raise UserError(f"{where}: data.synthetic_directions: {direction} needs a "
                            f"{direction.source} file in data.multiway_synthetic")  # fmt: skip
        if direction in trained:
            raise UserError(f"{where}: data.synthetic_directions: {direction} is also in "
                            "data.directions; train it from one of them")  # fmt: skip


def _check_training_settings(config, where, saved=False):
    data, model, train = config["data"], config["model"], config["train"]
    budget = train["time_budget_hours"]
    if budget is not None and budget <= 0:
        raise UserError(f"{where}: train.time_budget_hours must be above 0 (null: no budget)")
    if budget is not None and config["distribute"]["strategy"] == "multi_worker":
        raise UserError(
            f"{where}: train.time_budget_hours needs a single-process strategy: workers would "
            "each measure their own time and could end at different epochs"
        )
    MODEL_TYPES[model["type"]].check(config, where)
    formats = parse_export_formats(config["export"]["formats"], f"{where}: export.formats")
    check_formats_fit_model(formats, model["type"], f"{where}: export.formats")
    if config["export"]["onnx_search"] == "greedy" and config["decode"]["beam_size"] != 1:
        raise UserError(
            f"{where}: export.onnx_search: greedy exports the greedy search alone, but "
            f"decode.beam_size is {config['decode']['beam_size']}; set decode.beam_size: 1 or "
            "export.onnx_search: beam"
        )
    if data["shared_vocabulary"] and data["source_vocab_size"] != data["target_vocab_size"]:
        raise UserError(
            f"{where}: data.shared_vocabulary needs data.source_vocab_size "
            f"({data['source_vocab_size']}) equal to data.target_vocab_size "
            f"({data['target_vocab_size']}): one vocabulary has one size"
        )
    if data["subword_sampling_nbest"] in (0, 1):
        raise UserError(
            f"{where}: data.subword_sampling_nbest must be -1 (all segmentations) or at least "
            f"2, got {data['subword_sampling_nbest']}: fewer leaves nothing to sample from"
        )
    # Two given models may share one id space (an imported checkpoint's two segmenters over
    # one vocabulary): the model checks their sizes when it is built.
    given_both = data["source_vocabulary"] and data["target_vocabulary"]
    if model["share_embeddings"] and not (data["shared_vocabulary"] or given_both or saved):
        raise UserError(
            f"{where}: model.share_embeddings needs data.shared_vocabulary: true (one "
            "vocabulary for both sides) or both data.source_vocabulary and "
            "data.target_vocabulary"
        )
    if train["average_checkpoints"] > train["keep_checkpoints"]:
        raise UserError(
            f"{where}: train.average_checkpoints ({train['average_checkpoints']}) exceeds "
            f"train.keep_checkpoints ({train['keep_checkpoints']}): only that many are kept"
        )
    effective = [key for key in ("effective_batch_tokens", "effective_batch_size") if train[key]]
    if len(effective) > 1 or (effective and train["accumulate_steps"] > 1):
        chosen = effective + (["accumulate_steps"] if train["accumulate_steps"] > 1 else [])
        raise UserError(f"{where}: train.{chosen[0]} and train.{chosen[1]} both set the "
                        "accumulation: keep one")  # fmt: skip
    if train["effective_batch_tokens"] and not train["batch_tokens"]:
        raise UserError(
            f"{where}: train.effective_batch_tokens needs train.batch_tokens (the "
            "micro-batch); with train.batch_size, set train.effective_batch_size"
        )
    if train["effective_batch_size"] and train["batch_tokens"]:
        raise UserError(
            f"{where}: train.effective_batch_size needs batches of "
            "train.batch_size pairs; with train.batch_tokens, set "
            "train.effective_batch_tokens"
        )
    has_validation = data["valid_tsv"] or data["valid_source"] or data["multiway_valid"]
    for key in ("bleu_every_epochs", "keep_best"):
        if train[key] and not has_validation:
            raise UserError(f"{where}: train.{key} needs validation data")
    metric = train["early_stopping_metric"]
    if metric != "loss" and not has_validation:
        raise UserError(f"{where}: train.early_stopping_metric: {metric} needs validation data")
    if metric != "loss" and config["distribute"]["strategy"] == "multi_worker":
        raise UserError(
            f"{where}: train.early_stopping_metric: {metric} needs a single-process strategy: "
            "only the chief translates the validation subset"
        )


def parse_export_formats(text, where):
    """`"saved_model,onnx"` -> `["saved_model", "onnx"]`, refusing anything else."""
    formats = [f.strip() for f in text.split(",")]
    if not formats or not set(formats) <= set(EXPORT_FORMATS):
        raise UserError(
            f"{where} must be a comma-separated subset of {', '.join(EXPORT_FORMATS)}; got {text!r}"
        )
    return formats


def check_formats_fit_model(formats, model_type, where):
    """Refuses a format that cannot hold a model of `model_type` (before training, not after)."""
    for export_format in formats:
        why = MODEL_TYPES[model_type].unfit_formats.get(export_format)
        if why:
            fitting = [n for n, t in MODEL_TYPES.items() if export_format not in t.unfit_formats]
            raise UserError(
                f"{where}: {export_format} needs model.type: {' or '.join(fitting)}, got "
                f"{model_type} ({why})"
            )


def find_config(path):
    """`path`, or where it names no file, the shipped recipe of that name (`--config
    multi30k_de_en_transformer` or `configs/multi30k_de_en.yaml` from any directory)."""
    path = Path(path)
    recipe = RECIPES / (path.name if path.suffix else path.name + ".yaml")
    return recipe if not path.exists() and recipe.is_file() else path


def load_config(path=None, overrides=(), saved=False):
    """The validated configuration: defaults < the YAML file < `--set` overrides. `saved`: a
    work directory's configuration, whose model keys of other model types (an older release
    saved them all) are dropped."""
    path = find_config(path) if path else DEFAULT_CONFIG
    where = str(path)
    try:
        text = path.read_text(encoding="utf-8")
    except FileNotFoundError:
        raise UnusableFileError(where, "configuration file not found") from None
    except (OSError, UnicodeDecodeError) as error:
        raise UnusableFileError(where, f"cannot read the configuration ({error})") from None
    try:
        raw = yaml.safe_load(text) or {}
    except yaml.YAMLError as error:
        raise UnusableFileError(where, f"invalid YAML: {error}") from None
    overrides = parse_overrides(overrides)
    file_type = _model_type(raw, where, DEFAULT_MODEL_TYPE)
    model_type = _model_type(overrides, "--set", file_type)
    if saved or model_type != file_type:
        raw = _without_other_types_keys(raw, model_type)
    config = defaults(model_type)
    fields = schema(model_type)
    _merge(config, raw, where, path.resolve().parent, fields)
    _merge(config, overrides, "--set", Path.cwd(), fields)
    _check_consistency(config, where, saved)
    return config


def save_config(config, path):
    """Writes the resolved configuration, atomically."""
    write_text_atomically(path, yaml.safe_dump(config, sort_keys=False))
