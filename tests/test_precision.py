"""`train.precision`: mixed precision per model, float32 weights, float32 saved models."""

import re

import keras
import numpy as np
import pytest

from pipeline import train
from pipeline.config import PROJECT_ROOT, load_config
from pipeline.core.errors import UserError
from pipeline.model_types import MODEL_TYPES
from pipeline.model_types.builder import build_model
from pipeline.training.optimizers import StepCountingLossScaleOptimizer
from pipeline.training.precision import resolve as resolve_precision
from pipeline.training.trainer import weights_fingerprint
from pipeline.workdir import load_trained

SMOKE = PROJECT_ROOT / "configs" / "smoke.yaml"
VOCAB_SIZE = 60


def compute_dtypes(model):
    return {layer.compute_dtype for layer in model._flatten_layers(include_self=True)}


def smoke_config(name="smoke.yaml"):
    config = load_config(PROJECT_ROOT / "configs" / name)
    config["model"]["input_feeding"] = True  # the step loop too, not only the fused path
    return config


@pytest.mark.parametrize("config_name", ["smoke.yaml", "smoke_transformer.yaml"])
@pytest.mark.parametrize(("precision", "dtype"), [("mixed_bfloat16", "bfloat16"),
                                                  ("mixed_float16", "float16")])  # fmt: skip
def test_a_mixed_model_computes_in_its_policy_and_no_other_model_does(
    config_name, precision, dtype, rng
):
    config = smoke_config(config_name)
    mixed = build_model(config, VOCAB_SIZE, VOCAB_SIZE, precision=precision)
    assert compute_dtypes(mixed) == {dtype}
    assert {w.dtype for w in mixed.weights} == {"float32"}
    assert keras.config.dtype_policy().name == "float32"
    assert compute_dtypes(build_model(config, VOCAB_SIZE, VOCAB_SIZE)) == {"float32"}

    inputs = {
        "source_ids": rng.integers(4, VOCAB_SIZE, (3, 7)).astype("int32"),
        "target_input_ids": rng.integers(4, VOCAB_SIZE, (3, 5)).astype("int32"),
    }
    logits = mixed(inputs)  # the Transformer's tied projection gives float32 (keras-hub's)
    assert logits.shape == (3, 5, VOCAB_SIZE)
    assert np.isfinite(keras.ops.convert_to_numpy(keras.ops.cast(logits, "float32"))).all()


def test_a_skipped_float16_step_is_counted_and_changes_no_weight():
    weight = keras.Variable(np.ones(3, "float32"))
    optimizer = StepCountingLossScaleOptimizer(keras.optimizers.Adam(0.1))
    optimizer.build([weight])
    scale = float(optimizer.dynamic_scale.numpy())
    optimizer.apply([keras.ops.convert_to_tensor(np.array([np.inf, 1, 1], "float32"))], [weight])
    assert int(optimizer.iterations.numpy()) == 1
    assert float(optimizer.dynamic_scale.numpy()) == scale / 2
    np.testing.assert_array_equal(weight.numpy(), np.ones(3))
    optimizer.apply([keras.ops.ones(3)], [weight])
    assert int(optimizer.iterations.numpy()) == 2 and (weight.numpy() < 1).all()


@pytest.mark.parametrize("precision", ["mixed_bfloat16", "mixed_float16"])
def test_mixed_precision_training_saves_the_trained_weights_as_a_float32_model(
    tmp_path, capsys, precision
):
    command = ["--config", str(SMOKE), "--workdir", str(tmp_path),
               "--set", f"train.precision={precision}", "--set", "data.test_source=null",
               "--set", "data.test_target=null"]  # fmt: skip
    train.main([*command, "--set", "train.epochs=1"])
    history = train.main(command)  # resumes for the second epoch
    output = capsys.readouterr().out
    assert "Resuming from" in output
    assert len(history["val_bleu"]) == 1  # validation BLEU decodes with the float32 twin
    config, model, _, _ = load_trained(tmp_path)
    assert config["train"]["precision"] == precision
    assert compute_dtypes(model) == {"float32"}
    fingerprints = re.findall(r"Weights fingerprint: (\w+)", output)
    assert weights_fingerprint(model) == fingerprints[-1]
    steps = sorted(int(p.name[5:-6]) for p in (tmp_path / "checkpoints").glob("ckpt-*.index"))
    assert steps[-1] == 8  # 2 epochs of 4 steps, loss-scaling skips included


AMX_CPU = {"avx512f", "avx512_bf16", "amx_tile", "amx_bf16"}
ZEN_CPU = {"avx512f", "avx512_bf16"}  # AVX512-BF16 without AMX (an AMD EPYC)
RNN, TRANSFORMER = MODEL_TYPES["rnn"], MODEL_TYPES["transformer"]


@pytest.mark.parametrize(
    ("flags", "gpus", "model_type", "chosen", "why"),
    [
        (AMX_CPU, [], TRANSFORMER, "mixed_bfloat16", "the CPU has AMX"),
        (AMX_CPU, [], RNN, "mixed_bfloat16", "the CPU has AMX"),
        (ZEN_CPU, [], RNN, "mixed_bfloat16", "AVX512-BF16 without AMX, where bfloat16 trains "
                                             "rnn models faster"),
        (ZEN_CPU, [], TRANSFORMER, "float32", "AVX512-BF16 but no AMX, where bfloat16 does not "
                                              "train transformer models faster"),
        ({"avx2"}, [], RNN, "float32", "no bfloat16 arithmetic"),
        ({"avx2"}, [(8, 0)], TRANSFORMER, "mixed_bfloat16", "a GPU of compute capability 8.0"),
        (AMX_CPU, [(7, 5)], RNN, "float32", "GPUs of compute capability 7.5, below 8.0"),
    ],
)  # fmt: skip
def test_auto_chooses_bfloat16_where_the_hardware_computes_it_and_it_pays(
    tmp_path, flags, gpus, model_type, chosen, why
):
    precision, line = resolve_precision("auto", tmp_path / "config.yaml", model_type, flags, gpus)
    assert precision == chosen
    assert line.startswith(f"Precision: {chosen} (train.precision: auto; ") and why in line


def test_a_run_keeps_the_precision_it_began_with(tmp_path):
    saved = tmp_path / "config.yaml"
    saved.write_text("train:\n  precision: mixed_bfloat16\n")
    assert resolve_precision("auto", saved, TRANSFORMER, {"avx2"}, []) == (
        "mixed_bfloat16", "Precision: mixed_bfloat16 (train.precision: auto, as the run began)"
    )  # fmt: skip
    assert resolve_precision("float32", saved, RNN, AMX_CPU, [])[0] == "float32"  # asked so
    saved.write_text("train:\n  precision: float32\n")
    assert resolve_precision("auto", saved, RNN, ZEN_CPU, [])[0] == "float32"  # begun elsewhere
    saved.write_text("train:\n  precision: mixed_float16\n")
    with pytest.raises(UserError, match="this run began in mixed_float16 .* needs a GPU"):
        resolve_precision("auto", saved, RNN, AMX_CPU, [])
    assert resolve_precision("auto", saved, RNN, set(), [(8, 6)])[0] == "mixed_float16"


def test_training_resolves_auto_once_and_writes_it_to_the_work_directory(tmp_path, capsys):
    train.main(["--config", str(SMOKE), "--workdir", str(tmp_path), "--set", "train.epochs=1",
                "--set", "train.precision=auto", "--set", "data.test_source=null",
                "--set", "data.test_target=null"])  # fmt: skip
    chosen, line = resolve_precision("auto", tmp_path / "absent.yaml", RNN)  # this machine's
    assert line in capsys.readouterr().out.splitlines()
    assert load_config(tmp_path / "config.yaml", saved=True)["train"]["precision"] == chosen
