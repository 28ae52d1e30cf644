"""The packages' dependencies run one way: config -> data -> model -> training -> search ->
export. `export` imports `pipeline`; `pipeline` and `layers` never import `export`, and `layers`
never imports `pipeline` (training reaches the exporter through an entry point)."""

import ast
from importlib.metadata import entry_points

import pytest

from pipeline.config import PROJECT_ROOT, load_config
from pipeline.errors import UserError
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
