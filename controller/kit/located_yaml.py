"""YAML composed into nodes that keep their lines, so validation errors can name file, line and field.

PyYAML's plain `safe_load` forgets where each value came from and silently keeps the last of two
duplicate keys. Composing the document into nodes first keeps every value's line; Pydantic's error
locations (`loc`) are then mapped back onto those nodes. Used by the policy loader and by the
serving tier's profile and calibration files (serving/yamlfile.py).
"""

from __future__ import annotations

from typing import Any

import yaml

from controller.kit.errors import ConfigError


class Located:
    """A plain Python value with the YAML node it came from (for line lookups)."""

    def __init__(self, node: yaml.Node, value: Any, children: dict[Any, Located]):
        self.node = node
        self.value = value
        self.children = children

    @property
    def line(self) -> int:
        return int(self.node.start_mark.line) + 1


class DuplicateKey(ConfigError):
    """A mapping repeats a key; `key` is its full path (conditions[0].noData), `line` the repeat's line.

    The policy and settings loaders turn it into their own located ConfigErrors (file:line: field: message).
    """

    def __init__(self, key: str, line: int):
        super().__init__(key)
        self.key = key
        self.line = line


def _join(path: str, part: Any) -> str:
    if isinstance(part, int):
        return f"{path}[{part}]"
    return f"{path}.{part}" if path else str(part)


def construct(node: yaml.Node, loader: yaml.SafeLoader, path: str = "") -> Located:
    """The value of `node` (composed by `loader`) with every child's node; DuplicateKey on a repeated key."""
    if isinstance(node, yaml.MappingNode):
        loader.flatten_mapping(node)
        value: dict[Any, Any] = {}
        children: dict[Any, Located] = {}
        for key_node, value_node in node.value:
            key = loader.construct_object(key_node, deep=True)
            if key in value:
                raise DuplicateKey(_join(path, key), key_node.start_mark.line + 1)
            child = construct(value_node, loader, _join(path, key))
            value[key] = child.value
            children[key] = child
        return Located(node, value, children)
    if isinstance(node, yaml.SequenceNode):
        items = [construct(item, loader, _join(path, index)) for index, item in enumerate(node.value)]
        return Located(node, [item.value for item in items], dict(enumerate(items)))
    return Located(node, loader.construct_object(node, deep=True), {})


def line_for(root: Located, loc: tuple[int | str, ...]) -> int:
    """The line of the deepest node the error location reaches (union tags in `loc` are skipped)."""
    current = root
    for part in loc:
        child = current.children.get(part)
        if child is None and isinstance(part, str) and part.endswith("_"):
            child = current.children.get(part.rstrip("_"))
        if child is not None:
            current = child
    return current.line


def field_path(loc: tuple[int | str, ...], root: Located) -> str:
    """`loc` as the user wrote it: `conditions[0].for`, without discriminated-union tags or alias underscores."""
    parts: list[str] = []
    current: Located | None = root
    for part in loc:
        child = current.children.get(part) if current is not None else None
        if child is None and isinstance(part, str) and part.endswith("_") and current is not None:
            child = current.children.get(part.rstrip("_"))
            part = part.rstrip("_")
        if (
            child is None
            and isinstance(part, str)
            and current is not None
            and isinstance(current.value, dict)
            and current.value.get("type") == part
        ):
            continue  # a discriminated-union tag such as 'scale', not a key in the file
        if isinstance(part, int):
            parts.append(f"[{part}]")
        else:
            parts.append(("." if parts else "") + str(part).rstrip("_"))
        current = child
    return "".join(parts)
