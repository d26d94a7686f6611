"""YAML files of the serving tier (profiles, calibrations, tier files) whose errors name file, line and field.

One document per file, validated into a Pydantic model; the line lookup is controller/kit/located_yaml.py,
shared with the policy loader.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, TypeVar

import yaml
from pydantic import BaseModel, ValidationError

from tailguard.controller import (
    BoundedLoader,
    ConfigError,
    DuplicateKey,
    FileTooLarge,
    Located,
    construct,
    field_path,
    line_for,
    read_bounded,
    yaml_problem,
)

ModelT = TypeVar("ModelT", bound=BaseModel)


class ConfigFileError(ConfigError, ValueError):
    """A configuration file is unreadable or invalid; str() is `file:line: field: what was expected`."""

    def __init__(self, file: str, line: int, field: str, message: str):
        self.file = file
        self.line = line
        self.field = field
        self.message = message
        where = f"{file}:{line}"
        super().__init__(f"{where}: {field}: {message}" if field else f"{where}: {message}")


def _message(error: Any) -> str:
    kind = error["type"]
    if kind == "extra_forbidden":
        return "unknown field"
    if kind == "missing":
        return "required field is missing"
    return f"{error['msg']} (got {error.get('input')!r})"


def parse_yaml_text(text: str, file: str) -> tuple[Any, Located | None]:
    loader = BoundedLoader(text)  # aliases, nesting and text values bounded (controller/kit/located_yaml.py)
    try:
        node = loader.get_single_node()
        if node is None:
            return None, None
        root = construct(node, loader)
    except DuplicateKey as duplicate:
        raise ConfigFileError(file, duplicate.line, duplicate.key, "duplicate key") from None
    except yaml.MarkedYAMLError as exc:
        mark = exc.problem_mark or exc.context_mark
        line = mark.line + 1 if mark is not None else 1
        raise ConfigFileError(file, line, "", yaml_problem(exc)) from None
    except yaml.YAMLError as exc:
        raise ConfigFileError(file, 1, "", f"invalid YAML: {exc}") from None
    finally:
        loader.dispose()
    return root.value, root


def validate(model: type[ModelT], data: Any, root: Located | None, file: str) -> ModelT:
    """Validate `data` into `model`; the first error becomes a ConfigFileError naming its line."""
    try:
        return model.model_validate(data)
    except ValidationError as exc:
        first = exc.errors()[0]
        if root is None:
            raise ConfigFileError(file, 1, ".".join(map(str, first["loc"])), _message(first)) from None
        loc = tuple(first["loc"])
        raise ConfigFileError(file, line_for(root, loc), field_path(loc, root), _message(first)) from None


def load_yaml_model(model: type[ModelT], path: str | Path) -> ModelT:
    file = str(path)
    try:
        text = read_bounded(path)
    except FileTooLarge as too_large:
        raise ConfigFileError(file, 1, "", str(too_large)) from None
    except OSError as exc:
        raise ConfigFileError(file, 0, "", f"cannot read file: {exc.strerror or exc}") from None
    data, root = parse_yaml_text(text, file)
    if not isinstance(data, dict):
        raise ConfigFileError(file, root.line if root else 1, "", "expected a YAML mapping at the top level")
    return validate(model, data, root, file)
