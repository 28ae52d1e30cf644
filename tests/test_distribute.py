"""tf.distribute: the loss over two replicas, and over accumulated micro-batches, equals one
device's on the same global batch; mirrored training over two logical CPUs; a two-process
multi-worker run on 127.0.0.1; and the cluster bookkeeping (TF_CONFIG, chief, scratch
folders)."""

import json
import math
import os
import re
import shutil
import subprocess
import sys
import time

import numpy as np
import pytest
import tensorflow as tf

from helpers import SMOKE, free_port
from pipeline.config import PROJECT_ROOT, load_config
from pipeline.core.errors import UserError
from pipeline.training.distribution import EXIT_RESTART, SCRATCH_DIR, Task, current_task
from pipeline.training.run_state import EARLY_STOPPING

QUICK = ["--set", "train.bleu_every_epochs=0", "--set", "data.test_source=null",
         "--set", "data.test_target=null"]  # fmt: skip


def environment(**extra):
    env = {k: v for k, v in os.environ.items() if k != "TF_CONFIG"}
    return {**env, "TF_CPP_MIN_LOG_LEVEL": "3", **extra}


def train_command(workdir, *args):
    return [sys.executable, "-m", "pipeline.train", "--config", str(SMOKE),
            "--workdir", str(workdir), *QUICK, *args]  # fmt: skip


def fingerprint(output):
    return re.search(r"Weights fingerprint: (\w+)", output).group(1)


def test_the_keras_behaviours_distributed_training_works_around_are_still_there():
    """`pipeline.model_types.training_twins` overrides Keras' TensorFlow trainer where it fails us.
    When Keras changes these, check whether each workaround is still needed and still hooks
    in: an override of a renamed method would silently do nothing."""
    import inspect

    from keras.src.backend.tensorflow import trainer

    from pipeline.model_types.training_twins import DistributedTraining

    # A first batch averaged over the replicas to build the model from.
    build = trainer.TensorFlowTrainer._maybe_symbolic_build
    assert list(inspect.signature(build).parameters) == ["self", "iterator", "data_batch"]
    source = inspect.getsource(build)
    assert "self.distribute_strategy.reduce(" in source and '"MEAN"' in source
    # Logs averaged along an axis that scalars lack, under a multi-worker strategy.
    assert 'strategy.reduce("MEAN", v, axis=0)' in inspect.getsource(trainer.reduce_per_replica)
    for name in ("_maybe_symbolic_build", "train_step", "test_step", "compute_loss"):
        assert hasattr(trainer.TensorFlowTrainer, name), name
        assert name in vars(DistributedTraining), name
    # Gradients clipped before the replicas' shares are summed (`FusedAdam`).
    from keras.src.backend.tensorflow.optimizer import TFOptimizer
    from keras.src.optimizers.base_optimizer import BaseOptimizer

    from pipeline.training.optimizers import FusedAdam

    apply = inspect.getsource(BaseOptimizer._backend_apply_gradients)
    assert apply.index("self._clip_gradients(grads)") < apply.index("self._backend_update_step(")
    update = inspect.getsource(TFOptimizer._backend_update_step)
    assert "self._all_reduce_sum_gradients(" in update
    for name in ("_clip_gradients", "_all_reduce_sum_gradients"):
        assert name in vars(FusedAdam), name


# Variants of `mirrored_steps.py`: {name: its options}.
MIRRORED_VARIANTS = {
    "recurrent": ["parts=3"],
    "transformer": ["parts=3", "transformer"],
    "sentences-without-smoothing": ["parts=3", "train.label_smoothing=0",
                                    "train.loss_normalization=sentences"],
}  # fmt: skip


@pytest.fixture(scope="module")
def mirrored_runs():
    """Every variant's runs, from one process (TensorFlow started once)."""
    result = subprocess.run(
        [sys.executable, str(PROJECT_ROOT / "tests" / "mirrored_steps.py"),
         json.dumps(MIRRORED_VARIANTS)],
        capture_output=True, text=True, timeout=600, env=environment(),
    )  # fmt: skip
    assert result.returncode == 0, result.stderr[-3000:]
    return json.loads(result.stdout.strip().splitlines()[-1])


@pytest.mark.parametrize("variant", MIRRORED_VARIANTS)
def test_replicas_and_accumulated_micro_batches_give_one_batchs_losses_and_weights(
    mirrored_runs, variant
):
    """Two replicas, 6 micro-batches of mixed lengths accumulated on one device, and 3 on each
    of two replicas: each update is the one that one batch of all their pairs gives."""
    runs = dict(mirrored_runs[variant])
    assert runs.pop("replicas") == 2
    single = runs.pop("single")["losses"]
    assert set(runs) == {"mirrored", "accumulated", "mirrored_accumulated"}
    for name, run in runs.items():
        np.testing.assert_allclose(run["losses"], single, rtol=1e-5, err_msg=name)
        assert run["max_weight_difference"] < 1e-5, name


def test_mirrored_training_over_two_cpu_devices(tmp_path):
    result = subprocess.run(
        train_command(tmp_path, "--strategy", "mirrored", "--set", "distribute.cpu_replicas=2",
                      "--set", "distribute.scale_learning_rate=true"),
        capture_output=True, text=True, timeout=300, cwd=PROJECT_ROOT, env=environment(),
    )  # fmt: skip
    assert result.returncode == 0, result.stdout[-2000:] + result.stderr[-2000:]
    assert "2 replica(s)" in result.stdout and "32 per replica, 64 global" in result.stdout
    assert "learning rate 0.02" in result.stdout  # 0.01 x 2 replicas
    assert (tmp_path / "model.keras").is_file()


def start_workers(workdir, cluster, *args):
    def tf_config(index):
        return json.dumps({"cluster": cluster, "task": {"type": "worker", "index": index}})

    command = train_command(workdir, "--strategy", "multi_worker", *args)
    return [
        subprocess.Popen(
            command,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
            cwd=PROJECT_ROOT,
            env=environment(TF_CONFIG=tf_config(index)),
        )
        for index in range(2)
    ]


def wait_for(workers, statuses=(0, 0)):
    outputs = []
    for worker in workers:
        try:
            outputs.append(worker.communicate(timeout=300)[0])
        finally:
            worker.kill()
    for worker, output, status in zip(workers, outputs, statuses):
        assert worker.returncode == status, output[-3000:]
    return outputs


def two_workers():
    return {"worker": [f"127.0.0.1:{free_port()}", f"127.0.0.1:{free_port()}"]}


@pytest.fixture(scope="module")
def killed_then_restarted(tmp_path_factory):
    """A two-worker run whose second worker is killed once the checkpoint of step 10 is
    saved, then both restarted on an empty scratch disk for two epochs of 15 steps with early
    stopping: (the first run's chief process and output, the restart's outputs, the work
    directory). Two tests read it: a killed worker's, and a whole two-worker run's."""
    workdir = tmp_path_factory.mktemp("multi_worker")
    cluster = two_workers()
    # A worker cannot step without the other: the chief stops within a step of the kill. The
    # first run's epoch is too long to end before the kill on any machine.
    workers = start_workers(workdir, cluster, "--set", "train.epochs=1",
                            "--set", "train.steps_per_epoch=1000000",
                            "--set", "train.checkpoint_every_steps=5")  # fmt: skip
    deadline = time.monotonic() + 240
    while not (workdir / "checkpoints" / "ckpt-10.index").exists():
        assert all(w.poll() is None for w in workers) and time.monotonic() < deadline
        time.sleep(0.05)
    workers[1].kill()
    chief_output = workers[0].communicate(timeout=120)[0]
    workers[1].communicate()
    # The killed worker comes back on an empty disk: it resumes from the chief's checkpoint.
    shutil.rmtree(workdir / SCRATCH_DIR)
    outputs = wait_for(start_workers(workdir, cluster, "--set", "train.epochs=2",
                                     "--set", "train.steps_per_epoch=15",
                                     "--set", "train.early_stopping_patience=2"))  # fmt: skip
    return workers[0], chief_output, outputs, workdir


def test_two_workers_finish_with_identical_weights(killed_then_restarted):
    _, _, outputs, workdir = killed_then_restarted
    assert "worker-0 (chief)" in outputs[0] and "this process worker-1;" in outputs[1]
    # One training file for two input pipelines: each reads every line and keeps its half.
    assert "1 line in 2 (fewer files than input pipelines)" in outputs[1]
    assert fingerprint(outputs[0]) == fingerprint(outputs[1])
    # Only the chief wrote to the work directory; the other worker's scratch is gone.
    assert (workdir / "model.keras").is_file() and (workdir / "checkpoints").is_dir()
    assert not (workdir / SCRATCH_DIR).exists()
    # Early stopping's state, shared from the chief as the run began, starts at an infinite
    # loss (the checkpoint resumed from was saved before any epoch ended).
    state = tf.train.load_checkpoint(tf.train.latest_checkpoint(str(workdir / "checkpoints")))
    best, best_epoch = (
        state.get_tensor(f"{EARLY_STOPPING}/{name}/.ATTRIBUTES/VARIABLE_VALUE")
        for name in ("best", "best_epoch")
    )
    assert math.isfinite(best) and best_epoch == 2


@pytest.mark.slow
def test_a_killed_worker_and_its_restart_resume_from_the_last_checkpoints(killed_then_restarted):
    chief, chief_output, outputs, _ = killed_then_restarted
    assert chief.returncode == EXIT_RESTART, chief_output[-3000:]
    assert "another worker stopped" in chief_output
    assert re.search(r"Resuming from \S+ckpt-\d+ \(step", outputs[0])
    assert "Resuming from the chief's checkpoint (step" in outputs[1]
    resumed = [re.search(r"Resuming from .*\(step (\d+),", output).group(1) for output in outputs]
    assert resumed[0] == resumed[1] and int(resumed[0]) >= 10
    assert fingerprint(outputs[0]) == fingerprint(outputs[1])


def test_the_chief_and_the_scratch_folders(monkeypatch, tmp_path):
    multi = {"strategy": "multi_worker"}
    assert current_task({"strategy": "mirrored"}) == Task()
    monkeypatch.delenv("TF_CONFIG", raising=False)
    with pytest.raises(UserError, match="needs TF_CONFIG"):
        current_task(multi)
    monkeypatch.setenv("TF_CONFIG", "{not json")
    with pytest.raises(UserError, match="TF_CONFIG: expected JSON"):
        current_task(multi)
    for cluster, task_type, index, chief in [
        ({"worker": ["a", "b"]}, "worker", 0, True),
        ({"worker": ["a", "b"]}, "worker", 1, False),
        ({"chief": ["c"], "worker": ["a"]}, "worker", 0, False),
        ({"chief": ["c"], "worker": ["a"]}, "chief", 0, True),
    ]:
        tf_config = {"cluster": cluster, "task": {"type": task_type, "index": index}}
        monkeypatch.setenv("TF_CONFIG", json.dumps(tf_config))
        task = current_task(multi)
        assert task.is_chief == chief
        expected = tmp_path if chief else tmp_path / SCRATCH_DIR / f"{task_type}-{index}"
        assert task.output_dir(tmp_path) == expected


def test_distribute_settings_are_validated(tmp_path):
    with pytest.raises(UserError, match="distribute.strategy must be one of"):
        load_config(SMOKE, ["distribute.strategy=horovod"])
    with pytest.raises(UserError, match="distribute.cpu_replicas must be at least 1"):
        load_config(SMOKE, ["distribute.cpu_replicas=0"])
