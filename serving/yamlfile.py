"""YAML files whose validation errors point at file, line and field.

The document is composed into nodes first so every value keeps its line;
Pydantic's error locations are mapped back onto those nodes. Duplicate keys,
which PyYAML would silently collapse, are errors too.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, TypeVar

import yaml
from pydantic import BaseModel, ValidationError

ModelT = TypeVar("ModelT", bound=BaseModel)


class ConfigFileError(ValueError):
    """A configuration file is unreadable or invalid; str() is `file:line: field: what was expected`."""

    def __init__(self, file: str, line: int, field: str, message: str):
        self.file = file
        self.line = line
        self.field = field
        self.message = message
        where = f"{file}:{line}"
        super().__init__(f"{where}: {field}: {message}" if field else f"{where}: {message}")


class _Node:
    def __init__(self, node: yaml.Node, value: Any, children: dict[Any, _Node]):
        self.node = node
        self.value = value
        self.children = children

    @property
    def line(self) -> int:
        return int(self.node.start_mark.line) + 1


def _construct(node: yaml.Node, loader: yaml.SafeLoader, file: str) -> _Node:
    if isinstance(node, yaml.MappingNode):
        loader.flatten_mapping(node)
        value: dict[Any, Any] = {}
        children: dict[Any, _Node] = {}
        for key_node, value_node in node.value:
            key = loader.construct_object(key_node, deep=True)
            if key in value:
                raise ConfigFileError(file, key_node.start_mark.line + 1, str(key), "duplicate key")
            child = _construct(value_node, loader, file)
            value[key] = child.value
            children[key] = child
        return _Node(node, value, children)
    if isinstance(node, yaml.SequenceNode):
        items = [_construct(item, loader, file) for item in node.value]
        return _Node(node, [item.value for item in items], dict(enumerate(items)))
    return _Node(node, loader.construct_object(node, deep=True), {})


def _message(error: Any) -> str:
    kind = error["type"]
    if kind == "extra_forbidden":
        return "unknown field"
    if kind == "missing":
        return "required field is missing"
    return f"{error['msg']} (got {error.get('input')!r})"


def _locate(root: _Node, loc: tuple[int | str, ...]) -> tuple[int, str]:
    current = root
    parts: list[str] = []
    for part in loc:
        child = current.children.get(part)
        parts.append(f"[{part}]" if isinstance(part, int) else ("." if parts else "") + str(part))
        if child is None:
            break
        current = child
    return current.line, "".join(parts)


def parse_yaml_text(text: str, file: str) -> tuple[Any, _Node | None]:
    loader = yaml.SafeLoader(text)
    try:
        node = loader.get_single_node()
        if node is None:
            return None, None
        root = _construct(node, loader, file)
    except yaml.MarkedYAMLError as exc:
        mark = exc.problem_mark or exc.context_mark
        line = mark.line + 1 if mark is not None else 1
        raise ConfigFileError(file, line, "", f"invalid YAML: {exc.problem or exc}") from None
    except yaml.YAMLError as exc:
        raise ConfigFileError(file, 1, "", f"invalid YAML: {exc}") from None
    finally:
        loader.dispose()
    return root.value, root


def validate(model: type[ModelT], data: Any, root: _Node | None, file: str) -> ModelT:
    """Validate `data` into `model`; the first error becomes a ConfigFileError naming its line."""
    try:
        return model.model_validate(data)
    except ValidationError as exc:
        first = exc.errors()[0]
        if root is None:
            raise ConfigFileError(file, 1, ".".join(map(str, first["loc"])), _message(first)) from None
        line, field = _locate(root, tuple(first["loc"]))
        raise ConfigFileError(file, line, field, _message(first)) from None


def load_yaml_model(model: type[ModelT], path: str | Path) -> ModelT:
    file = str(path)
    try:
        text = Path(path).read_text(encoding="utf-8")
    except OSError as exc:
        raise ConfigFileError(file, 0, "", f"cannot read file: {exc.strerror or exc}") from None
    data, root = parse_yaml_text(text, file)
    if not isinstance(data, dict):
        raise ConfigFileError(file, root.line if root else 1, "", "expected a YAML mapping at the top level")
    return validate(model, data, root, file)
