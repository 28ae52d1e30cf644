"""The documentation cannot drift from the code: the site builds in MkDocs' strict mode (a
broken link or a page outside the navigation fails), every Python block of the docs and the
README runs on the smoke models, every configuration block validates, and every flag a
`python -m` command line shows exists."""

import json
import os
import re
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import yaml

from pipeline.config import PROJECT_ROOT, SCHEMA, load_config

DOCUMENTS = sorted((PROJECT_ROOT / "docs").glob("*.md")) + [PROJECT_ROOT / "README.md"]
FENCE = re.compile(r"^( *)```(\w*)[^\n]*\n(.*?)^\1```", re.M | re.S)
SECTIONS = set(SCHEMA) | {"model"}


def blocks(language):
    """Each fenced block in `language` (indented ones, as in tabs, included), as a pytest
    parameter named after its document and place."""
    found = []
    for path in DOCUMENTS:
        for number, match in enumerate(FENCE.finditer(path.read_text(encoding="utf-8"))):
            if match.group(2) == language:
                text = textwrap.dedent(match.group(3))
                found.append(pytest.param(text, id=f"{path.name}-{number}"))
    return found


def test_the_site_builds_in_strict_mode(tmp_path):
    command = [sys.executable, "-m", "mkdocs", "build", "--strict", "--site-dir",
               str(tmp_path / "site")]  # fmt: skip
    environment = {**os.environ, "NO_MKDOCS_2_WARNING": "1"}  # Material's banner
    result = subprocess.run(command, cwd=PROJECT_ROOT, capture_output=True, text=True,
                            timeout=600, env=environment)  # fmt: skip
    assert result.returncode == 0, result.stderr[-4000:]


CONFIG_BLOCKS = [b for b in blocks("yaml") if set(yaml.safe_load(b.values[0]) or {}) <= SECTIONS]


@pytest.mark.parametrize("text", CONFIG_BLOCKS)
def test_every_configuration_block_validates(text, tmp_path):
    path = tmp_path / "experiment.yaml"
    path.write_text(text, encoding="utf-8")
    load_config(path)


@pytest.fixture(scope="module")
def workdirs(exported_workdir, exported_transformer_workdir, tmp_path_factory):
    """What the docs' paths name, on the smoke models: runs/default (a trained, exported
    recurrent model), runs/transformer/export (a Transformer's, with CTranslate2) and
    runs/nllb/export (the small NLLB test checkpoint imported, for CTranslate2)."""
    from export import __main__ as export_command
    from pipeline import import_model

    ctranslate2_export = tmp_path_factory.mktemp("transformer_export")
    nllb = tmp_path_factory.mktemp("nllb") / "imported"
    export_command.main(["--workdir", str(exported_transformer_workdir), "--output",
                         str(ctranslate2_export), "--formats", "ctranslate2"])  # fmt: skip
    import_model.main([str(PROJECT_ROOT / "tests" / "fixtures" / "hf_m2m" / "nllb"), "--workdir",
                       str(nllb)])  # fmt: skip
    export_command.main(["--workdir", str(nllb), "--formats", "ctranslate2"])
    return {"runs/transformer/export": str(ctranslate2_export),
            "runs/nllb/export": str(nllb / "export"),
            "runs/default": str(exported_workdir)}  # fmt: skip


# Runs each block in a namespace of its own, in one process (TensorFlow loads once); prints
# the name and the last line of the error of each block that fails.
BLOCK_RUNNER = """
import json, sys, traceback
failed = 0
for name, text in json.load(open(sys.argv[1], encoding="utf-8")):
    try:
        exec(compile(text, name, "exec"), {"__name__": "__main__"})
    except BaseException:
        failed += 1
        print(f"{name}: {traceback.format_exc().strip().splitlines()[-1]}", flush=True)
sys.exit(1 if failed else 0)
"""


def test_every_python_block_runs(workdirs, tmp_path):
    named = []
    for param in blocks("python"):
        text = param.values[0]
        for path_in_docs, path in workdirs.items():
            text = text.replace(path_in_docs, path)
        named.append((param.id, text))
    assert len(named) >= 6
    (tmp_path / "blocks.json").write_text(json.dumps(named), encoding="utf-8")
    result = subprocess.run([sys.executable, "-c", BLOCK_RUNNER, str(tmp_path / "blocks.json")],
                            cwd=tmp_path, capture_output=True, text=True, timeout=900)  # fmt: skip
    assert result.returncode == 0, result.stdout[-4000:] + result.stderr[-2000:]


def command_lines():
    """Each `python -m MODULE ...` line of the bash blocks (continuation lines joined)."""
    lines = []
    for param in blocks("bash"):
        text = re.sub(r"\\\n\s*|\n(?=[ \t])", " ", param.values[0])
        for line in text.splitlines():
            match = re.search(r"python -m ((?:pipeline|export)[\w.]*)(.*)", line)
            if match:
                lines.append((match.group(1), match.group(2)))
    return lines


# Prints `{module: its --help text}` as JSON for the modules named in argv, each run as
# `python -m MODULE --help` would run it, in one process (TensorFlow loads once).
HELP_RUNNER = """
import contextlib, io, json, runpy, sys
helps = {}
for module in sys.argv[1:]:
    sys.argv, text = [module, "--help"], io.StringIO()
    with contextlib.redirect_stdout(text), contextlib.suppress(SystemExit):
        runpy.run_module(module, run_name="__main__", alter_sys=True)
    helps[module] = text.getvalue()
print(json.dumps(helps))
"""


def test_every_flag_of_a_command_line_exists():
    lines = command_lines()
    modules = sorted({module for module, _ in lines})
    result = subprocess.run([sys.executable, "-c", HELP_RUNNER, *modules], cwd=PROJECT_ROOT,
                            capture_output=True, text=True, timeout=600, check=True)  # fmt: skip
    helps = json.loads(result.stdout.splitlines()[-1])
    unknown = [
        f"python -m {module} {flag}"
        for module, arguments in lines
        for flag in re.findall(r"(?<![\w-])--[a-z][a-z0-9-]*", arguments)
        if not re.search(rf"{re.escape(flag)}\b(?!-)", helps[module])
    ]
    assert len(helps) >= 6 and all("usage:" in text for text in helps.values()), helps
    assert not unknown, unknown


def test_the_readme_is_short_and_links_pages_that_exist():
    readme = (PROJECT_ROOT / "README.md").read_text(encoding="utf-8")
    assert len(readme.splitlines()) <= 170
    for target in re.findall(r"\]\((docs/[^)#]+)", readme):
        assert Path(PROJECT_ROOT, target).is_file(), target
