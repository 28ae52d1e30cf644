"""The packages' dependencies run one way: config -> data -> model -> training -> search ->
export. `export` imports `pipeline`; `pipeline` and `layers` never import `export`, and `layers`
never imports `pipeline` (training reaches the exporter through an entry point). Inside
`pipeline`, each sub-package imports only those upstream of it, and `export` reaches decoding
and the core, never training."""

import ast
import subprocess
import sys
from importlib.metadata import entry_points

import pytest

from pipeline.config import PROJECT_ROOT, load_config
from pipeline.core.errors import UserError
from pipeline.train import AFTER_TRAINING_HOOKS, after_training_hooks


def imported_packages(package):
    """(module file, top-level package) of every import in `package`'s modules."""
    for path in sorted((PROJECT_ROOT / package).rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Import):
                names = [alias.name for alias in node.names]
            elif isinstance(node, ast.ImportFrom) and node.level == 0:
                names = [node.module]
            else:
                continue
            for name in names:
                yield path.relative_to(PROJECT_ROOT), name.split(".")[0]


@pytest.mark.parametrize("package,forbidden", [("pipeline", {"export"}),
                                               ("layers", {"export", "pipeline"})])  # fmt: skip
def test_no_package_imports_one_downstream_of_it(package, forbidden):
    wrong = [(str(path), name) for path, name in imported_packages(package) if name in forbidden]
    assert not wrong, wrong


# `python -m pipeline.X`
COMMANDS = {"train", "translate", "evaluate", "score", "average", "distill", "backtranslate",
            "import_model"}  # fmt: skip
CORE, DATA, MODELS, DECODING = "core", "data", "model_types", "decoding"
# What each part of the project may import from `pipeline`: itself and what is upstream.
UPSTREAM = {
    "pipeline.core": {CORE},
    "pipeline.data": {CORE, DATA},
    "pipeline.model_types": {CORE, MODELS},
    "pipeline.decoding": {CORE, DATA, DECODING},
    "pipeline.config": {CORE, MODELS, DECODING},
    "pipeline.workdir": {CORE, DATA, MODELS, "config"},
    "pipeline.training": {CORE, DATA, MODELS, DECODING, "config", "workdir", "training"},
    "pipeline.pretrained": {CORE, DATA, MODELS, "config", "workdir", "pretrained"},
    "export": {CORE, DATA, MODELS, DECODING, "config", "workdir"},
}


def pipeline_imports(path):
    """The parts of `pipeline` (a sub-package or a top-level module) that `path` imports."""
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            modules = [node.module]
            if node.module == "pipeline":
                modules = [f"pipeline.{alias.name}" for alias in node.names]
        elif isinstance(node, ast.Import):
            modules = [alias.name for alias in node.names]
        else:
            continue
        for module in modules:
            parts = module.split(".")
            if parts[0] == "pipeline" and len(parts) > 1:
                yield parts[1]


def test_pipeline_sub_packages_import_only_upstream():
    top_level = {path.stem for path in (PROJECT_ROOT / "pipeline").glob("*.py")}
    assert top_level == COMMANDS | {"__init__", "config", "workdir"}
    wrong = []
    for part, allowed in UPSTREAM.items():
        folder = PROJECT_ROOT.joinpath(*part.split("."))
        paths = sorted(folder.rglob("*.py")) if folder.is_dir() else [folder.with_suffix(".py")]
        wrong += [(str(path.relative_to(PROJECT_ROOT)), imported) for path in paths
                  for imported in pipeline_imports(path) if imported not in allowed]  # fmt: skip
    assert not wrong, wrong


def test_the_commands_import_no_tensorflow_before_they_run():
    """TensorFlow's native start-up lines are dropped only when a command's `main` loads it
    (`pipeline.core.library_output.quiet_tensorflow_startup`): importing it before, in any
    module a command imports, lets them through to the user."""
    modules = [f"pipeline.{command}" for command in sorted(COMMANDS)] + ["export.__main__"]
    loaded = "sorted(m for m in ('tensorflow', 'keras') if m in sys.modules)"
    code = f"import sys, {', '.join(modules)}; print({loaded})"
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                            cwd=PROJECT_ROOT, timeout=120, check=True)  # fmt: skip
    assert result.stdout.strip() == "[]"


def test_training_reaches_the_exporter_through_its_entry_point():
    (hook,) = entry_points(group=AFTER_TRAINING_HOOKS)
    assert hook.value == "export.exporter:export_after_training"
    config = load_config(PROJECT_ROOT / "configs" / "default.yaml")
    assert [f.__name__ for f in after_training_hooks(config)] == ["export_after_training"]


def test_an_export_no_hook_would_run_is_refused_before_training(monkeypatch):
    monkeypatch.setattr("importlib.metadata.entry_points", lambda group: [])
    config = load_config(PROJECT_ROOT / "configs" / "default.yaml", ["export.after_training=true"])
    with pytest.raises(UserError, match="no exporter is registered"):
        after_training_hooks(config)


def test_the_onnx_translators_old_name_still_resolves():
    import export.runtime

    with pytest.warns(DeprecationWarning, match="OnnxTranslator"):
        assert export.runtime.Translator is export.runtime.OnnxTranslator


def test_every_command_module_runs_as_a_script():
    """A module whose docstring says `python -m pipeline.X` must run `main()` as `__main__`;
    without the guard, the command exits 0 having done nothing."""
    for path in sorted((PROJECT_ROOT / "pipeline").glob("*.py")):
        module = f"pipeline.{path.stem}"
        docstring = ast.get_docstring(ast.parse(path.read_text())) or ""
        if f"python -m {module}" in docstring:
            assert 'if __name__ == "__main__":' in path.read_text(), module
