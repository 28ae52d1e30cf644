"""Small random Marian (OPUS-MT) checkpoints, and what Hugging Face `transformers` computes with
them: the fixtures of the Marian importer's tests (`tests/fixtures/hf_marian/`).

    runs/hf/venv/bin/python tools/hf_fixtures.py --out tests/fixtures/hf_marian
    python3 tools/hf_fixtures.py --venv runs/hf/venv --out tests/fixtures/hf_marian

PyTorch and `transformers` never enter the project's environment: this script runs in a venv
of its own, and imports nothing of the toolkit (nor TensorFlow). Make the venv with

    python3 -m venv V && V/bin/pip install torch==2.13.0 transformers sentencepiece \
        safetensors protobuf ctranslate2

(ctranslate2 for `bench/pretrained.py`'s converter; torch first, as `bench/peer_toolkits.py`
installs it: the 2.13.0 CPU wheel; a plain `torch` is a CUDA build), or pass `--venv V`,
which makes it so when `V/installed` is missing or
records other packages (`VENV_PACKAGES`, transformers pinned to the version that made the
committed fixtures), then runs this script again with `V/bin/python`. The committed fixtures
were made with torch 2.13.0+cpu and transformers 5.25.0, without `sacremoses` (so
MarianTokenizer's Moses punctuation normaliser was the identity; expected.json records it, and
the test sentences are chosen to hold nothing that it would change).

What it does (seeded throughout; it overwrites `--out`):

1. Data: the first `TRAIN_LINES` lines of Multi30k's training split
   (`/work/shared/data/multi30k`, plain text, `.gz` also read); test sentences from
   test_2016_flickr: the first `TEST_SENTENCES` whose source and reference are short and
   hold only letters, digits, spaces and `.,'-`, then three edge cases (characters absent from
   the SentencePiece models, "Straße ☃ 東京"; one word; the short sentence in full-width
   forms, which only `shared_tied_swish`'s SentencePiece models normalise).
2. SentencePiece (unigram) source and target models, ids as Marian's: <unk> 0, <s> 1, </s> 2,
   no <pad>, written as `source.spm` / `target.spm`. Their normaliser is the identity (nmt_nfkc
   would add a 240 kB character map to every file), except `shared_tied_swish`'s: a small
   user-defined rule (NFKC of the full-width forms, U+3000 and the Latin ligatures), so that an
   importer that skips the models' normaliser fails a test.
3. `vocab.json` as OPUS-MT's: `</s>` 0, `<unk>` 1, [the tags `>>fra<<` `>>deu<<`], the
   pieces (the source model's in its order, then the target model's that are new; neither's
   <unk>/<s>/</s>), `<pad>` last (the pad id, decoder start, V - 1). Separate vocabularies:
   `vocab.json` the source model's pieces, `target_vocab.json` the target model's, both of the
   same size (transformers' converter requires it; the decoder's embedding takes the pad id,
   V - 1, as its padding index), `separate_vocabs: true` in tokenizer_config.json.
4. `MarianMTModel(MarianConfig(...))`, d_model 32, with a random `final_logits_bias` (a
   buffer, normal * 0.5, untouched by training), trained briefly with Adam on the pairs as
   MarianTokenizer tokenises them (`tokenizer(src, text_target=tgt)`).
5. `generation_config.json` as OPUS-MT ships it (num_beams 4, bad_words_ids [[pad]],
   forced_eos_token_id 0, renormalize_logits true, no early_stopping), but max_length 64.
6. `expected.json`, computed with the checkpoint reloaded from disk (`from_pretrained`, eval,
   float32): see `expected()`; `generation_variants.json`, `generate()`'s ids with other
   generation settings (`GENERATION_VARIANTS`; `--generation-variants-only` rewrites just
   these from the fixtures on disk).

Fixtures (`FIXTURES`):

- `shared_tied_swish`: de->en, one vocabulary (3 source pieces left out of vocab.json, so
  that MarianTokenizer maps them to <unk>), tied output, swish, 2 + 2 layers, heads 4/4, ffn
  64/64; model.safetensors in the transformers 4 layout.
- `separate_untied_relu`: de->en, separate vocabularies, untied output, relu, 2 + 1 layers,
  heads 4/4, ffn 64/64; the transformers 5 layout.
- `unequal_gelu`: en->de, one vocabulary, tied, gelu, 3 + 1 layers, heads 4/2, ffn 96/48;
  the transformers 5 layout.
- `multi_target`: en->de and en->fr (Multi30k is parallel in all four languages: the source
  with `>>deu<<` or `>>fra<<` before it, as OPUS-MT's multi-target models take it), one
  vocabulary with the tags at ids 2 and 3, tied, swish, 2 + 2, heads 4/4, ffn 64/64; the
  transformers 5 layout.

The two key layouts of model.safetensors (float32; a layer's keys are the same in both):

- transformers 5 (`save_pretrained`, as 5.25.0 writes it): `final_logits_bias` [1, V_target];
  shared vocabulary and tied output: `model.shared.weight` [V, d] only (the encoder's and
  decoder's `embed_tokens` and `lm_head` are tied to it and not written); separate
  vocabularies, untied: `model.encoder.embed_tokens.weight` [V_source, d],
  `model.decoder.embed_tokens.weight` [V_target, d], `lm_head.weight` [V_target, d] (no
  `model.shared.weight`). No positional table (`_keys_to_ignore_on_save`: sinusoidal,
  recomputed).
- transformers 4 (as converted OPUS-MT checkpoints hold them): `model.shared.weight`,
  `model.encoder.embed_tokens.weight`, `model.decoder.embed_tokens.weight` and
  `lm_head.weight`, four equal copies of the tied embedding [V, d];
  `model.encoder.embed_positions.weight` and `model.decoder.embed_positions.weight`, the
  sinusoidal tables [max_position_embeddings, d] (sin in the first d/2 columns, cos in the
  rest); `final_logits_bias` [1, V]. transformers 5 loads this file as it is and gives the
  same logits (checked here).
- Each layer: `model.encoder.layers.N.` + `self_attn.{q,k,v,out}_proj.{weight,bias}`,
  `self_attn_layer_norm.{weight,bias}`, `fc1.{weight,bias}`, `fc2.{weight,bias}`,
  `final_layer_norm.{weight,bias}`; `model.decoder.layers.N.` + the same and
  `encoder_attn.{q,k,v,out}_proj.{weight,bias}`, `encoder_attn_layer_norm.{weight,bias}`.
  Linear weights are [out, in] (torch's).
"""

import argparse
import gzip
import json
import os
import random
import re
import shutil
import sys
import tempfile
import time
import unicodedata
import warnings
from pathlib import Path

# The venvs are made as the benchmarks' peers' are (bench/common.py).
sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "bench"))
import common  # noqa: E402

PROJECT_ROOT = common.PROJECT_ROOT
MULTI30K = PROJECT_ROOT.parent / "shared" / "data" / "multi30k"
# torch first, alone: the CPU wheel (see bench/peer_toolkits.py's PEERS).
VENV_PACKAGES = (
    ("torch==2.13.0",),
    (
        "torch==2.13.0",
        "transformers==5.25.0",
        "sentencepiece",
        "safetensors",
        "protobuf",
        "ctranslate2==4.8.5",
    ),
)

SEED = 1234
TRAIN_LINES = 10_000
TEST_SENTENCES = 12  # from test_2016_flickr, before the edge cases
TARGET_TEXTS = 4  # of them with their references tokenised as labels
FORCED = 3  # of those with the full logits under teacher forcing
BEAM_SHORT = 3  # of them generated with max_length BEAM_SHORT_LENGTH
BEAM_SHORT_LENGTH = 6
# generation_config.json keys set over the saved ones, each set in turn: `generate()`'s ids
# for the first VARIANT_SENTENCES test sentences with them, in generation_variants.json.
GENERATION_VARIANTS = {
    "max_new_tokens": {"max_new_tokens": 5},
    "min_new_tokens": {"min_new_tokens": 14},
    "min_length_greedy": {"num_beams": 1, "min_length": 12},
    "ngrams_penalty_early_stop": {"no_repeat_ngram_size": 2, "length_penalty": 0.6,
                                  "early_stopping": True},
    # Beams cut at the limit: some end in a lone word-boundary piece, which decodes to a space.
    "cut_at_max_length": {"max_length": 8},
}  # fmt: skip
VARIANT_SENTENCES = 6
GENERATION_VARIANTS_FILE = "generation_variants.json"
MAX_LENGTH = 64  # generation_config.json's max_length (OPUS-MT ships 512)
MAX_POSITIONS = 128
MISSING_PIECES = 3  # left out of shared_tied_swish's vocab.json
TAGS = (">>fra<<", ">>deu<<")
LANGUAGE_TAG = {"fr": "fra", "de": "deu"}
ONE_WORD = {"de": "Hund", "en": "Dog"}
FULL_WIDTH = {"de": "Ein Hund.", "en": "A dog."}  # written in full-width forms
UNKNOWN_CHARACTERS = "Straße ☃ 東京"
SAFE_TEXT = re.compile(r"^[\w ,.'-]+$")

BASE = dict(
    d_model=32, encoder_layers=2, decoder_layers=2, encoder_attention_heads=4,
    decoder_attention_heads=4, encoder_ffn_dim=64, decoder_ffn_dim=64,
    activation_function="swish", share_encoder_decoder_embeddings=True, tie_word_embeddings=True,
)  # fmt: skip
FIXTURES = {
    "shared_tied_swish": dict(
        source="de", targets=("en",), spm_pieces=(256, 256), normalization="nfkc_subset",
        missing=MISSING_PIECES, layout="transformers4", model=BASE,
    ),
    "separate_untied_relu": dict(
        source="de", targets=("en",), spm_pieces=(288, 288), separate=True,
        model={**BASE, "activation_function": "relu", "decoder_layers": 1,
               "share_encoder_decoder_embeddings": False, "tie_word_embeddings": False},
    ),
    "unequal_gelu": dict(
        source="en", targets=("de",), spm_pieces=(256, 256),
        model={**BASE, "activation_function": "gelu", "encoder_layers": 3, "decoder_layers": 1,
               "decoder_attention_heads": 2, "encoder_ffn_dim": 96, "decoder_ffn_dim": 48},
    ),
    "multi_target": dict(
        source="en", targets=("de", "fr"), spm_pieces=(256, 320), tags=TAGS, model=BASE,
    ),
}  # fmt: skip
TRAINING = dict(steps=1200, batch=64, lr=3e-3, warmup=100, max_tokens=60, threads=2)
SIZE_LIMIT = 2 * 1024 * 1024


# --- the venv ------------------------------------------------------------------------------


def make_venv(venv):
    """Makes `venv` once (`common.make_venv`, VENV_PACKAGES): its python."""
    venv = Path(venv).resolve()
    return common.make_venv(
        venv, VENV_PACKAGES, message=f"Installing {', '.join(VENV_PACKAGES[-1])} into {venv}"
    )


def ensure_venv(venv, script=Path(__file__)):
    """Runs `script` (this one) again in `venv` (made first if missing), without --venv."""
    if Path(sys.prefix).resolve() == Path(venv).resolve():
        return
    python = make_venv(venv)
    arguments, skip = [], False
    for argument in sys.argv[1:]:
        if skip:
            skip = False
        elif argument == "--venv":
            skip = True
        elif not argument.startswith("--venv="):
            arguments.append(argument)
    os.execv(str(python), [str(python), str(Path(script).resolve()), *arguments])


def fixture_arguments(description, default_out, fixtures):
    """The command line every fixture script takes."""
    parser = argparse.ArgumentParser(description=description)
    parser.add_argument("--out", type=Path, default=default_out)
    parser.add_argument("--venv", type=Path, help="run in this venv, made first if missing")
    parser.add_argument("--fixtures", nargs="+", choices=list(fixtures), default=list(fixtures))
    parser.add_argument("--steps", type=int, default=TRAINING["steps"], help="training steps")
    return parser


def start(args, script):
    """What a fixture script does before its fixtures (`fixture_arguments`' `args`): itself
    again in `--venv`, `--steps` into TRAINING, torch on TRAINING's threads, transformers
    quiet, the fixtures' old folders under `--out` removed. Returns (`--out`, a log)."""
    if args.venv is not None:
        ensure_venv(args.venv, script)
    TRAINING["steps"] = args.steps
    import torch
    import transformers

    torch.set_num_threads(TRAINING["threads"])
    transformers.logging.set_verbosity_error()
    transformers.logging.disable_progress_bar()
    warnings.filterwarnings("ignore", message="Recommended: pip install sacremoses")
    out = args.out.resolve()
    for name in args.fixtures:
        if (out / name).exists():
            shutil.rmtree(out / name)
    out.mkdir(parents=True, exist_ok=True)
    return out, lambda message: print(message, flush=True)


# --- data ----------------------------------------------------------------------------------


def read_lines(split, language, limit=None):
    path = MULTI30K / f"{split}.{language}"
    if not path.exists():
        path = path.with_name(path.name + ".gz")
    opener = gzip.open if path.suffix == ".gz" else open
    lines = []
    with opener(path, "rt", encoding="utf-8") as file:
        for line in file:
            if limit is not None and len(lines) >= limit:
                break
            lines.append(line.rstrip("\n"))
    return lines


def full_width(text):
    return "".join(chr(ord(c) + 0xFEE0) if "!" <= c <= "~" else "\u3000" if c == " " else c
                   for c in text)  # fmt: skip


def test_sentences(source, targets):
    """[(source text, target language, reference)]: short, plain test_2016_flickr sentences,
    the target languages alternating; then the edge cases (no reference)."""
    sources = read_lines("test_2016_flickr", source)
    references = {t: read_lines("test_2016_flickr", t) for t in targets}
    chosen = []
    for i, text in enumerate(sources):
        target = targets[len(chosen) % len(targets)]
        reference = references[target][i]
        if (4 <= len(text.split()) <= 10 and len(reference.split()) <= 9
                and SAFE_TEXT.match(text) and SAFE_TEXT.match(reference)):  # fmt: skip
            chosen.append((text, target, reference))
        if len(chosen) == TEST_SENTENCES:
            break
    for text in (UNKNOWN_CHARACTERS, ONE_WORD[source], full_width(FULL_WIDTH[source])):
        chosen.append((text, targets[len(chosen) % len(targets)], None))
    return chosen


# --- SentencePiece and the vocabularies ----------------------------------------------------


def normalization_rule(path):
    """NFKC of the full-width forms, the ideographic space and the Latin ligatures: a
    user-defined SentencePiece normaliser of a few kB (nmt_nfkc's map is 240 kB)."""
    points = [*range(0xFF01, 0xFF5F), 0x3000, *range(0xFB00, 0xFB07)]
    rows = []
    for point in points:
        normal = unicodedata.normalize("NFKC", chr(point))
        rows.append(f"{point:X}\t{' '.join(f'{ord(c):X}' for c in normal)}")
    path.write_text("\n".join(rows) + "\n", encoding="utf-8")
    return path


def train_spm(lines, pieces, path, normalization, work, model_type="unigram"):
    import sentencepiece as spm

    options = dict(
        sentence_iterator=iter(lines), model_prefix=str(work / path.stem), vocab_size=pieces,
        model_type=model_type, unk_id=0, bos_id=1, eos_id=2, pad_id=-1, character_coverage=1.0,
        num_threads=1, seed_sentencepiece_size=200_000, minloglevel=2,
    )  # fmt: skip
    if normalization == "nfkc_subset":
        options["normalization_rule_tsv"] = str(normalization_rule(work / "rule.tsv"))
    else:
        options["normalization_rule_name"] = "identity"
    spm.SentencePieceTrainer.train(**options)
    # Without the paths the trainer records (the temporary folder), so that a rerun writes the
    # same bytes.
    from sentencepiece import sentencepiece_model_pb2

    model = sentencepiece_model_pb2.ModelProto()
    model.ParseFromString((work / f"{path.stem}.model").read_bytes())
    model.trainer_spec.ClearField("model_prefix")
    model.normalizer_spec.ClearField("normalization_rule_tsv")
    path.write_bytes(model.SerializeToString())
    return spm.SentencePieceProcessor(model_file=str(path))


def ordinary_pieces(processor):
    return [
        processor.id_to_piece(i)
        for i in range(processor.get_piece_size())
        if not (processor.is_control(i) or processor.is_unknown(i))
    ]


def marian_vocab(pieces, tags=()):
    vocab = {"</s>": 0, "<unk>": 1}
    for piece in (*tags, *pieces):
        vocab.setdefault(piece, len(vocab))
    vocab["<pad>"] = len(vocab)
    return vocab


def missing_pieces(source_spm, target_spm, train_sources, tests, count):
    """`count` source pieces, not target pieces, of two characters or more, that the test
    sentences use most (ties: the most frequent in training)."""
    target = set(ordinary_pieces(target_spm))
    in_tests, in_training = {}, {}
    for text in tests:
        for piece in source_spm.encode(text, out_type=str):
            in_tests[piece] = in_tests.get(piece, 0) + 1
    for text in train_sources:
        for piece in source_spm.encode(text, out_type=str):
            in_training[piece] = in_training.get(piece, 0) + 1
    candidates = [
        p for p in ordinary_pieces(source_spm)
        if p not in target and len(p.lstrip("\u2581")) >= 2 and p in in_tests
    ]  # fmt: skip
    candidates.sort(key=lambda p: (-in_tests[p], -in_training.get(p, 0), p))
    return candidates[:count]


# --- training ------------------------------------------------------------------------------


def set_seed(seed):
    import numpy as np
    import torch

    random.seed(seed)
    np.random.seed(seed)
    torch.manual_seed(seed)


def encoded_pairs(tokenizer, pairs):
    """(source ids, label ids) of (source, target) text pairs, as the tokenizer makes them."""
    encoded = tokenizer([s for s, _ in pairs], text_target=[t for _, t in pairs])
    return list(zip(encoded["input_ids"], encoded["labels"]))


def train(model, pairs, pad_id, settings, log):
    """Adam on (source ids, label ids) pairs."""
    import numpy as np
    import torch

    sources = [ids[: settings["max_tokens"]] for ids, _ in pairs]
    labels = [ids[: settings["max_tokens"]] for _, ids in pairs]
    rng = np.random.default_rng(SEED)
    optimizer = torch.optim.Adam(model.parameters(), lr=settings["lr"], betas=(0.9, 0.98))
    schedule = torch.optim.lr_scheduler.LambdaLR(
        optimizer, lambda step: min(1.0, (step + 1) / settings["warmup"])
    )
    model.train()
    started, losses = time.time(), []
    for step in range(settings["steps"]):
        batch = rng.choice(len(pairs), settings["batch"], replace=False)
        source_length = max(len(sources[i]) for i in batch)
        label_length = max(len(labels[i]) for i in batch)
        input_ids = torch.full((len(batch), source_length), pad_id)
        attention = torch.zeros((len(batch), source_length), dtype=torch.long)
        target = torch.full((len(batch), label_length), -100)
        for row, i in enumerate(batch):
            input_ids[row, : len(sources[i])] = torch.tensor(sources[i])
            attention[row, : len(sources[i])] = 1
            target[row, : len(labels[i])] = torch.tensor(labels[i])
        loss = model(input_ids=input_ids, attention_mask=attention, labels=target).loss
        optimizer.zero_grad()
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        optimizer.step()
        schedule.step()
        losses.append(loss.item())
        if (step + 1) % 100 == 0:
            log(f"  step {step + 1}: loss {sum(losses[-100:]) / 100:.3f} "
                f"({time.time() - started:.0f} s)")  # fmt: skip
    model.eval()


# --- the checkpoint ------------------------------------------------------------------------


def safetensors_keys(path):
    from safetensors import safe_open

    with safe_open(str(path), "pt") as file:
        return {key: list(file.get_slice(key).get_shape()) for key in file.keys()}


def rewrite_transformers4(directory, model):
    """model.safetensors with the keys transformers 4 wrote for a Marian model with a shared,
    tied embedding: the embedding under all four names, the sinusoidal tables."""
    from safetensors.torch import load_file, save_file

    path = directory / "model.safetensors"
    tensors = load_file(str(path))
    shared = tensors["model.shared.weight"]
    for key in ("model.encoder.embed_tokens.weight", "model.decoder.embed_tokens.weight",
                "lm_head.weight"):  # fmt: skip
        tensors[key] = shared.clone()
    for side in ("encoder", "decoder"):
        table = getattr(model.model, side).embed_positions.weight.detach()
        tensors[f"model.{side}.embed_positions.weight"] = table.clone().contiguous()
    save_file(tensors, str(path), metadata={"format": "pt"})


def float32_lists(array):
    """Nested lists of floats whose shortest repr names each float32 exactly (so JSON stays
    small): read them back as float32 and they are the float32 values bit for bit."""
    import numpy as np

    if array.ndim == 1:
        return [float(str(np.float32(v))) for v in array]
    return [float32_lists(row) for row in array]


def strip_generated(ids, start_id, pad_id):
    """Generated ids less the leading decoder start token and any trailing pad."""
    ids = list(ids)
    if ids and ids[0] == start_id:
        ids = ids[1:]
    while ids and ids[-1] == pad_id:
        ids.pop()
    return ids


def expected(directory, tests, multi, log):
    """What transformers computes with the checkpoint in `directory`, reloaded:

    - `sentences`, `source_ids` (MarianTokenizer's, the tag prepended as ">>fra<< " + text
      for a multi-target model; `target_languages` then says which); `target_texts` and
      `target_ids` (`text_target=`, the labels) for the first TARGET_TEXTS sentences;
    - `forced`: for the first FORCED of those, `decoder_input_ids` (the decoder start, then
      the labels shifted right) and the full `logits` [length, V_target], float32;
    - `greedy_ids` / `greedy_texts` (num_beams 1), `beam_ids` / `beam_texts` / `beam_scores`
      (generation_config.json as saved; `sequences_scores`), each sentence alone; the ids less
      the decoder start and the trailing pad, </s> kept; texts `skip_special_tokens=True`;
    - `beam_ids_batched`: the same sentences as one padded batch (transformers' own batch
      invariance, recorded, not asserted); `beam_short`: the first BEAM_SHORT sentences with
      max_length BEAM_SHORT_LENGTH (the forced </s> at the limit);
    - `generation`: the generation configuration used; the versions.
    """
    import numpy as np
    import torch
    import transformers
    from transformers import MarianMTModel, MarianTokenizer

    tokenizer = MarianTokenizer.from_pretrained(str(directory))
    model = MarianMTModel.from_pretrained(str(directory), dtype=torch.float32).eval()
    config, generation = model.config, model.generation_config
    start, pad = config.decoder_start_token_id, config.pad_token_id

    sentences = [text for text, _, _ in tests]
    inputs = [f">>{LANGUAGE_TAG[target]}<< {text}" if multi else text for text, target, _ in tests]
    result = {"sentences": sentences}
    if multi:
        result["target_languages"] = [LANGUAGE_TAG[target] for _, target, _ in tests]
    result["inputs"] = inputs
    result["source_ids"] = [tokenizer(text)["input_ids"] for text in inputs]
    # The references: those of the sentences whose labels are shortest (the logits stay small).
    labels = {
        i: tokenizer(text_target=ref)["input_ids"] for i, (_, _, ref) in enumerate(tests) if ref
    }  # fmt: skip
    chosen = sorted(sorted(labels, key=lambda i: (len(labels[i]), i))[:TARGET_TEXTS])
    result["target_sentence_indices"] = chosen
    result["target_texts"] = [tests[i][2] for i in chosen]
    result["target_ids"] = [labels[i] for i in chosen]

    forced = []
    with torch.no_grad():
        for i, labels in zip(chosen[:FORCED], result["target_ids"][:FORCED]):
            decoder_input_ids = [start, *labels[:-1]]
            logits = model(
                input_ids=torch.tensor([result["source_ids"][i]]),
                decoder_input_ids=torch.tensor([decoder_input_ids]),
            ).logits[0]
            check = model(
                input_ids=torch.tensor([result["source_ids"][i]]), labels=torch.tensor([labels])
            ).logits[0]
            assert torch.equal(logits, check), "decoder_input_ids differ from shift_tokens_right"
            forced.append({
                "sentence_index": i,
                "decoder_input_ids": decoder_input_ids,
                "logits": float32_lists(logits.numpy().astype(np.float32)),
            })  # fmt: skip
    result["forced"] = forced

    def generate(text, **kwargs):
        encoded = tokenizer(text, return_tensors="pt")
        with torch.no_grad():
            return model.generate(**encoded, **kwargs)

    greedy, beam, scores = [], [], []
    for text in inputs:
        greedy.append(strip_generated(generate(text, num_beams=1)[0].tolist(), start, pad))
        out = generate(text, return_dict_in_generate=True, output_scores=True)
        beam.append(strip_generated(out.sequences[0].tolist(), start, pad))
        scores.append(float(out.sequences_scores[0]))
    result["greedy_ids"] = greedy
    result["greedy_texts"] = [tokenizer.decode(ids, skip_special_tokens=True) for ids in greedy]
    result["beam_ids"] = beam
    result["beam_texts"] = [tokenizer.decode(ids, skip_special_tokens=True) for ids in beam]
    result["beam_scores"] = scores
    batch = tokenizer(inputs, return_tensors="pt", padding=True)
    with torch.no_grad():
        batched = model.generate(**batch)
    result["beam_ids_batched"] = [strip_generated(row.tolist(), start, pad) for row in batched]
    result["beam_short_length"] = BEAM_SHORT_LENGTH
    result["beam_short"] = [
        strip_generated(generate(text, max_length=BEAM_SHORT_LENGTH)[0].tolist(), start, pad)
        for text in inputs[:BEAM_SHORT]
    ]
    # generation_config.json's values, then transformers' defaults for those it leaves unset
    # (as `generate` fills them in); the assistant's and the output options left out.
    used = {**generation._get_default_generation_params(), **{
        key: value for key, value in generation.to_dict().items() if value is not None
    }}  # fmt: skip
    result["generation"] = {
        key: value for key, value in sorted(used.items())
        if value is not None and key not in ("transformers_version", "_from_model_config")
        and not re.match(r"(output_|return_dict|num_return|.*assistant|target_lookbehind)", key)
    }  # fmt: skip
    result["transformers_version"] = transformers.__version__
    result["torch_version"] = torch.__version__
    try:
        import sacremoses

        result["sacremoses"] = getattr(sacremoses, "__version__", "installed")
    except ImportError:
        result["sacremoses"] = None  # MarianTokenizer's punctuation normaliser: the identity

    # Statistics: finished greedy outputs (</s> chosen before the limit), beam != greedy.
    def finished(ids):
        return bool(ids) and ids[-1] == config.eos_token_id and len(ids) + 1 < MAX_LENGTH

    stats = {
        "greedy_finished": sum(map(finished, greedy)),
        "beam_finished": sum(map(finished, beam)),
        "beam_differs": sum(g != b for g, b in zip(greedy, beam)),
        "batched_differs": sum(b != c for b, c in zip(beam, result["beam_ids_batched"])),
        "sentences": len(inputs),
    }
    log(f"  greedy finished {stats['greedy_finished']}/{len(inputs)}, beam finished "
        f"{stats['beam_finished']}/{len(inputs)}, beam != greedy {stats['beam_differs']}, "
        f"batched beam != beam {stats['batched_differs']}")  # fmt: skip
    for text, ids in list(zip(inputs, result["greedy_texts"]))[:4]:
        log(f"    {text!r} -> {ids!r}")
    return result, stats


def write_expected(path, result):
    """One top-level key a line; the logits one row a line."""
    lines = []
    for key, value in result.items():
        if key == "forced":
            items = []
            for item in value:
                rows = ",\n".join(json.dumps(row, separators=(",", ":")) for row in item["logits"])
                head = {k: v for k, v in item.items() if k != "logits"}
                items.append(json.dumps(head, ensure_ascii=False)[:-1] + ', "logits": [\n'
                             + rows + "]}")  # fmt: skip
            text = "[\n" + ",\n".join(items) + "]"
        else:
            text = json.dumps(value, ensure_ascii=False)
        lines.append(f"{json.dumps(key)}: {text}")
    path.write_text("{\n" + ",\n".join(lines) + "\n}\n", encoding="utf-8")
    json.loads(path.read_text(encoding="utf-8"))


def directory_size(path):
    return sum(p.stat().st_size for p in Path(path).rglob("*") if p.is_file())


# --- one fixture ---------------------------------------------------------------------------


def make_fixture(name, spec, out, log):
    import torch
    from transformers import GenerationConfig, MarianConfig, MarianMTModel, MarianTokenizer

    started = time.time()
    log(f"{name}:")
    set_seed(SEED)
    directory = out / name
    directory.mkdir(parents=True)
    source, targets = spec["source"], spec["targets"]
    train_sources = read_lines("train", source, TRAIN_LINES)
    train_targets = {t: read_lines("train", t, TRAIN_LINES) for t in targets}
    tests = test_sentences(source, targets)
    multi = len(targets) > 1

    with tempfile.TemporaryDirectory() as work:
        work = Path(work)
        normalization = spec.get("normalization", "identity")
        source_spm = train_spm(train_sources, spec["spm_pieces"][0], directory / "source.spm",
                               normalization, work)  # fmt: skip
        target_lines = [line for t in targets for line in train_targets[t]]
        target_spm = train_spm(target_lines, spec["spm_pieces"][1], directory / "target.spm",
                               normalization, work)  # fmt: skip

        missing = []
        if spec.get("missing"):
            missing = missing_pieces(source_spm, target_spm, train_sources,
                                     [text for text, _, _ in tests], spec["missing"])  # fmt: skip
            log(f"  left out of vocab.json: {missing}")
        separate = spec.get("separate", False)
        source_pieces = [p for p in ordinary_pieces(source_spm) if p not in missing]
        target_pieces = ordinary_pieces(target_spm)
        if separate:
            vocab = marian_vocab(source_pieces)
            target_vocab = marian_vocab(target_pieces)
            assert len(vocab) == len(target_vocab), "separate vocabularies of unequal sizes"
        else:
            vocab = marian_vocab([*source_pieces, *target_pieces], spec.get("tags", ()))
            target_vocab = vocab
        (work / "vocab.json").write_text(json.dumps(vocab, ensure_ascii=False, indent=0))
        vocab_files = {"vocab": str(work / "vocab.json")}
        if separate:
            (work / "target_vocab.json").write_text(
                json.dumps(target_vocab, ensure_ascii=False, indent=0)
            )
            vocab_files["target_vocab_file"] = str(work / "target_vocab.json")
        tokenizer = MarianTokenizer(
            source_spm=str(directory / "source.spm"), target_spm=str(directory / "target.spm"),
            separate_vocabs=separate, source_lang=source,
            target_lang=targets[0] if not multi else None, **vocab_files,
        )  # fmt: skip

    size, target_size = len(vocab), len(target_vocab)
    pad = size - 1
    config = MarianConfig(
        vocab_size=size, decoder_vocab_size=target_size, scale_embedding=True, pad_token_id=pad,
        eos_token_id=0, decoder_start_token_id=pad, forced_eos_token_id=0,
        max_position_embeddings=MAX_POSITIONS, dropout=0.1, **spec["model"],
    )  # fmt: skip
    set_seed(SEED)
    model = MarianMTModel(config)
    with torch.no_grad():
        model.final_logits_bias.copy_(torch.randn(model.final_logits_bias.shape) * 0.5)
    bias = model.final_logits_bias.clone()
    log(f"  vocab {size}" + (f" / target {target_size}" if separate else "")
        + f", {sum(p.numel() for p in model.parameters())} parameters")  # fmt: skip

    if multi:
        pairs = [
            (f">>{LANGUAGE_TAG[t]}<< {s}", line)
            for t in targets for s, line in zip(train_sources, train_targets[t])
        ]  # fmt: skip
    else:
        pairs = list(zip(train_sources, train_targets[targets[0]]))
    train(model, encoded_pairs(tokenizer, pairs), pad, TRAINING, log)
    assert torch.equal(model.final_logits_bias, bias)

    model.generation_config = GenerationConfig(
        num_beams=4, max_length=MAX_LENGTH, bad_words_ids=[[pad]], forced_eos_token_id=0,
        decoder_start_token_id=pad, eos_token_id=0, pad_token_id=pad, renormalize_logits=True,
    )  # fmt: skip
    tokenizer.save_pretrained(str(directory))
    model.save_pretrained(str(directory))
    keys_v5 = safetensors_keys(directory / "model.safetensors")
    log(f"  transformers 5 keys (not in layers): {[k for k in keys_v5 if '.layers.' not in k]}")

    if spec.get("layout") == "transformers4":
        probe = torch.tensor([tokenizer(tests[0][0])["input_ids"]])
        with torch.no_grad():
            before = MarianMTModel.from_pretrained(str(directory)).eval()(
                input_ids=probe, decoder_input_ids=probe).logits  # fmt: skip
        rewrite_transformers4(directory, model)
        with torch.no_grad():
            after = MarianMTModel.from_pretrained(str(directory)).eval()(
                input_ids=probe, decoder_input_ids=probe).logits  # fmt: skip
        assert torch.equal(before, after), "the transformers 4 layout loads differently"
        keys_v4 = safetensors_keys(directory / "model.safetensors")
        log(f"  transformers 4 keys (not in layers): {[k for k in keys_v4 if '.layers.' not in k]}"
            ", same logits once reloaded")  # fmt: skip

    needed = {"config.json", "model.safetensors", "generation_config.json", "source.spm",
              "target.spm", "vocab.json", "tokenizer_config.json"}  # fmt: skip
    if separate:
        needed.add("target_vocab.json")
    for path in directory.iterdir():
        if path.name not in needed:
            path.unlink() if path.is_file() else shutil.rmtree(path)
    assert {p.name for p in directory.iterdir()} == needed, sorted(os.listdir(directory))
    saved_generation = json.loads((directory / "generation_config.json").read_text())
    assert "early_stopping" not in saved_generation, saved_generation

    result, stats = expected(directory, tests, multi, log)
    result = {"fixture": name, "missing_from_vocab": missing, **result}
    write_expected(directory / "expected.json", result)
    generation_variants(directory)
    stats.update(
        vocab=size, target_vocab=target_size, seconds=round(time.time() - started),
        bytes=directory_size(directory),
    )  # fmt: skip
    log(f"  {stats['bytes'] / 1024:.0f} kB, {stats['seconds']} s")
    return stats


def generation_variants(directory):
    """Writes `directory`/GENERATION_VARIANTS_FILE: for each of GENERATION_VARIANTS, its keys,
    `generate()`'s ids (less the decoder start and trailing pads) for the first
    VARIANT_SENTENCES of expected.json's inputs, each sentence alone, and their texts as
    `MarianTokenizer.decode` writes them; what proves the importer's mapping of those keys."""
    import torch
    from transformers import MarianMTModel, MarianTokenizer

    tokenizer = MarianTokenizer.from_pretrained(str(directory))
    model = MarianMTModel.from_pretrained(str(directory), dtype=torch.float32).eval()
    start, pad = model.config.decoder_start_token_id, model.config.pad_token_id
    inputs = json.loads((directory / "expected.json").read_text())["inputs"][:VARIANT_SENTENCES]
    variants = {}
    for name, keys in GENERATION_VARIANTS.items():
        ids, texts = [], []
        for text in inputs:
            with torch.no_grad():
                out = model.generate(**tokenizer(text, return_tensors="pt"), **keys)
            ids.append(strip_generated(out[0].tolist(), start, pad))
            texts.append(tokenizer.decode(out[0], skip_special_tokens=True))
        variants[name] = {"keys": keys, "ids": ids, "texts": texts}
    (directory / GENERATION_VARIANTS_FILE).write_text(json.dumps(variants, indent=1) + "\n")


def main():
    parser = fixture_arguments(__doc__.split("\n\n")[0], PROJECT_ROOT / "tests/fixtures/hf_marian",
                               FIXTURES)  # fmt: skip
    parser.add_argument("--generation-variants-only", action="store_true",
                        help=f"only (re)write {GENERATION_VARIANTS_FILE}")  # fmt: skip
    args = parser.parse_args()
    if args.generation_variants_only:
        if args.venv is not None:
            ensure_venv(args.venv, Path(__file__))
        for name in args.fixtures:
            generation_variants(args.out.resolve() / name)
        return
    out, log = start(args, Path(__file__))
    summary = {name: make_fixture(name, FIXTURES[name], out, log) for name in args.fixtures}
    total = directory_size(out)
    log("\nfixture               vocab  greedy finished  beam finished  beam!=greedy  kB")
    for name, s in summary.items():
        vocab = f"{s['vocab']}" + (f"/{s['target_vocab']}" if s["target_vocab"] != s["vocab"]
                                   else "")  # fmt: skip
        log(f"{name:21} {vocab:>6} {s['greedy_finished']:>9}/{s['sentences']:<6}"
            f"{s['beam_finished']:>9}/{s['sentences']:<6} {s['beam_differs']:>8}      "
            f"{s['bytes'] / 1024:.0f}")  # fmt: skip
    log(f"{out}: {total / 1024:.0f} kB (limit {SIZE_LIMIT / 1024:.0f} kB)")
    if total > SIZE_LIMIT:
        sys.exit(f"{out} is {total} bytes, over {SIZE_LIMIT}")


if __name__ == "__main__":
    main()
