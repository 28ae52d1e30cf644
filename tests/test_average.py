"""Checkpoint averaging: the function, training's `train.average_checkpoints` and the command."""

import numpy as np
import pytest

from helpers import SMOKE
from pipeline import average, train
from pipeline.config import load_config
from pipeline.core.errors import UserError
from pipeline.model_types.builder import build_model
from pipeline.training.checkpoints import average_checkpoints
from pipeline.training.optimizers import make_optimizer
from pipeline.training.run_state import RunState, training_checkpoint
from pipeline.workdir import load_trained

TRAIN = load_config(SMOKE)["train"]


def smoke_model(vocab_size=50):
    return build_model(load_config(SMOKE), vocab_size, vocab_size)


def save_checkpoint(model, prefix):
    """As training saves: the model, its optimizer and the run's state."""
    optimizer = make_optimizer(TRAIN)
    optimizer.build(model.trainable_variables)
    return training_checkpoint(model, optimizer, RunState(1)).save(str(prefix))


def test_the_average_is_the_mean_of_each_weight(tmp_path):
    model = smoke_model()
    weights = model.get_weights()
    first = save_checkpoint(model, tmp_path / "first")
    model.set_weights([w + 1.0 for w in weights])
    second = save_checkpoint(model, tmp_path / "second")

    other = smoke_model()  # other initial weights, all to be replaced
    assert any(not np.allclose(a, b) for a, b in zip(other.get_weights(), weights, strict=True))
    average_checkpoints(other, TRAIN, [first])
    for restored, saved in zip(other.get_weights(), weights, strict=True):
        np.testing.assert_array_equal(restored, saved)
    average_checkpoints(other, TRAIN, [first, second])
    for averaged, saved in zip(other.get_weights(), weights, strict=True):
        np.testing.assert_allclose(averaged, saved + 0.5, rtol=0, atol=1e-6)


def test_a_checkpoint_of_another_model_is_refused_and_changes_nothing(tmp_path):
    foreign = save_checkpoint(smoke_model(vocab_size=60), tmp_path / "foreign")
    model = smoke_model()
    mine = save_checkpoint(model, tmp_path / "mine")
    before = model.get_weights()
    with pytest.raises(UserError, match="cannot read this model's weights"):
        average_checkpoints(model, TRAIN, [mine, foreign])
    for after, expected in zip(model.get_weights(), before, strict=True):
        np.testing.assert_array_equal(after, expected)


def test_averaging_more_checkpoints_than_kept_is_refused():
    overrides = ["train.average_checkpoints=3", "train.keep_checkpoints=2"]
    with pytest.raises(UserError, match=r"train.average_checkpoints \(3\) exceeds"):
        load_config(SMOKE, overrides)


@pytest.fixture(scope="module")
def averaged_run(tmp_path_factory):
    """The smoke recipe trained with `train.average_checkpoints=2`."""
    workdir = tmp_path_factory.mktemp("averaged")
    train.main(
        ["--config", str(SMOKE), "--workdir", str(workdir),
         "--set", "train.average_checkpoints=2", "--set", "train.bleu_every_epochs=0",
         "--set", "data.test_source=null", "--set", "data.test_target=null"]
    )  # fmt: skip
    return workdir


def mean_of_restored(workdir, steps):
    """Each checkpoint read alone into a fresh model, and the weights averaged here."""
    config, trained = load_trained(workdir)[:2]
    sizes = trained.source_vocab_size, trained.target_vocab_size
    sums = None
    for step in steps:
        model = build_model(config, *sizes)
        average_checkpoints(model, config["train"], [str(workdir / "checkpoints" / f"ckpt-{step}")])
        weights = model.get_weights()
        sums = weights if sums is None else [a + b for a, b in zip(sums, weights, strict=True)]
    return [total / len(steps) for total in sums]


def test_training_saves_the_mean_of_the_last_checkpoints(averaged_run):
    # 8 steps: checkpoints at 3, 4, 6 and 8, the last 2 kept and averaged.
    model = load_trained(averaged_run)[1]
    for saved, expected in zip(
        model.get_weights(), mean_of_restored(averaged_run, [6, 8]), strict=True
    ):
        np.testing.assert_allclose(saved, expected, rtol=0, atol=1e-6)


def test_the_command_writes_an_averaged_work_directory(averaged_run, tmp_path, capsys):
    output = tmp_path / "averaged"
    average.main(["--workdir", str(averaged_run), "--last", "2", "--output", str(output)])
    assert "Averaged the last 2 checkpoints (ckpt-6, ckpt-8)" in capsys.readouterr().out
    for name in ("config.yaml", "model.keras", "vocab/source.model", "vocab/target.model"):
        assert (output / name).is_file(), name
    copied, trained = load_trained(output)[1], load_trained(averaged_run)[1]
    for a, b in zip(copied.get_weights(), trained.get_weights(), strict=True):
        np.testing.assert_allclose(a, b, rtol=0, atol=1e-6)

    # --last beyond what is kept averages what there is.
    average.main(["--workdir", str(averaged_run), "--last", "5", "--output", str(output)])
    assert "Only 2 checkpoints are kept" in capsys.readouterr().err

    # --up-to-step: the last checkpoints saved at or before that step.
    earlier = tmp_path / "earlier"
    average.main(["--workdir", str(averaged_run), "--last", "2", "--up-to-step", "7",
                  "--output", str(earlier)])  # fmt: skip
    assert "Averaged the last 1 checkpoints (ckpt-6)" in capsys.readouterr().out
    for a, b in zip(
        load_trained(earlier)[1].get_weights(), mean_of_restored(averaged_run, [6]), strict=True
    ):
        np.testing.assert_allclose(a, b, rtol=0, atol=1e-6)


@pytest.mark.parametrize(
    "arguments, message",
    [
        (["--last", "0"], "--last must be at least 1"),
        (["--output", "SAME"], "--output must differ from --workdir"),
        (["--up-to-step", "5"], "no checkpoint at or before step 5 is kept (steps 6, 8)"),
    ],
)
def test_the_command_refuses_bad_arguments(averaged_run, tmp_path, capsys, arguments, message):
    arguments = [str(averaged_run) if a == "SAME" else a for a in arguments]
    if "--output" not in arguments:
        arguments += ["--output", str(tmp_path / "out")]
    with pytest.raises(SystemExit) as exit_info:
        average.main(["--workdir", str(averaged_run), *arguments])
    assert exit_info.value.code == 2
    assert message in capsys.readouterr().err
    assert not (tmp_path / "out").exists()
