"""`train.precision`: mixed precision per model, float32 weights, float32 saved models."""

import re

import keras
import numpy as np
import pytest

from pipeline import train
from pipeline.config import PROJECT_ROOT, load_config
from pipeline.model_types.builder import build_model
from pipeline.training.optimizers import StepCountingLossScaleOptimizer
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
