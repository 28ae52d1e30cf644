import fcntl
import os

os.environ.setdefault("KERAS_BACKEND", "tensorflow")
# Each pytest-xdist worker's TensorFlow, and the commands its tests start, on its share of
# the CPUs: workers whose thread pools each span every CPU stall each other's small ops.
if os.environ.get("PYTEST_XDIST_WORKER_COUNT"):
    share = len(os.sched_getaffinity(0)) // int(os.environ["PYTEST_XDIST_WORKER_COUNT"])
    os.environ.setdefault("TF_NUM_INTRAOP_THREADS", str(max(1, share)))

# TensorFlow loads as the commands load it: at the commands' log level (which the commands the
# tests start inherit), without the lines its libraries log while they load. Imported here
# under pytest's capture, in pytest-xdist's controller those lines would wait in the capture
# until the session ends and print after the summary.
from pipeline.core.library_output import quiet_tensorflow_startup  # noqa: E402

quiet_tensorflow_startup()

import keras  # noqa: E402
import numpy as np  # noqa: E402
import pytest  # noqa: E402

# The test files that take longest, longest first (as per-test timings of a whole run ranked
# them: bench/RESULTS.md, "The test suite"). pytest-xdist hands each worker a whole file at a
# time in collection order (`--no-loadscope-reorder` in pyproject.toml), so the long ones start
# first and the run ends on short ones, not with one worker idle while the other finishes one.
LONGEST_FIRST = (
    "test_pretrained.py", "test_pretrained_m2m.py", "test_export.py", "test_train.py",
    "test_multilingual.py", "test_distribute.py", "test_hardening.py", "test_transformer.py",
    "test_serve.py", "test_ensemble.py", "test_work_directory.py", "test_seq2seq.py",
    "test_layer_harness.py", "test_precision.py", "test_shared_vocabulary.py", "test_distill.py",
    "test_web_example.py", "test_search.py", "test_commands.py", "test_fine_tuning.py",
)  # fmt: skip


def pytest_collection_modifyitems(items):
    rank = {name: index for index, name in enumerate(LONGEST_FIRST)}
    items.sort(key=lambda item: rank.get(item.path.name, len(rank)))  # stable: files stay whole


@pytest.fixture(autouse=True)
def _seed():
    keras.utils.set_random_seed(1234)


@pytest.fixture
def rng():
    return np.random.default_rng(0)


def train_and_export_smoke(workdir, config_name):
    """A smoke model trained long enough to write multi-token outputs, exported by training
    (WORKDIR/export)."""
    from pipeline import train
    from pipeline.config import PROJECT_ROOT

    train.main(
        ["--config", str(PROJECT_ROOT / "configs" / config_name), "--workdir", str(workdir),
         "--set", "train.steps_per_epoch=40", "--set", "train.bleu_every_epochs=0",
         "--set", "data.test_source=null", "--set", "data.test_target=null",
         "--set", "export.after_training=true"]
    )  # fmt: skip
    return workdir


def trained_once_per_run(tmp_path_factory, name, config_name):
    """`train_and_export_smoke` into RUN_TEMP/name, run by the first pytest-xdist worker that
    asks while the others wait on a lock: one training for the whole run, not one a worker."""
    run_temp = tmp_path_factory.getbasetemp()
    if os.environ.get("PYTEST_XDIST_WORKER"):
        run_temp = run_temp.parent  # each worker has its own folder in the run's
    workdir = run_temp / name
    with open(run_temp / f"{name}.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if not workdir.exists():  # the first to hold the lock trains; a failure leaves no mark
            workdir.mkdir()
            train_and_export_smoke(workdir, config_name)
            (workdir / "trained").touch()
    if not (workdir / "trained").exists():
        pytest.fail(f"the shared {name} fixture failed in another worker; see its error")
    return workdir


@pytest.fixture(scope="session")
def exported_workdir(tmp_path_factory):
    """The recurrent smoke model, exported. Shared: tests must not change it."""
    return trained_once_per_run(tmp_path_factory, "exported", "smoke.yaml")


@pytest.fixture(scope="session")
def exported_transformer_workdir(tmp_path_factory):
    """The Transformer smoke model, exported. Shared: tests must not change it."""
    return trained_once_per_run(tmp_path_factory, "exported_transformer", "smoke_transformer.yaml")
