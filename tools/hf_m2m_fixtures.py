"""Small random M2M100 and NLLB checkpoints (`model_type: m2m_100`) and an mBART-50 one
(`model_type: mbart`), and what Hugging Face `transformers` computes with them: the fixtures
of the many-to-many importers' tests (`tests/fixtures/hf_m2m/`).

    runs/hf/venv/bin/python tools/hf_m2m_fixtures.py --out tests/fixtures/hf_m2m
    python3 tools/hf_m2m_fixtures.py --venv runs/hf/venv --out tests/fixtures/hf_m2m

The venv is `tools/hf_fixtures.py`'s (its `VENV_PACKAGES`); nothing of the toolkit is
imported. Seeded throughout; it overwrites `--out`.

1. Data: the first `TRAIN_LINES` lines of Multi30k's German, English and French training
   files, three directions (`DIRECTIONS`); test sentences from test_2016_flickr, the
   directions taking turns, then the edge cases of `hf_fixtures` (unknown characters, one
   word).
2. One SentencePiece model over the three languages (`sentencepiece.bpe.model`, ids as
   fairseq's: <unk> 0, <s> 1, </s> 2), identity normaliser: BPE, or unigram for mBART-50.
3. The tokenizer files as each family ships them:
   - `m2m100`: `vocab.json`, fairseq's dictionary (<s> 0, <pad> 1, </s> 2, <unk> 3, then the
     pieces, in an order of their own: seeded shuffle, so that an importer has to map pieces
     through it), M2M100Tokenizer with its 100 language tokens (`__de__`) after the
     dictionary and its 8 "madeupword" tokens;
   - `nllb`: NllbTokenizer made from the SentencePiece model (ids: the model's + 1, <unk> 3),
     its 202 language codes (`deu_Latn`) as added tokens: `tokenizer.json` and
     `tokenizer_config.json` as transformers 5 writes them, `sentencepiece.bpe.model` as the
     Hub's NLLB repositories hold it;
   - `mbart50`: MBart50Tokenizer made alike (ids: the model's + 1), its 52 language codes
     (`de_DE`) and `<mask>` after the pieces.
4. `M2M100ForConditionalGeneration(M2M100Config(...))` or `MBartForConditionalGeneration(
   MBartConfig(...))` (learned positions, `layernorm_embedding`, `final_logits_bias`), d_model
   32 (see `FIXTURES`), trained briefly with Adam on the three directions, each pair tokenised
   with its languages: the source `[source language, pieces, </s>]`, the labels `[target
   language, pieces, </s>]`.
5. `generation_config.json`: num_beams 4, max_length 64, decoding from </s> (id 2); the
   target language is forced as the first token (`forced_bos_token_id`) at generation;
   mBART-50's also `forced_eos_token_id` and `early_stopping` as its Hub checkpoints have them.
6. `expected.json`, with the checkpoint reloaded from disk, float32, each sentence alone:
   `sentences`, `source_languages`, `target_languages`, `source_ids`; `target_ids` (labels)
   for the first TARGET_TEXTS; `forced` logits (decoder input: </s>, the labels shifted
   right) for the first FORCED; `greedy_ids` / `beam_ids` (less the decoder start: the
   target language token first, </s> last) with their texts (less that token,
   `skip_special_tokens`) and
   `beam_scores`; `generation`.
7. `capped.json` (`--capped-only` rewrites just it): the beam ids and scores of every
   sentence with max_length CAPPED_MAX_LENGTH, where beams run to the limit.
"""

import json
import random
import shutil
import sys
import tempfile
import time
from pathlib import Path

import hf_fixtures

PROJECT_ROOT = hf_fixtures.PROJECT_ROOT
SEED = hf_fixtures.SEED
TRAIN_LINES = 6_000  # of each language
DIRECTIONS = (("de", "en"), ("en", "fr"), ("fr", "de"))
TEST_SENTENCES = 9  # three a direction, before the edge cases
TARGET_TEXTS = 3
FORCED = 2
MAX_LENGTH = 64
# capped.json's max_length: most beams of the fixtures' sentences run to it.
CAPPED_MAX_LENGTH = 12
CAPPED_FILE = "capped.json"
MAX_POSITIONS = 128
SPM_PIECES = 480
CODES = {
    "m2m100": {"de": "de", "en": "en", "fr": "fr"},
    "nllb": {"de": "deu_Latn", "en": "eng_Latn", "fr": "fra_Latn"},
    "mbart50": {"de": "de_DE", "en": "en_XX", "fr": "fr_XX"},
}
BASE = dict(
    d_model=32, encoder_layers=2, decoder_layers=2, encoder_attention_heads=4,
    decoder_attention_heads=4, encoder_ffn_dim=64, decoder_ffn_dim=64,
    activation_function="relu", scale_embedding=True,
)  # fmt: skip
FIXTURES = {
    "m2m100": dict(model=BASE),
    "nllb": dict(model={**BASE, "decoder_layers": 1, "decoder_attention_heads": 2,
                        "decoder_ffn_dim": 48}),
    # mBART's SentencePiece model (XLM-R's) is a unigram one, which MBart50Tokenizer assumes.
    "mbart50": dict(model={**BASE, "activation_function": "gelu"}, spm_type="unigram",
                    generation=dict(forced_eos_token_id=2, early_stopping=True)),
}  # fmt: skip
TRAINING = hf_fixtures.TRAINING  # one training recipe for every fixture


def test_cases():
    """[(text, source language, target language, reference)]: short, plain test_2016_flickr
    sentences, the directions taking turns; then the edge cases (no reference)."""
    texts = {language: hf_fixtures.read_lines("test_2016_flickr", language)
             for language in ("de", "en", "fr")}  # fmt: skip
    chosen = []
    for i in range(len(texts["de"])):
        source, target = DIRECTIONS[len(chosen) % len(DIRECTIONS)]
        text, reference = texts[source][i], texts[target][i]
        if (4 <= len(text.split()) <= 10 and len(reference.split()) <= 9
                and hf_fixtures.SAFE_TEXT.match(text)
                and hf_fixtures.SAFE_TEXT.match(reference)):  # fmt: skip
            chosen.append((text, source, target, reference))
        if len(chosen) == TEST_SENTENCES:
            break
    chosen.append((hf_fixtures.UNKNOWN_CHARACTERS, "de", "fr", None))
    chosen.append((hf_fixtures.ONE_WORD["en"], "en", "de", None))
    return chosen


def tokenizer_files(name, directory, spm_path):
    """Writes the family's tokenizer files into `directory`: its tokenizer."""
    from transformers import M2M100Tokenizer, MBart50Tokenizer, NllbTokenizer

    shutil.copy(spm_path, directory / "sentencepiece.bpe.model")
    if name == "nllb":
        codes = language_tokens(name)
        tokenizer = NllbTokenizer.from_pretrained(str(directory), extra_special_tokens=codes)
    elif name == "mbart50":
        tokenizer = MBart50Tokenizer.from_pretrained(str(directory))
    else:
        import sentencepiece

        processor = sentencepiece.SentencePieceProcessor(model_file=str(spm_path))
        pieces = [processor.id_to_piece(i) for i in range(3, processor.get_piece_size())]
        random.Random(SEED).shuffle(pieces)
        vocab = {"<s>": 0, "<pad>": 1, "</s>": 2, "<unk>": 3}
        vocab.update({piece: 4 + i for i, piece in enumerate(pieces)})
        (directory / "vocab.json").write_text(json.dumps(vocab, ensure_ascii=False, indent=0))
        tokenizer = M2M100Tokenizer(vocab_file=str(directory / "vocab.json"),
                                    spm_file=str(spm_path), language_codes="m2m100")  # fmt: skip
    tokenizer.save_pretrained(str(directory))
    return tokenizer


def language_tokens(name):
    """Every language token of the family's tokenizer."""
    if name == "m2m100":
        from transformers.models.m2m_100.tokenization_m2m_100 import FAIRSEQ_LANGUAGE_CODES

        return [f"__{code}__" for code in FAIRSEQ_LANGUAGE_CODES["m2m100"]]
    if name == "mbart50":
        from transformers.models.mbart50.tokenization_mbart50 import FAIRSEQ_LANGUAGE_CODES
    else:
        from transformers.models.nllb.tokenization_nllb import FAIRSEQ_LANGUAGE_CODES

    return list(FAIRSEQ_LANGUAGE_CODES)


def model_classes(name):
    """(config class, model class) of the fixture's family."""
    import transformers

    if name == "mbart50":
        return transformers.MBartConfig, transformers.MBartForConditionalGeneration
    return transformers.M2M100Config, transformers.M2M100ForConditionalGeneration


def encode(tokenizer, text, source, target=None, reference=None):
    tokenizer.src_lang = source
    if target is not None:
        tokenizer.tgt_lang = target
    return tokenizer(text, text_target=reference) if reference is not None else tokenizer(text)


def make_fixture(name, spec, out, log):
    from transformers import GenerationConfig

    config_class, model_class = model_classes(name)
    started = time.time()
    log(f"{name}:")
    hf_fixtures.set_seed(SEED)
    directory = out / name
    directory.mkdir(parents=True)
    codes = CODES[name]
    lines = {language: hf_fixtures.read_lines("train", language, TRAIN_LINES)
             for language in codes}  # fmt: skip
    with tempfile.TemporaryDirectory() as work:
        work = Path(work)
        every = [line for language in codes for line in lines[language]]
        hf_fixtures.train_spm(every, SPM_PIECES, work / "sentencepiece.bpe.model", "identity", work,
                              model_type=spec.get("spm_type", "bpe"))  # fmt: skip
        tokenizer = tokenizer_files(name, directory, work / "sentencepiece.bpe.model")

    if name == "m2m100":  # the dictionary, the language tokens, the "madeupword"s
        size = len(tokenizer.encoder) + len(tokenizer.lang_token_to_id) + 8
    else:
        size = max(tokenizer.get_vocab().values()) + 1
    config = config_class(
        vocab_size=size, pad_token_id=1, bos_token_id=0, eos_token_id=2,
        decoder_start_token_id=2, max_position_embeddings=MAX_POSITIONS, dropout=0.1,
        **spec["model"],
    )  # fmt: skip
    hf_fixtures.set_seed(SEED)
    model = model_class(config)
    log(f"  vocab {size}, {sum(p.numel() for p in model.parameters())} parameters")
    pairs = []
    for source, target in DIRECTIONS:
        for text, reference in zip(lines[source], lines[target]):
            encoded = encode(tokenizer, text, codes[source], codes[target], reference)
            pairs.append((encoded["input_ids"], encoded["labels"]))
    hf_fixtures.train(model, pairs, 1, TRAINING, log)
    model.generation_config = GenerationConfig(
        num_beams=4, max_length=MAX_LENGTH, decoder_start_token_id=2, bos_token_id=0,
        eos_token_id=2, pad_token_id=1, **spec.get("generation", {}),
    )  # fmt: skip
    model.save_pretrained(str(directory))
    for path in directory.iterdir():
        if path.name in ("special_tokens_map.json", "added_tokens.json"):
            path.unlink()
    result, stats = expected(directory, name, test_cases(), log)
    hf_fixtures.write_expected(directory / "expected.json", {"fixture": name, **result})
    stats.update(seconds=round(time.time() - started),
                 bytes=hf_fixtures.directory_size(directory))  # fmt: skip
    log(f"  files {sorted(p.name for p in directory.iterdir())}")
    log(f"  {stats['bytes'] / 1024:.0f} kB, {stats['seconds']} s")
    return stats


def expected(directory, name, tests, log):
    """What transformers computes with the checkpoint reloaded from `directory` (see the
    module's docstring, step 6)."""
    import numpy as np
    import torch
    import transformers
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(str(directory))
    model = model_classes(name)[1].from_pretrained(str(directory), dtype=torch.float32).eval()
    codes = CODES[name]
    start = model.config.decoder_start_token_id
    result = {
        "sentences": [text for text, _, _, _ in tests],
        "source_languages": [codes[source] for _, source, _, _ in tests],
        "target_languages": [codes[target] for _, _, target, _ in tests],
    }
    # The tokenizer's own {token: id}, its language tokens included: the tests read ids through it.
    languages = {token: tokenizer.convert_tokens_to_ids(token) for token in language_tokens(name)}
    result["vocabulary"] = {**tokenizer.get_vocab(), **languages}
    result["source_ids"] = [encode(tokenizer, text, codes[source])["input_ids"]
                            for text, source, _, _ in tests]  # fmt: skip
    with_reference = [i for i, case in enumerate(tests) if case[3]][:TARGET_TEXTS]
    result["target_sentence_indices"] = with_reference
    result["target_ids"] = [
        encode(tokenizer, tests[i][0], codes[tests[i][1]], codes[tests[i][2]],
               tests[i][3])["labels"]
        for i in with_reference
    ]  # fmt: skip
    forced = []
    with torch.no_grad():
        for i, labels in zip(with_reference[:FORCED], result["target_ids"]):
            decoder_input_ids = [start, *labels[:-1]]
            inputs = {"input_ids": torch.tensor([result["source_ids"][i]]),
                      "decoder_input_ids": torch.tensor([decoder_input_ids])}  # fmt: skip
            logits = model(**inputs).logits[0]
            forced.append({
                "sentence_index": i,
                "decoder_input_ids": decoder_input_ids,
                "logits": hf_fixtures.float32_lists(logits.numpy().astype(np.float32)),
            })  # fmt: skip
    result["forced"] = forced

    def generate(i, **kwargs):
        code = result["target_languages"][i]
        language = tokenizer.convert_tokens_to_ids(f"__{code}__" if name == "m2m100" else code)
        with torch.no_grad():
            return model.generate(input_ids=torch.tensor([result["source_ids"][i]]),
                                  forced_bos_token_id=language, **kwargs)  # fmt: skip

    greedy, beam, scores = [], [], []
    for i in range(len(tests)):
        greedy.append(hf_fixtures.strip_generated(generate(i, num_beams=1)[0].tolist(), start, 1))
        out = generate(i, return_dict_in_generate=True, output_scores=True)
        beam.append(hf_fixtures.strip_generated(out.sequences[0].tolist(), start, 1))
        scores.append(float(out.sequences_scores[0]))
    # The texts less the language token (transformers 5's M2M100Tokenizer spells `__en__`
    # as "en" even with skip_special_tokens).
    result["greedy_ids"] = greedy
    result["greedy_texts"] = [tokenizer.decode(ids[1:], skip_special_tokens=True)
                              for ids in greedy]  # fmt: skip
    result["beam_ids"] = beam
    result["beam_texts"] = [tokenizer.decode(ids[1:], skip_special_tokens=True) for ids in beam]
    result["beam_scores"] = scores
    result["generation"] = {
        key: value for key, value in sorted(model.generation_config.to_dict().items())
        if value is not None and key not in ("transformers_version", "_from_model_config")
    }  # fmt: skip
    result["transformers_version"] = transformers.__version__
    result["torch_version"] = torch.__version__

    def finished(ids):
        return bool(ids) and ids[-1] == model.config.eos_token_id and len(ids) + 1 < MAX_LENGTH

    stats = {"greedy_finished": sum(map(finished, greedy)),
             "beam_finished": sum(map(finished, beam)),
             "beam_differs": sum(g != b for g, b in zip(greedy, beam)),
             "sentences": len(tests)}  # fmt: skip
    log(
        f"  greedy finished {stats['greedy_finished']}/{len(tests)}, beam finished "
        f"{stats['beam_finished']}/{len(tests)}, beam != greedy {stats['beam_differs']}"
    )
    for text, output in list(zip(result["sentences"], result["beam_texts"]))[:4]:
        log(f"    {text!r} -> {output!r}")
    return result, stats


def capped_beams(directory, name):
    """Writes `directory`/CAPPED_FILE: `generate()`'s beam ids (less the decoder start) and
    `sequences_scores` for every sentence of expected.json, each alone, with max_length
    CAPPED_MAX_LENGTH: beams that reach it are finished there and rank with those that
    ended by their scores, which the importer's search must do alike."""
    import torch
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(str(directory))
    model = model_classes(name)[1].from_pretrained(str(directory), dtype=torch.float32).eval()
    case = json.loads((directory / "expected.json").read_text())
    ids, scores = [], []
    for source, code in zip(case["source_ids"], case["target_languages"]):
        language = tokenizer.convert_tokens_to_ids(f"__{code}__" if name == "m2m100" else code)
        with torch.no_grad():
            out = model.generate(input_ids=torch.tensor([source]), forced_bos_token_id=language,
                                 max_length=CAPPED_MAX_LENGTH, return_dict_in_generate=True,
                                 output_scores=True)  # fmt: skip
        ids.append(hf_fixtures.strip_generated(out.sequences[0].tolist(),
                                               model.config.decoder_start_token_id, 1))  # fmt: skip
        scores.append(float(out.sequences_scores[0]))
    capped = {"max_length": CAPPED_MAX_LENGTH, "beam_ids": ids, "beam_scores": scores}
    (directory / CAPPED_FILE).write_text(json.dumps(capped, indent=1) + "\n")
    return sum(model.config.eos_token_id not in row for row in ids)


def main():
    parser = hf_fixtures.fixture_arguments(
        __doc__.split("\n\n")[0], PROJECT_ROOT / "tests/fixtures/hf_m2m", FIXTURES
    )
    parser.add_argument("--capped-only", action="store_true",
                        help=f"only (re)write {CAPPED_FILE}")  # fmt: skip
    args = parser.parse_args()
    if args.capped_only:
        if args.venv is not None:
            hf_fixtures.ensure_venv(args.venv, Path(__file__))
        for name in args.fixtures:
            cut = capped_beams(args.out.resolve() / name, name)
            print(f"{name}: {cut} beams cut at max_length {CAPPED_MAX_LENGTH}")
        return
    out, log = hf_fixtures.start(args, Path(__file__))
    for name in args.fixtures:
        make_fixture(name, FIXTURES[name], out, log)
        cut = capped_beams(out / name, name)
        log(f"  {CAPPED_FILE}: {cut} beams cut at max_length {CAPPED_MAX_LENGTH}")
    log(f"total {hf_fixtures.directory_size(out) / 1024:.0f} kB")


if __name__ == "__main__":
    sys.exit(main())
