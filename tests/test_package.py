"""The wheel (`python -m build --wheel`) holds every package, the recipes and the bundled
corpus, and installed from it the main job's configuration resolves from any directory (the
full main job is tests/test_commands.py's)."""

import subprocess
import sys
import zipfile

import pytest

from pipeline.config import PROJECT_ROOT, RECIPES


@pytest.fixture(scope="module")
def wheel(tmp_path_factory):
    out = tmp_path_factory.mktemp("dist")
    command = [sys.executable, "-m", "build", "--wheel", "--outdir", str(out), str(PROJECT_ROOT)]
    result = subprocess.run(command, capture_output=True, text=True, timeout=600)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    (path,) = out.glob("*.whl")
    return path


def test_the_wheel_holds_every_package_the_recipes_and_the_corpus(wheel):
    names = set(zipfile.ZipFile(wheel).namelist())
    packages = {init.parent.relative_to(PROJECT_ROOT).as_posix()
                for top in ("layers", "pipeline", "export")
                for init in (PROJECT_ROOT / top).rglob("__init__.py")}  # fmt: skip
    modules = {path.relative_to(PROJECT_ROOT).as_posix() for package in packages
               for path in (PROJECT_ROOT / package).glob("*.py")}  # fmt: skip
    assert modules - names == set()
    recipes = {f"seq2seq_tf/configs/{path.name}" for path in RECIPES.glob("*.yaml")}
    corpus = {f"seq2seq_tf/data/multi30k/{path.name}"
              for path in (PROJECT_ROOT / "data" / "multi30k").iterdir()}  # fmt: skip
    assert "seq2seq_tf/configs/default.yaml" in recipes
    assert recipes | corpus | {"export/tf_serving_ops.txt"} <= names
    assert not any(name.startswith(("tests/", "bench/", "runs/")) for name in names)


def test_installed_the_recipes_resolve_from_an_empty_directory(wheel, tmp_path):
    """The wheel unpacked as pip lays it out in site-packages, imported ahead of the checkout,
    from a directory with nothing in it."""
    site = tmp_path / "site-packages"
    zipfile.ZipFile(wheel).extractall(site)
    empty = tmp_path / "empty"
    empty.mkdir()
    code = """
import pipeline.config as c
from pathlib import Path
config = c.load_config()
paths = [config["data"][k] for k in ("train_source", "train_target", "valid_source",
                                     "valid_target", "test_source", "test_target")]
recipe = c.load_config("multi30k_de_en_transformer")
print(Path(c.__file__).parent.parent, c.DEFAULT_CONFIG, all(Path(p).is_file() for p in paths),
      recipe["model"]["type"])
"""
    result = subprocess.run([sys.executable, "-c", code], cwd=empty, capture_output=True,
                            text=True, timeout=120, env={"PYTHONPATH": str(site)})  # fmt: skip
    assert result.returncode == 0, result.stderr[-3000:]
    root, default, exist, model_type = result.stdout.split()
    assert root == str(site)
    assert default == str(site / "seq2seq_tf" / "configs" / "default.yaml")
    assert (exist, model_type) == ("True", "transformer")
