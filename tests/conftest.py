import os

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
os.environ.setdefault("KERAS_BACKEND", "tensorflow")

import keras  # noqa: E402
import numpy as np  # noqa: E402
import pytest  # noqa: E402


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


@pytest.fixture(scope="session")
def exported_workdir(tmp_path_factory):
    """The recurrent smoke model, exported. Shared: tests must not change it."""
    return train_and_export_smoke(tmp_path_factory.mktemp("exported"), "smoke.yaml")


@pytest.fixture(scope="session")
def exported_transformer_workdir(tmp_path_factory):
    """The Transformer smoke model, exported. Shared: tests must not change it."""
    return train_and_export_smoke(
        tmp_path_factory.mktemp("exported_transformer"), "smoke_transformer.yaml"
    )
