"""A configuration key's declaration (`Field`) and its check: the vocabulary of the config's
schema (`pipeline.config`) and of each model type's keys (`pipeline.model_types`)."""

import dataclasses
from typing import Any

from pipeline.core.errors import UserError


@dataclasses.dataclass(frozen=True)
class Field:
    """A key's type, default and allowed values, and its `meaning`: one line saying what the
    key does (lowercase start, no final period), shown in docs/configuration.md, which
    `tools/config_reference.py` generates from the declarations."""

    kind: type
    default: Any
    meaning: str
    choices: tuple = ()
    minimum: float | None = None
    maximum: float | None = None
    nullable: bool = False
    path: bool = False  # resolved against the directory of the config file

    def __post_init__(self):
        if not self.meaning.strip() or "\n" in self.meaning:
            raise ValueError(f"a configuration key needs a one-line meaning, got {self.meaning!r}")


def path_field(meaning, default=None):
    return Field(str, default, meaning, nullable=True, path=True)


def positive_int(default, meaning, nullable=False):
    return Field(int, default, meaning, minimum=1, nullable=nullable)


def rate(default, meaning, nullable=False):
    return Field(float, default, meaning, minimum=0.0, maximum=1.0, nullable=nullable)


def check_value(name, field, value, where):
    """`value` for the key `name` (as `field` declares it, a number read as text converted),
    or a `UserError` naming the key and `where`."""
    if value is None:
        if field.nullable:
            return None
        raise UserError(f"{where}: {name} must not be empty")
    kind = field.kind
    if kind is float and not isinstance(value, bool) and isinstance(value, (int, str)):
        try:  # YAML reads 1e-3 (no dot) as a string
            value = float(value)
        except ValueError:
            pass
    if kind is int and isinstance(value, bool) or not isinstance(value, kind):
        type_name = {
            int: "an integer", float: "a number", bool: "true or false", str: "a string",
            list: "a list", dict: "a mapping",
        }  # fmt: skip
        raise UserError(f"{where}: {name} must be {type_name[kind]}, got {value!r}")
    if field.choices and value not in field.choices:
        choices = ", ".join(map(str, field.choices))
        raise UserError(f"{where}: {name} must be one of {choices}; got {value!r}")
    if field.minimum is not None and value < field.minimum:
        raise UserError(f"{where}: {name} must be at least {field.minimum}, got {value!r}")
    if field.maximum is not None and value > field.maximum:
        raise UserError(f"{where}: {name} must be at most {field.maximum}, got {value!r}")
    return value
