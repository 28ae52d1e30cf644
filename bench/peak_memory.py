"""Peak resident memory (RSS) of training and of each decoding runtime, each in a fresh process.

    python bench/peak_memory.py --workdir runs/default [--quick] [--config configs/X.yaml]

Training: `pipeline.train` with the configuration for `--steps` steps (no validation, test or
export). Decoding: the test split at batch 64, beam 5, through ONNX Runtime (`export.runtime`,
float and int8 models, in a process that never imports TensorFlow), the SavedModel through the
session loader, and the Keras model in process. Each figure is the process's high-water RSS
(VmHWM) at its end: everything it loaded (libraries, model, vocabularies) included. Expects the
work directory to hold a trained, exported model (`python -m export --workdir DIR`).
"""

import argparse
import json
import os
import runpy
import subprocess
import sys
import tempfile
from pathlib import Path

BENCH = Path(__file__).resolve().parent
PROJECT_ROOT = BENCH.parent
RUNTIMES = ("onnx", "onnx_int8", "saved_model", "keras")


def peak_rss_mib():
    """This process image's high-water RSS. Not `ru_maxrss`: Linux carries that over from the
    parent through fork and exec, so a child would report at least its parent's peak."""
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) / 1024  # kB
    raise RuntimeError("no VmHWM in /proc/self/status (Linux only)")


def run_training(config, steps, overrides=()):
    sys.argv = [
        "pipeline.train", "--config", str(config), "--workdir", tempfile.mkdtemp(),
        "--set", f"train.steps_per_epoch={steps}", "--set", "train.epochs=1",
        "--set", "data.valid_source=null", "--set", "data.valid_target=null",
        "--set", "data.test_source=null", "--set", "data.test_target=null",
        "--set", "train.bleu_every_epochs=0", "--set", "train.early_stopping_patience=null",
        "--set", "export.after_training=false",
        *[arg for override in overrides for arg in ("--set", override)],
    ]  # fmt: skip
    try:
        runpy.run_module("pipeline.train", run_name="__main__", alter_sys=True)
    except SystemExit as stop:
        if stop.code:
            raise


def run_decoding(runtime, workdir, onnx_directory, sentences_file):
    sentences = Path(sentences_file).read_text(encoding="utf-8").splitlines()
    if runtime in ("onnx", "onnx_int8"):
        from export.runtime import OnnxTranslator

        translator = OnnxTranslator(onnx_directory, batch_size=64, int8=runtime == "onnx_int8")
        translator.translate(sentences, beam_size=5)
        assert "tensorflow" not in sys.modules, "the ONNX runtime must not need TensorFlow"
        return
    sys.path.insert(0, str(BENCH))
    from decoding_runtimes import (
        KerasRuntime,
        SessionRuntime,
        batches_of,
        export_directory,
        latest_version,
    )

    from pipeline.workdir import load_trained

    config, model, source_tokenizer, _ = load_trained(workdir)
    if runtime == "saved_model":
        del model  # the session loader reads the SavedModel alone
        export = export_directory(config, workdir)
        search = SessionRuntime(latest_version(export, config["export"]["model_name"]))
    else:
        search = KerasRuntime(model, config["decode"])
    limit = config["decode"]["max_source_length"]
    source_ids = [ids[:limit] for ids in source_tokenizer.processor.encode(sentences)]
    for _, batch in batches_of(source_ids, 64):
        search(batch, 5)


def measure(arguments):
    """Runs this script as a child with `arguments`; its peak RSS in MiB."""
    output = subprocess.run(
        [sys.executable, __file__, *arguments],
        capture_output=True,
        text=True,
        cwd=PROJECT_ROOT,
        env={**os.environ, "TF_CPP_MIN_LOG_LEVEL": "3"},
    )
    if output.returncode:
        raise RuntimeError(f"{arguments}: exit {output.returncode}\n{output.stderr[-2000:]}")
    return json.loads(output.stdout.strip().splitlines()[-1])["peak_rss_mib"]


def main():
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--workdir", type=Path, default=Path("runs/default"))
    parser.add_argument("--config", type=Path, default=PROJECT_ROOT / "configs" / "default.yaml")
    parser.add_argument("--steps", type=int, default=100, help="training steps")
    parser.add_argument("--sentences", type=int, default=1000, help="test sentences to decode")
    parser.add_argument("--quick", action="store_true", help="20 steps, 128 sentences")
    parser.add_argument("--child", choices=("train", *RUNTIMES), help=argparse.SUPPRESS)
    parser.add_argument("--sentences-file", help=argparse.SUPPRESS)
    parser.add_argument("--set", action="append", default=[], help=argparse.SUPPRESS)
    parser.add_argument("--onnx-directory", help=argparse.SUPPRESS)
    args = parser.parse_args()
    sys.path.insert(0, str(PROJECT_ROOT))

    if args.child == "train":
        run_training(args.config, args.steps, args.set)
    elif args.child:
        run_decoding(args.child, args.workdir.resolve(), args.onnx_directory, args.sentences_file)
    if args.child:
        print(json.dumps({"peak_rss_mib": round(peak_rss_mib(), 1)}))
        return

    if args.quick:
        args.steps, args.sentences = 20, 128
    sys.path.insert(0, str(BENCH))
    from decoding_runtimes import export_directory

    from pipeline.config import load_config
    from pipeline.data.corpus import read_split

    config = load_config(args.workdir / "config.yaml", saved=True)
    onnx_directory = export_directory(config, args.workdir.resolve()) / "onnx"
    sentences = read_split(config["data"], "test").sources[: args.sentences]
    print("| process | what it does | peak RSS (MiB) |")
    print("|---|---|---:|")
    rss = measure(["--child", "train", "--config", str(args.config), "--steps", str(args.steps)])
    print(f"| training | {args.config.name}, {args.steps} steps |  {rss:,.0f} |", flush=True)
    with tempfile.NamedTemporaryFile("w", suffix=".txt", encoding="utf-8") as file:
        file.write("\n".join(sentences) + "\n")
        file.flush()
        for runtime in RUNTIMES:
            rss = measure([
                "--child", runtime, "--workdir", str(args.workdir), "--sentences-file", file.name,
                "--onnx-directory", str(onnx_directory),
            ])  # fmt: skip
            print(
                f"| {runtime} | {len(sentences)} test sentences, batch 64, beam 5 | {rss:,.0f} |",
                flush=True,
            )


if __name__ == "__main__":
    main()
