"""Imported checkpoints against transformers and CTranslate2: translation speed at OPUS-MT's
base shape and NLLB-200-distilled-600M's with the import's time and memory, fine-tuning an
import, and the import and export of NLLB's shape.

    python bench/pretrained.py speed [--model opus-mt-base|nllb-600m] [--root runs/pretrained]
        [--rounds 3] [--threads 1,2]
    python bench/pretrained.py fine-tune [--root runs/pretrained] [--pretrain-steps 800]
        [--minutes 10]
    python bench/pretrained.py fine-tune-m2m [--root runs/pretrained] [--minutes 10]
    python bench/pretrained.py size [--shape nllb-600m|nllb-1.3b|nllb-3.3b] [--import-only]
        [--root runs/pretrained]

The checkpoints are made by transformers in the venv of `tools/hf_fixtures.py` (`--hf-venv`,
made when missing); torch never enters the project's environment.

speed: a random checkpoint of `--model`'s shape: opus-mt-base, a `MarianMTModel` of OPUS-MT's
base shape (6 + 6 layers, d_model 512, 8 heads, FFN 2048, swish, one tied 58,101-row
vocabulary: the pieces of SentencePiece models trained on Multi30k, then unused filler tokens),
or nllb-600m, size's NLLB checkpoint below (from deu_Latn into fra_Latn: each engine is given
the source language's token and forces the target language's first). `python -m
pipeline.import_model` imports it (its wall time and peak resident memory, against the
checkpoint's size and the same import of a tiny checkpoint); `python -m export` writes the
SavedModel (float32, and bfloat16: `--saved-model-precision bfloat16`) and ONNX float32 and
int8 (once: later runs reuse them); `ct2-transformers-converter`
converts the checkpoint for CTranslate2. Each engine then runs in a process of its own, loaded
once, and the rounds take the engines in turn (the order rotating each round): beam 4, sources
of 20 tokens (19 pieces and </s>, after the language's token), exactly 30 target tokens (min =
max length: with random weights, every engine does the same steps; the forced language token
is one more), batch 1 and 32 (nllb-600m: 16), for each of `--threads` in turn (an engine's
fastest thread count differs between engines and machines: CTranslate2 int8 can be slower on
two threads than on one). Prints each engine's best time per batch over the rounds and thread
counts, the thread count that gave it, and its speed against transformers and against
CTranslate2 int8.

fine-tune: a small Marian model (3 + 3 layers, d_model 256, swish, SentencePiece models of
6,000 pieces) trained by transformers for `--pretrain-steps` steps on the first 10,000 pairs
of Multi30k de-en's training split stands for a pretrained checkpoint. It is imported and
scored on test_2016_flickr (`pipeline.evaluate`, the checkpoint's own search), fine-tuned for
`--minutes` on the whole training split (`pipeline.train --init-from`), scored again; the
import's ONNX export is scored with float32 and int8 weights.

fine-tune-m2m: the NLLB test fixture (`tests/fixtures/hf_m2m/nllb`: 2 + 2 layers, d_model 32,
trained briefly by transformers on Multi30k de-en, en-fr and fr-de) is imported and scored on
test_2016_flickr in those three directions, fine-tuned for `--minutes` on Multi30k de-en
(deu_Latn into eng_Latn, `pipeline.train --init-from`), and scored again in each direction.
No transformers needed.

size: a random checkpoint of NLLB-200-distilled-600M's shape (12 + 12 layers, d_model 1024, 16
heads, FFN 4096, 256,206 embedding rows; an NLLB tokenizer over a SentencePiece model trained
on Multi30k, the rows past it unused), or with `--shape nllb-1.3b` NLLB-200-distilled-1.3B's
(24 + 24 layers, FFN 8192) or `--shape nllb-3.3b` NLLB-200-3.3B's (24 + 24 layers, d_model
2048, FFN 8192), is imported (time, peak memory against the weights) and, unless
`--import-only`, exported as a SavedModel and to ONNX, float32 and int8 (time, peak memory, the
files written); each export then translates a sentence in a process of its own (ONNX Runtime,
the SavedModel through TF Serving's session loader, the REST server on the float32 and the int8
ONNX model).
"""

import argparse
import json
import os
import random
import shutil
import subprocess
import sys
import time
from pathlib import Path

# The checkpoints are made as the tests' fixtures are (tools/hf_fixtures.py).
sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tools"))
import hf_fixtures  # noqa: E402

PROJECT_ROOT = Path(__file__).resolve().parent.parent
MULTI30K = hf_fixtures.MULTI30K
SEED = 1234

BASE_SHAPE = dict(
    d_model=512, encoder_layers=6, decoder_layers=6, encoder_attention_heads=8,
    decoder_attention_heads=8, encoder_ffn_dim=2048, decoder_ffn_dim=2048,
    activation_function="swish", share_encoder_decoder_embeddings=True, tie_word_embeddings=True,
    max_position_embeddings=512,
)  # fmt: skip
BASE_VOCABULARY = 58_101  # opus-mt-de-en's
BASE_PIECES = 6000  # each side's SentencePiece model; the rest of the vocabulary is filler
SOURCE_PIECES = 19  # and </s>: 20 source tokens
TARGET_TOKENS = 30
BEAM_SIZE = 4
# An import's memory whatever the checkpoint, measured on the smallest test fixture.
FIXED_COST_CHECKPOINT = PROJECT_ROOT / "tests" / "fixtures" / "hf_marian" / "shared_tied_swish"
REPEATS = {1: 3, 16: 1, 32: 1}  # timings a batch size takes in each engine's turn

SMALL_SHAPE = dict(
    d_model=256, encoder_layers=3, decoder_layers=3, encoder_attention_heads=4,
    decoder_attention_heads=4, encoder_ffn_dim=1024, decoder_ffn_dim=1024,
    activation_function="swish", share_encoder_decoder_embeddings=True, tie_word_embeddings=True,
    max_position_embeddings=256,
)  # fmt: skip
SMALL_PIECES = 6000
PRETRAIN_LINES = 10_000
PRETRAINING = dict(batch=64, lr=1e-3, warmup=200, max_tokens=80, threads=2)
TEST_SPLIT = "test_2016_flickr"


def log(message):
    print(message, flush=True)


def run(command, **kwargs):
    """Runs `command`, its output shown; a failure ends the benchmark with its command."""
    result = subprocess.run([str(c) for c in command], cwd=PROJECT_ROOT, **kwargs)
    if result.returncode != 0:
        sys.exit(f"failed ({result.returncode}): {' '.join(map(str, command))}")
    return result


# --- checkpoints (in the transformers venv) ------------------------------------------------


def write_checkpoint(directory, shape, pieces, vocabulary_size, train_steps):
    """A Marian checkpoint of `shape` in the Hugging Face layout: SentencePiece models of
    `pieces` trained on Multi30k's de / en training split, one shared vocab.json filled to
    `vocabulary_size` with tokens no piece produces, trained for `train_steps` steps on its
    first PRETRAIN_LINES pairs (0: random weights)."""
    import tempfile

    import torch
    from transformers import GenerationConfig, MarianConfig, MarianMTModel, MarianTokenizer

    hf_fixtures.set_seed(SEED)
    directory.mkdir(parents=True)
    sources, targets = (hf_fixtures.read_lines("train", side) for side in ("de", "en"))
    with tempfile.TemporaryDirectory() as work:
        work = Path(work)
        spms = [
            hf_fixtures.train_spm(lines, pieces, directory / name, "identity", work)
            for lines, name in ((sources, "source.spm"), (targets, "target.spm"))
        ]
    both = [*hf_fixtures.ordinary_pieces(spms[0]), *hf_fixtures.ordinary_pieces(spms[1])]
    vocab = hf_fixtures.marian_vocab(both)
    filler = max(0, vocabulary_size - len(vocab))
    vocab = hf_fixtures.marian_vocab([*both, *(f"<filler{i}>" for i in range(filler))])
    (directory / "vocab.json").write_text(json.dumps(vocab, ensure_ascii=False, indent=0))
    tokenizer = MarianTokenizer(
        source_spm=str(directory / "source.spm"), target_spm=str(directory / "target.spm"),
        vocab=str(directory / "vocab.json"), source_lang="de", target_lang="en",
    )  # fmt: skip
    pad = len(vocab) - 1
    config = MarianConfig(
        vocab_size=len(vocab), decoder_vocab_size=len(vocab), scale_embedding=True,
        pad_token_id=pad, eos_token_id=0, decoder_start_token_id=pad, forced_eos_token_id=0,
        dropout=0.1, **shape,
    )  # fmt: skip
    model = MarianMTModel(config)
    log(f"{directory.name}: vocabulary {len(vocab)} ({filler} filler), "
        f"{sum(p.numel() for p in model.parameters()) / 1e6:.1f}M parameters")  # fmt: skip
    if train_steps:
        torch.set_num_threads(PRETRAINING["threads"])
        pairs = list(zip(sources, targets))[:PRETRAIN_LINES]
        hf_fixtures.train(model, hf_fixtures.encoded_pairs(tokenizer, pairs), pad,
                          {**PRETRAINING, "steps": train_steps}, log)  # fmt: skip
    model.generation_config = GenerationConfig(
        num_beams=BEAM_SIZE, max_length=128, bad_words_ids=[[pad]], forced_eos_token_id=0,
        decoder_start_token_id=pad, eos_token_id=0, pad_token_id=pad, renormalize_logits=True,
    )  # fmt: skip
    tokenizer.save_pretrained(str(directory))
    model.save_pretrained(str(directory))


def hf_python(args):
    return hf_fixtures.make_venv(args.hf_venv)


def checkpoint(args, directory, shape, pieces, vocabulary_size, train_steps):
    """`directory`, made by `write_checkpoint` in the transformers venv unless it exists."""
    if not (directory / "model.safetensors").exists():
        shutil.rmtree(directory, ignore_errors=True)
        run([hf_python(args), __file__, "_checkpoint", directory, json.dumps(shape), pieces,
             vocabulary_size, train_steps])  # fmt: skip
    return directory


# --- import, export ------------------------------------------------------------------------

PEAK_MEMORY = (
    "import resource, subprocess, sys, time\n"
    "start = time.perf_counter()\n"
    "code = subprocess.run(sys.argv[1:]).returncode\n"
    "print(time.perf_counter() - start, resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss,"
    " code)\n"
)


def measured(command):
    """(seconds, peak resident MB) of `command`, alone in a process of its own."""
    output = run([sys.executable, "-c", PEAK_MEMORY, *command], capture_output=True, text=True)
    seconds, kilobytes, code = output.stdout.split()[-3:]
    if code != "0":
        sys.exit(f"failed ({code}): {' '.join(map(str, command))}")
    return float(seconds), int(kilobytes) / 1024


def import_measured(source, workdir):
    """Imports `source` into `workdir` (anew): its seconds and peak memory, with the peak of the
    same import of a tiny checkpoint (`FIXED_COST_CHECKPOINT`): what the process costs
    whatever the checkpoint (TensorFlow, Keras, the importer's code)."""
    shutil.rmtree(workdir, ignore_errors=True)
    tiny_workdir = workdir.with_name(workdir.name + "-tiny")
    shutil.rmtree(tiny_workdir, ignore_errors=True)
    _, fixed = measured([sys.executable, "-m", "pipeline.import_model", FIXED_COST_CHECKPOINT,
                         "--workdir", tiny_workdir])  # fmt: skip
    seconds, peak = measured([sys.executable, "-m", "pipeline.import_model", source,
                              "--workdir", workdir])  # fmt: skip
    size = sum(p.stat().st_size for p in source.iterdir()) / 2**20
    weights = (source / "model.safetensors").stat().st_size / 2**20
    log(f"import: {seconds:.1f} s, peak memory {peak:.0f} MB ({fixed:.0f} MB importing a tiny "
        f"checkpoint); checkpoint {size:.0f} MB ({weights:.0f} MB of weights): peak "
        f"{peak / weights:.2f}x the weights, {(peak - fixed) / weights:.2f}x above the "
        f"tiny checkpoint's")  # fmt: skip
    return {"seconds": seconds, "peak_mb": peak, "fixed_mb": fixed, "weights_mb": weights}


def set_section(workdir, section, **values):
    """Changes the work directory's settings of `section` (config.yaml)."""
    import yaml

    path = workdir / "config.yaml"
    config = yaml.safe_load(path.read_text())
    config[section].update(values)
    path.write_text(yaml.safe_dump(config, sort_keys=False, allow_unicode=True))


def set_decode(workdir, **values):
    """Changes the work directory's `decode` settings (config.yaml)."""
    set_section(workdir, "decode", **values)


def export(workdir, formats="saved_model,onnx"):
    if not (workdir / "export" / "onnx" / "model.int8.onnx").exists():
        run([sys.executable, "-m", "export", "--workdir", workdir, "--formats", formats])
    return workdir / "export"


def latest_saved_model(exported):
    return max((exported / "saved_model" / "translator").iterdir(), key=lambda p: int(p.name))


def bfloat16_saved_model(workdir):
    """WORKDIR/export-bfloat16's SavedModel (`--saved-model-precision bfloat16`), made once."""
    output = workdir / "export-bfloat16"
    if not (output / "saved_model").exists():
        run([sys.executable, "-m", "export", "--workdir", workdir, "--formats", "saved_model",
             "--saved-model-precision", "bfloat16", "--output", output])  # fmt: skip
    return latest_saved_model(output)


# --- the engines, each in a process of its own ---------------------------------------------


def transformers_engine(model_path, source, threads):
    import torch
    from transformers import AutoModelForSeq2SeqLM, AutoTokenizer

    torch.set_num_threads(threads)
    model = AutoModelForSeq2SeqLM.from_pretrained(str(model_path)).eval()
    tokenizer = AutoTokenizer.from_pretrained(str(model_path))
    languages = source["languages"]
    tokens, forced = [*source["pieces"], tokenizer.eos_token], {}
    if languages:
        tokens = [languages["source"], *tokens]
        forced["forced_bos_token_id"] = tokenizer.convert_tokens_to_ids(languages["target"])
    ids = torch.tensor([tokenizer.convert_tokens_to_ids(tokens)])
    steps = TARGET_TOKENS + bool(languages)  # the forced language token takes a step

    def translate(batch):
        with torch.inference_mode():
            out = model.generate(input_ids=ids.repeat(batch, 1), num_beams=BEAM_SIZE,
                                 min_new_tokens=steps, max_new_tokens=steps, do_sample=False,
                                 **forced)  # fmt: skip
        return out.shape[1] - 1 - bool(languages)  # the decoder's start and language tokens aside

    return translate


def ctranslate2_engine(compute_type):
    def load(model_path, source, threads):
        import ctranslate2

        translator = ctranslate2.Translator(
            str(model_path), device="cpu", compute_type=compute_type, intra_threads=threads
        )
        languages = source["languages"]
        tokens, prefix = [*source["pieces"], "</s>"], None
        if languages:
            tokens, prefix = [languages["source"], *tokens], [languages["target"]]
        steps = TARGET_TOKENS + bool(languages)  # its decoding length counts the prefix

        def translate(batch):
            results = translator.translate_batch(
                [tokens] * batch, target_prefix=prefix and [prefix] * batch,
                beam_size=BEAM_SIZE, max_input_length=0, min_decoding_length=steps,
                max_decoding_length=steps,
            )  # fmt: skip
            return len(results[0].hypotheses[0]) - bool(languages)

        return translate

    return load


def source_and_prefix(source):
    """The source ids of our export, [1, length], and its target prefix ([1, 1]: the target
    language's token) or None."""
    import numpy as np

    languages = source["languages"]
    if not languages:
        return np.array([source["ids"]], np.int32), None
    ids = [languages["source_id"], *source["ids"]]
    return np.array([ids], np.int32), np.array([[languages["target_id"]]], np.int32)


def onnx_engine(int8):
    def load(model_path, source, threads):
        import numpy as np

        from export.runtime import OnnxTranslator

        translator = OnnxTranslator(model_path, intra_op_threads=threads, int8=int8)
        ids, prefix = source_and_prefix(source)
        steps = TARGET_TOKENS + (prefix is not None)  # max_length counts the forced token

        def translate(batch):
            out = translator.search(np.repeat(ids, batch, 0), beam_size=BEAM_SIZE,
                                    max_length=steps,
                                    target_prefix=None if prefix is None else np.repeat(
                                        prefix, batch, 0))  # fmt: skip
            return int(out["lengths"][0, 0])

        return translate

    return load


def saved_model_engine(model_path, source, threads):
    """The SavedModel through the session loader TF Serving uses."""
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")
    import numpy as np
    import tensorflow as tf
    import tensorflow_text  # noqa: F401  (the SavedModel's tokenizer ops)

    from export.signature import BEAM_SEARCH, SOURCE_IDS, TARGET_PREFIX

    tf.config.threading.set_intra_op_parallelism_threads(threads)
    tf.config.threading.set_inter_op_parallelism_threads(1)
    session = tf.compat.v1.Session(graph=tf.Graph())
    with session.graph.as_default():
        meta = tf.compat.v1.saved_model.loader.load(session, ["serve"], str(model_path))
    signature = meta.signature_def[BEAM_SEARCH]
    inputs = {name: info.name for name, info in signature.inputs.items()}
    lengths = signature.outputs["lengths"].name
    ids, prefix = source_and_prefix(source)
    steps = TARGET_TOKENS + (prefix is not None)  # max_length counts the forced token

    def translate(batch):
        feeds = {inputs[SOURCE_IDS]: np.repeat(ids, batch, 0), inputs["beam_size"]: BEAM_SIZE,
                 inputs["max_length"]: steps}  # fmt: skip
        if prefix is not None:
            feeds[inputs[TARGET_PREFIX]] = np.repeat(prefix, batch, 0)
        return int(session.run(lengths, feeds)[0, 0])

    return translate


ENGINES = {  # name: (loader, runs in the transformers venv)
    "transformers": (transformers_engine, True),
    "CTranslate2 float32": (ctranslate2_engine("float32"), False),
    "CTranslate2 int8": (ctranslate2_engine("int8"), False),
    "ONNX float32": (onnx_engine(False), False),
    "ONNX int8": (onnx_engine(True), False),
    "SavedModel": (saved_model_engine, False),
    "SavedModel bfloat16": (saved_model_engine, False),
}


def worker(engine, model_path, source, threads):
    """Serves timings on stdin/stdout: "BATCH REPEATS" -> {"seconds": [...], "tokens": N}.
    `source`: {"pieces": the source's pieces, "ids": their ids in the import}."""
    translate = ENGINES[engine][0](model_path, source, threads)
    print("ready", flush=True)
    for line in sys.stdin:
        batch, repeats = map(int, line.split())
        seconds = []
        for _ in range(repeats):
            start = time.perf_counter()
            tokens = translate(batch)
            seconds.append(time.perf_counter() - start)
        print(json.dumps({"seconds": seconds, "tokens": tokens}), flush=True)


class Engine:
    """One engine's worker process, on `threads` threads."""

    def __init__(self, name, python, model_path, source, threads):
        self.name = name
        self.threads = threads
        self.process = subprocess.Popen(
            [str(python), __file__, "_worker", name, str(model_path), json.dumps(source),
             str(threads)],
            cwd=PROJECT_ROOT, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True,
        )  # fmt: skip
        while (line := self.process.stdout.readline()) and line.strip() != "ready":
            pass
        if not line:
            sys.exit(f"{name}: the worker ended before it was ready")

    def time(self, batch, repeats):
        self.process.stdin.write(f"{batch} {repeats}\n")
        self.process.stdin.flush()
        reply = self.process.stdout.readline()
        if not reply:
            sys.exit(f"{self.name}: the worker ended")
        return json.loads(reply)

    def close(self):
        self.process.stdin.close()
        self.process.wait()


def source_tokens(source_spm, onnx_export, languages=None):
    """{"pieces": `SOURCE_PIECES` ordinary pieces of the checkpoint's source model, drawn with
    the seed, "ids": their ids in the import, "languages": None, or for a many-to-many model
    the (source, target) codes of `languages` with the ids of their tokens in the import}."""
    import sentencepiece

    checkpoint_model = sentencepiece.SentencePieceProcessor(model_file=str(source_spm))
    pieces = random.Random(SEED).sample(hf_fixtures.ordinary_pieces(checkpoint_model),
                                        SOURCE_PIECES)  # fmt: skip
    metadata = json.loads((onnx_export / "model.json").read_text())
    ours = sentencepiece.SentencePieceProcessor(
        model_file=str(onnx_export / metadata["source_vocabulary"])
    )
    tokens = {"pieces": pieces, "ids": [ours.piece_to_id(p) for p in pieces], "languages": None}
    if languages:
        source, target = languages
        tags = metadata["languages"]
        tokens["languages"] = {
            "source": source, "target": target,
            "source_id": ours.piece_to_id(tags["source_tags"][source]),
            "target_id": ours.piece_to_id(tags["target_tokens"][target]),
        }  # fmt: skip
    return tokens


def ctranslate2_converted(args, checkpoint_path, directory):
    if not (directory / "model.bin").exists():
        run([hf_python(args).parent / "ct2-transformers-converter", "--model", checkpoint_path,
             "--output_dir", directory, "--force"])  # fmt: skip
    return directory


def speed_setup(args, checkpoint_path, name, source_spm, languages=None):
    """Imports (measured) and exports `checkpoint_path` for the speed runs, converts it for
    CTranslate2: {"paths": each engine's model, "source": the timed source, "imported"}."""
    root = args.root.resolve()
    imported_to = root / f"{name}-import"
    imported = import_measured(checkpoint_path, imported_to)
    workdir = root / f"{name}-speed-import"  # exported once, reused by later runs
    if not (workdir / "export" / "onnx" / "model.int8.onnx").exists():
        shutil.rmtree(workdir, ignore_errors=True)
        shutil.copytree(imported_to, workdir)
        set_decode(workdir, beam_size=BEAM_SIZE, min_length=TARGET_TOKENS)
    exported = export(workdir)
    ct2 = ctranslate2_converted(args, checkpoint_path, root / f"{name}-ctranslate2")
    paths = {"transformers": checkpoint_path, "CTranslate2 float32": ct2, "CTranslate2 int8": ct2,
             "ONNX float32": exported / "onnx", "ONNX int8": exported / "onnx",
             "SavedModel": latest_saved_model(exported),
             "SavedModel bfloat16": bfloat16_saved_model(workdir)}  # fmt: skip
    source = source_tokens(source_spm, exported / "onnx", languages)
    return {"paths": paths, "source": source, "imported": imported}


def marian_speed_setup(args):
    source = checkpoint(args, args.root.resolve() / "base-checkpoint", BASE_SHAPE, BASE_PIECES,
                        BASE_VOCABULARY, 0)  # fmt: skip
    return speed_setup(args, source, "base", source / "source.spm")


def nllb_speed_setup(args):
    source = nllb_checkpoint(args)
    return speed_setup(args, source, "nllb-600m", source / "sentencepiece.bpe.model",
                       NLLB_DIRECTION)  # fmt: skip


SPEED_MODELS = {  # --model: (set-up, batch sizes)
    "opus-mt-base": (marian_speed_setup, (1, 32)),
    "nllb-600m": (nllb_speed_setup, (1, 16)),
}


def speed(args):
    set_up, batches = SPEED_MODELS[args.model]
    setup = set_up(args)
    best = {}  # (engine, threads, batch): seconds
    for threads in args.threads:  # one thread count's engines at a time: a large model's memory
        engines = [
            Engine(name, hf_python(args) if in_hf else sys.executable, setup["paths"][name],
                   setup["source"], threads)
            for name, (_, in_hf) in ENGINES.items()
        ]  # fmt: skip
        for engine in engines:  # warm-up, and every engine decodes the same number of steps
            for batch in batches:
                tokens = engine.time(batch, 1)["tokens"]
                if tokens != TARGET_TOKENS:
                    sys.exit(f"{engine.name}: {tokens} target tokens, not {TARGET_TOKENS}")
        for round_index in range(args.rounds):
            order = engines[round_index % len(engines) :] + engines[: round_index % len(engines)]
            for batch in batches:
                for engine in order:
                    seconds = min(engine.time(batch, REPEATS[batch])["seconds"])
                    key = engine.name, threads, batch
                    best[key] = min(best.get(key, float("inf")), seconds)
            log(f"{threads} threads: round {round_index + 1} of {args.rounds} done")
        for engine in engines:
            engine.close()
    report_speed(best, setup["imported"], batches, args)


def report_speed(best, imported, batches, args):
    import platform

    log(f"\n{args.model}; {platform.processor() or platform.machine()}, {os.cpu_count()} cores; "
        f"beam {BEAM_SIZE}, {SOURCE_PIECES + 1} source tokens, {TARGET_TOKENS} target tokens, "
        f"best of {args.rounds} rounds and of {'/'.join(map(str, args.threads))} "
        "threads")  # fmt: skip
    for batch in batches:
        fastest = {}  # engine: (seconds, threads)
        for (name, threads, batch_size), seconds in best.items():
            if batch_size == batch and seconds < fastest.get(name, (float("inf"),))[0]:
                fastest[name] = seconds, threads
        log(
            f"\nbatch {batch:<3}            ms/batch  threads  vs transformers  vs CTranslate2 int8"
        )
        for name, (seconds, threads) in fastest.items():
            log(f"  {name:20} {seconds * 1000:9.0f} {threads:8} "
                f"{fastest['transformers'][0] / seconds:15.2f}x "
                f"{fastest['CTranslate2 int8'][0] / seconds:18.2f}x")  # fmt: skip
    peak, fixed, weights = (imported[k] for k in ("peak_mb", "fixed_mb", "weights_mb"))
    log(f"\nimport: {imported['seconds']:.1f} s, peak {peak:.0f} MB = {peak / weights:.2f}x the "
        f"weights' {weights:.0f} MB; {(peak - fixed) / weights:.2f}x above a tiny "
        f"checkpoint's import ({fixed:.0f} MB)")  # fmt: skip


# --- fine-tuning ---------------------------------------------------------------------------


def test_file(root, source="de", target="en"):
    """test_2016_flickr as `pipeline.evaluate --split FILE` takes it: source<TAB>reference."""
    path = root / f"{TEST_SPLIT}.{source}-{target}.tsv"
    if not path.exists():
        pairs = zip(
            hf_fixtures.read_lines(TEST_SPLIT, source), hf_fixtures.read_lines(TEST_SPLIT, target)
        )
        path.write_text("".join(f"{s}\t{t}\n" for s, t in pairs), encoding="utf-8")
    return path


def bleu(workdir, test, languages=None):
    """`pipeline.evaluate`'s BLEU of `workdir`'s model on `test`; `languages`: its (source,
    target) codes, for a many-to-many import."""
    flags = ["--source-language", languages[0], "--target-language", languages[1]] if (
        languages) else []  # fmt: skip
    run([sys.executable, "-m", "pipeline.evaluate", "--workdir", workdir, "--split", test,
         *flags], stdout=subprocess.DEVNULL)  # fmt: skip
    report = max(workdir.glob("eval_*.json"), key=lambda p: p.stat().st_mtime)
    return json.loads(report.read_text())["bleu"]


def fine_tuning_config(path, minutes, languages=None):
    """The user's config for the fine-tuning on Multi30k de-en: data and schedule only (and a
    many-to-many import's `languages`, its codes for de and en); the model, vocabularies and
    search come from the import."""
    files = {
        f"{split}_{side}": next(p for p in (MULTI30K / f"{name}.{language}",
                                            MULTI30K / f"{name}.{language}.gz") if p.exists())
        for split, name in (("train", "train"), ("valid", "val"))
        for side, language in (("source", "de"), ("target", "en"))
    }  # fmt: skip
    text = "data:\n" + "".join(f"  {key}: {path.resolve()}\n" for key, path in files.items())
    if languages:
        text += f"  source_language: {languages[0]}\n  target_language: {languages[1]}\n"
    text += f"""\
train:
  epochs: 100
  time_budget_hours: {minutes / 60:.4f}
  batch_tokens: 4096
  learning_rate: 0.0003
  warmup_steps: 200
  label_smoothing: 0.1
  checkpoint_every_steps: 500
"""
    path.write_text(text)
    return path


def onnx_bleu(exported, test, int8):
    from export.runtime import OnnxTranslator
    from pipeline.decoding.evaluation import score_translations

    lines = [line.rstrip("\n").split("\t") for line in test.open(encoding="utf-8")]
    translator = OnnxTranslator(exported / "onnx", int8=int8)
    hypotheses = translator.translate([s for s, _ in lines])
    return score_translations(hypotheses, [t for _, t in lines])["bleu"]


def fine_tune(args):
    root = args.root.resolve()
    root.mkdir(parents=True, exist_ok=True)
    source = checkpoint(args, root / "small-checkpoint", SMALL_SHAPE, SMALL_PIECES, 0,
                        args.pretrain_steps)  # fmt: skip
    test = test_file(root)
    imported = root / "small-import"
    shutil.rmtree(imported, ignore_errors=True)
    run([sys.executable, "-m", "pipeline.import_model", source, "--workdir", imported])
    before = bleu(imported, test)
    log(f"import: test BLEU {before}")
    exported = export(imported, "onnx")
    float32, int8 = (onnx_bleu(exported, test, int8) for int8 in (False, True))
    log(f"import through ONNX Runtime: BLEU {float32} float32, {int8} int8")
    tuned = root / "small-fine-tuned"
    shutil.rmtree(tuned, ignore_errors=True)
    config = fine_tuning_config(root / "fine-tune.yaml", args.minutes)
    run([sys.executable, "-m", "pipeline.train", "--config", config, "--workdir", tuned,
         "--init-from", imported])  # fmt: skip
    after = bleu(tuned, test)
    log(f"\ntest_2016_flickr BLEU: import {before}, fine-tuned {after} ({after - before:+.2f}); "
        f"the import through ONNX Runtime: {float32} float32, {int8} int8")  # fmt: skip


M2M_FIXTURE = PROJECT_ROOT / "tests" / "fixtures" / "hf_m2m" / "nllb"
M2M_CODES = {"de": "deu_Latn", "en": "eng_Latn", "fr": "fra_Latn"}
M2M_TUNED = ("de", "en")  # the direction fine-tuned; the fixture's others are scored too
M2M_SCORED = (("de", "en"), ("en", "fr"), ("fr", "de"))


def fine_tune_m2m(args):
    root = args.root.resolve()
    root.mkdir(parents=True, exist_ok=True)
    imported, tuned = root / "nllb-fixture-import", root / "nllb-fixture-fine-tuned"
    for path in (imported, tuned):
        shutil.rmtree(path, ignore_errors=True)
    run([sys.executable, "-m", "pipeline.import_model", M2M_FIXTURE, "--workdir", imported])
    tests = {pair: test_file(root, *pair) for pair in M2M_SCORED}
    codes = {pair: tuple(M2M_CODES[language] for language in pair) for pair in M2M_SCORED}
    before = {pair: bleu(imported, tests[pair], codes[pair]) for pair in M2M_SCORED}
    config = fine_tuning_config(root / "fine-tune-m2m.yaml", args.minutes, codes[M2M_TUNED])
    run([sys.executable, "-m", "pipeline.train", "--config", config, "--workdir", tuned,
         "--init-from", imported])  # fmt: skip
    after = {pair: bleu(tuned, tests[pair], codes[pair]) for pair in M2M_SCORED}
    log(f"\n{TEST_SPLIT} BLEU, the NLLB fixture imported -> fine-tuned on "
        f"{'-'.join(M2M_TUNED)}:")  # fmt: skip
    for pair in M2M_SCORED:
        log(f"  {'-'.join(pair)}: {before[pair]} -> {after[pair]} "
            f"({after[pair] - before[pair]:+.2f})")  # fmt: skip


# --- size: NLLB-200-distilled-600M's shape -------------------------------------------------

NLLB_600M = dict(
    d_model=1024, encoder_layers=12, decoder_layers=12, encoder_attention_heads=16,
    decoder_attention_heads=16, encoder_ffn_dim=4096, decoder_ffn_dim=4096, vocab_size=256_206,
    max_position_embeddings=1024, scale_embedding=True, activation_function="relu",
)  # fmt: skip
# --shape: the config.json of size's checkpoint.
NLLB_SHAPES = {
    "nllb-600m": NLLB_600M,
    "nllb-1.3b": {**NLLB_600M, "encoder_layers": 24, "decoder_layers": 24,
                  "encoder_ffn_dim": 8192, "decoder_ffn_dim": 8192},
    "nllb-3.3b": {**NLLB_600M, "d_model": 2048, "encoder_layers": 24, "decoder_layers": 24,
                  "encoder_ffn_dim": 8192, "decoder_ffn_dim": 8192},
}  # fmt: skip
NLLB_PIECES = 8000  # the SentencePiece model's; the embedding rows past it stay unused
NLLB_DIRECTION = ("deu_Latn", "fra_Latn")  # the speed runs' languages


def write_nllb_checkpoint(directory, shape="nllb-600m"):
    """A random checkpoint of NLLB_SHAPES[`shape`] in the Hugging Face layout (in the
    transformers venv)."""
    import tempfile

    import hf_m2m_fixtures
    from transformers import GenerationConfig, M2M100Config, M2M100ForConditionalGeneration

    hf_fixtures.set_seed(SEED)
    directory.mkdir(parents=True)
    lines = [line for language in ("de", "en", "fr")
             for line in hf_fixtures.read_lines("train", language, 10_000)]  # fmt: skip
    with tempfile.TemporaryDirectory() as work:
        work = Path(work)
        hf_fixtures.train_spm(lines, NLLB_PIECES, work / "sentencepiece.bpe.model", "identity",
                              work, model_type="bpe")  # fmt: skip
        hf_m2m_fixtures.tokenizer_files("nllb", directory, work / "sentencepiece.bpe.model")
    config = M2M100Config(pad_token_id=1, bos_token_id=0, eos_token_id=2,
                          decoder_start_token_id=2, **NLLB_SHAPES[shape])  # fmt: skip
    model = M2M100ForConditionalGeneration(config)
    log(f"{directory.name}: {sum(p.numel() for p in model.parameters()) / 1e6:.0f}M parameters")
    model.generation_config = GenerationConfig(
        num_beams=BEAM_SIZE, max_length=200, decoder_start_token_id=2, bos_token_id=0,
        eos_token_id=2, pad_token_id=1,
    )  # fmt: skip
    model.save_pretrained(str(directory), max_shard_size="20GB")  # one file, as the bench reads


SENTENCE = "Ein Hund läuft über eine Wiese."
ONNX_CHECK = (
    "import json, sys\n"
    "from export.runtime import OnnxTranslator\n"
    "t = OnnxTranslator(sys.argv[1])\n"
    "print('ONNX', json.dumps(t.translate(\n"
    "    [sys.argv[2]], target_language='fra_Latn', source_language='deu_Latn')))\n"
)
SAVED_MODEL_CHECK = (
    "import sys\n"
    "import tensorflow as tf, tensorflow_text\n"
    "tf.compat.v1.disable_eager_execution()\n"
    "with tf.compat.v1.Session(graph=tf.Graph()) as session:\n"
    "    meta = tf.compat.v1.saved_model.loader.load(session, ['serve'], sys.argv[1])\n"
    "    s = meta.signature_def['serving_default']\n"
    "    feed = {s.inputs['sentences'].name: [sys.argv[2]],\n"
    "            s.inputs['target_language'].name: ['fra_Latn'],\n"
    "            s.inputs['source_language'].name: ['deu_Latn']}\n"
    "    print('SavedModel', session.run(s.outputs['translations'].name, feed))\n"
)


REST_PORT = 8591


def rest_server_check(exported, int8):
    """The REST server (`python -m export.serve`) on `exported`: seconds until it answers, its
    peak resident memory after one translation (deu_Latn into fra_Latn)."""
    import http.client

    import serving

    start = time.perf_counter()
    server = serving.Server(exported, REST_PORT, BEAM_SIZE, ["--int8"] if int8 else [])
    ready = time.perf_counter() - start
    body = {"instances": [{"sentences": SENTENCE, "source_language": NLLB_DIRECTION[0],
                           "target_language": NLLB_DIRECTION[1]}]}  # fmt: skip
    connection = http.client.HTTPConnection("127.0.0.1", REST_PORT, timeout=600)
    connection.request("POST", f"/v1/models/{serving.MODEL_NAME}:predict", json.dumps(body))
    answer = connection.getresponse()
    if answer.status != 200:
        sys.exit(f"the REST server answered {answer.status}: {answer.read()[:200]}")
    status = Path(f"/proc/{server.process.pid}/status").read_text()
    peak = int(next(line for line in status.splitlines() if line.startswith("VmHWM")).split()[1])
    server.stop()
    log(f"REST server ({'int8' if int8 else 'float32'}): answering after {ready:.0f} s, peak "
        f"{peak / 1024:.0f} MB after a translation")  # fmt: skip


def nllb_checkpoint(args, shape="nllb-600m"):
    """The random checkpoint of NLLB_SHAPES[`shape`], made by `write_nllb_checkpoint` unless
    it exists."""
    source = args.root.resolve() / shape
    if not (source / "model.safetensors").exists():
        shutil.rmtree(source, ignore_errors=True)
        run([hf_python(args), __file__, "_nllb_checkpoint", source, shape])
    return source


def nllb_size(args):
    """Import and export at NLLB's shape `--shape` (see the module's docstring)."""
    source = nllb_checkpoint(args, args.shape)
    workdir = args.root / f"{args.shape}-import"
    weights = import_measured(source, workdir)["weights_mb"]
    if args.import_only:
        return
    set_decode(workdir, max_length_cap=16)  # random weights: the checks translate a few tokens
    seconds, peak = measured([sys.executable, "-m", "export", "--workdir", workdir,
                              "--formats", "saved_model,onnx"])  # fmt: skip
    log(f"export: {seconds:.0f} s, peak memory {peak:.0f} MB ({peak / weights:.2f}x the weights)")
    for path in sorted((workdir / "export").rglob("*")):
        if path.is_file() and path.stat().st_size > 1 << 20:
            log(f"  {path.relative_to(workdir)}: {path.stat().st_size / 2**20:,.0f} MB")
    seconds, peak = measured([sys.executable, "-c", ONNX_CHECK, workdir / "export", SENTENCE])
    log(f"ONNX Runtime, load and one sentence: {seconds:.0f} s, peak {peak:.0f} MB")
    saved_model = workdir / "export" / "saved_model" / "translator" / "1"
    seconds, peak = measured([sys.executable, "-c", SAVED_MODEL_CHECK, saved_model, SENTENCE])
    log(f"SavedModel, TF Serving's session loader: {seconds:.0f} s, peak {peak:.0f} MB")
    for int8 in (False, True):
        rest_server_check(workdir / "export", int8)


def main():
    if len(sys.argv) > 1 and sys.argv[1] == "_nllb_checkpoint":
        import transformers

        transformers.logging.set_verbosity_error()
        write_nllb_checkpoint(Path(sys.argv[2]), *sys.argv[3:])
        return
    if len(sys.argv) > 1 and sys.argv[1] == "_checkpoint":
        directory, shape, pieces, size, steps = sys.argv[2:]
        import transformers

        transformers.logging.set_verbosity_error()
        write_checkpoint(Path(directory), json.loads(shape), int(pieces), int(size), int(steps))
        return
    if len(sys.argv) > 1 and sys.argv[1] == "_worker":
        engine, model_path, source, threads = sys.argv[2:]
        worker(engine, model_path, json.loads(source), int(threads))
        return
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("task", choices=("speed", "fine-tune", "fine-tune-m2m", "size"))
    parser.add_argument("--root", type=Path, default=PROJECT_ROOT / "runs" / "pretrained")
    parser.add_argument(
        "--hf-venv",
        type=Path,
        default=PROJECT_ROOT / "runs" / "hf" / "venv",
        help="the transformers venv (tools/hf_fixtures.py's), made if missing",
    )
    parser.add_argument("--model", choices=tuple(SPEED_MODELS), default="opus-mt-base",
                        help="speed: the checkpoint's shape")  # fmt: skip
    parser.add_argument("--shape", choices=tuple(NLLB_SHAPES), default="nllb-600m",
                        help="size: the checkpoint's shape")  # fmt: skip
    parser.add_argument("--import-only", action="store_true",
                        help="size: the import alone (no export, no runtimes)")  # fmt: skip
    parser.add_argument("--rounds", type=int, default=3, help="speed: rounds of timings")
    parser.add_argument(
        "--threads",
        type=lambda text: tuple(int(n) for n in text.split(",")),
        default=(1, 2),
        help="speed: the thread counts each engine runs with, comma-separated",
    )
    parser.add_argument(
        "--pretrain-steps",
        type=int,
        default=800,
        help="fine-tune: the checkpoint's training steps in transformers",
    )
    parser.add_argument("--minutes", type=float, default=10,
                        help="fine-tune, fine-tune-m2m: training time")  # fmt: skip
    args = parser.parse_args()
    tasks = {"speed": speed, "fine-tune": fine_tune, "fine-tune-m2m": fine_tune_m2m,
             "size": nllb_size}  # fmt: skip
    tasks[args.task](args)


if __name__ == "__main__":
    main()
