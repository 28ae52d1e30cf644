"""Prints docs/configuration.md, the configuration reference: every key of each section of the
configuration (`pipeline.config.SCHEMA`, and each model type's keys in `pipeline.model_types`)
with its type, default, allowed values and meaning, as declared there.

    python tools/config_reference.py            # prints the page
    python tools/config_reference.py --write    # writes docs/configuration.md
    python tools/config_reference.py --check    # exits 1 where docs/configuration.md differs

No TensorFlow is imported: the declarations are plain Python.
"""

import argparse
import sys
from pathlib import Path

import yaml

PROJECT_ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(PROJECT_ROOT))

from pipeline.config import CORPUS_FIELDS, SCHEMA  # noqa: E402
from pipeline.core.atomic_files import write_text_atomically  # noqa: E402
from pipeline.model_types import (  # noqa: E402
    COMMON_KEYS,
    DEFAULT_MODEL_TYPE,
    MODEL_TYPES,
    model_keys,
)

PAGE_NAME = "docs/configuration.md"
PAGE = PROJECT_ROOT / PAGE_NAME
COMMAND = "python tools/config_reference.py --write"
TYPE_NAMES = {
    int: "integer",
    float: "number",
    bool: "true or false",
    str: "string",
    list: "list",
    dict: "mapping",
}
HEADER = "| key | type | default | allowed | meaning |\n|---|---|---|---|---|"

INTRO = f"""\
# Configuration reference

One YAML file describes an experiment, in the sections below; a section or key it leaves out
takes its default. Each layer overrides the one before: the defaults listed here, the YAML file
(`python -m pipeline.train --config FILE`), then the `--set section.key=value` overrides of the
command line, repeatable, each value read as YAML (`--set train.epochs=3`,
`--set train.clip_norm=null`). Loading refuses an unknown key, a key of another model type, a
value of the wrong type or out of range, naming the key and the file. Relative paths resolve
against the directory of the configuration file (those given with `--set`, against the current
directory).

The shipped recipes are in `configs/`: `default.yaml` is used without `--config`,
which also takes a recipe's name (`--config multi30k_de_en_transformer`). Training saves the
resolved configuration, paths made absolute, as `config.yaml` in the work directory, where the
other commands read it.

Generated from the declarations (`pipeline/config.py`, `pipeline/model_types/`,
`pipeline/decoding/search_options.py`) by `{COMMAND}`: edit
those, not this page.
"""

NOTES = {
    "data": "Training data is `train_source` and `train_target`, or `train_tsv`, or "
    "`train_corpora`; validation and test data are optional.",
    "model": "`model.type` decides which keys the section holds: the shared keys below, and the "
    "keys of that type only (a key of another type is refused).",
    "decode": "A trained model's decoding settings: the defaults of `pipeline.translate`, "
    "`pipeline.evaluate` and `pipeline.score`, whose flags override them for one run, and of "
    "its exports.",
    "distribute": "How training is spread over devices (`python -m pipeline.train --strategy` "
    "overrides `strategy`).",
    "export": "How a trained model is exported, at the end of training (`after_training`) or "
    "by `python -m export`, which reads these keys from the work directory's `config.yaml` but "
    "takes its formats from `--formats`.",
}


def yaml_value(value):
    """`value` as YAML writes it (`null`, `true`, `0.001`, `saved_model,onnx`)."""
    return yaml.safe_dump(value, default_flow_style=True).removesuffix("\n...\n").strip()


def number(value):
    return f"{value:g}"


def kind_name(field):
    return "path" if field.path else TYPE_NAMES[field.kind]


def allowed(field):
    """The choices, or the range, of `field`; "or null" where null is allowed."""
    if field.choices:
        text = ", ".join(map(str, field.choices))
    elif field.minimum is not None and field.maximum is not None:
        text = f"{number(field.minimum)} – {number(field.maximum)}"
    elif field.minimum is not None:
        text = f">= {number(field.minimum)}"
    elif field.maximum is not None:
        text = f"<= {number(field.maximum)}"
    elif field.kind is bool:
        text = "true, false"
    else:  # any value of its type, or one that its meaning describes
        return "any or null" if field.nullable else "—"
    return f"{text} or null" if field.nullable else text


def markdown_text(text):
    """`text` taken literally in Markdown (GitHub's and MkDocs'): `<TAB>` no HTML tag, `*` no
    emphasis, `|` no table column."""
    for character, literal in (("<", "&lt;"), ("*", "\\*"), ("|", "\\|")):
        text = text.replace(character, literal)
    return text


def table(fields):
    rows = [
        f"| `{key}` | {kind_name(field)} | `{yaml_value(field.default)}` | "
        f"{markdown_text(allowed(field))} | {markdown_text(field.meaning)} |"
        for key, field in fields.items()
    ]
    return "\n".join([HEADER, *rows])


def section(name, fields):
    parts = [f"## {name}"]
    if name in NOTES:
        parts.append(NOTES[name])
    parts.append(table(fields))
    if name == "data":
        entries = "\n".join(f"- `{key}`: {markdown_text(field.meaning)}"
                             for key, field in CORPUS_FIELDS.items())  # fmt: skip
        parts.append(f"Each entry of `train_corpora` takes:\n\n{entries}")
    return "\n\n".join(parts)


def model_section():
    shared = {"type": model_keys(DEFAULT_MODEL_TYPE)["type"], **COMMON_KEYS}
    parts = [f"## model\n\n{NOTES['model']}", f"### Every model type\n\n{table(shared)}"]
    for name, model_type in MODEL_TYPES.items():
        parts.append(f"### `type: {name}`\n\n{table(model_type.keys)}")
        if model_type.derived:
            entries = "\n".join(f"- `{key}`: {markdown_text(derived.meaning)}"
                                 for key, derived in model_type.derived.items())  # fmt: skip
            parts.append(
                "Properties of the model that other keys state (in model.json's "
                f"`description.properties` with the keys above):\n\n{entries}"
            )
    return "\n\n".join(parts)


def page():
    """docs/configuration.md as the declarations say it."""
    sections = []
    for name, fields in SCHEMA.items():
        sections.append(section(name, fields))
        if name == "data":
            sections.append(model_section())
    return "\n\n".join([INTRO.rstrip("\n"), *sections]) + "\n"


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    action = parser.add_mutually_exclusive_group()
    action.add_argument("--write", action="store_true", help=f"write {PAGE_NAME}")
    action.add_argument("--check", action="store_true", help="exit 1 where the page differs")
    args = parser.parse_args(argv)
    text = page()
    if args.write:
        PAGE.parent.mkdir(exist_ok=True)
        write_text_atomically(PAGE, text)
        print(f"Wrote {PAGE_NAME}")
    elif args.check:
        current = PAGE.read_text(encoding="utf-8") if PAGE.is_file() else None
        if current != text:
            print(f"{PAGE_NAME} is out of date: run {COMMAND}", file=sys.stderr)
            return 1
    else:
        sys.stdout.write(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
