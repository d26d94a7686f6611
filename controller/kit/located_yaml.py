"""YAML composed into nodes that keep their lines, so validation errors can name file, line and field.

PyYAML's plain `safe_load` forgets where each value came from and silently keeps the last of two
duplicate keys. Composing the document into nodes first keeps every value's line; Pydantic's error
locations (`loc`) are then mapped back onto those nodes. Used by the policy loader and by the
serving tier's profile and calibration files (serving/tier/yamlfile.py).

Inputs are bounded (`BoundedLoader`, `read_bounded`): a file is at most MAX_FILE_BYTES (1 MiB, the most a
Kubernetes ConfigMap holds), a document at most MAX_NODES nodes counted AFTER alias expansion (a 500-byte "billion
laughs" alias bomb expands to hundreds of millions), nested at most MAX_DEPTH levels (also after expansion), and
one text value at most MAX_TEXT characters. Each limit is checked while the document is composed, before anything
is expanded, and is a `YamlLimitError` (a yaml.MarkedYAMLError: its line is where the limit was passed), so every
loader reports it as file:line: like any other YAML error. Aliases within the limits keep working.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import yaml

from tailguard.controller.kit.errors import ConfigError

MAX_FILE_BYTES = 1024 * 1024  # a ConfigMap holds at most 1 MiB
MAX_NODES = 100_000  # per document, after alias expansion (a policy is a few hundred)
MAX_DEPTH = 64  # nesting levels per document, after alias expansion (a policy needs fewer than 10)
MAX_TEXT = 16_384  # characters in one scalar (a description, a query, a message template)


class YamlLimitError(yaml.MarkedYAMLError, ConfigError):
    """A YAML input passes one of the limits above; `problem_mark` is where (loaders report file:line:)."""

    def __init__(self, problem: str, mark: yaml.Mark | None):
        super().__init__(problem=problem, problem_mark=mark)


class BoundedLoader(yaml.SafeLoader):
    """A SafeLoader that refuses, while composing, documents past MAX_NODES/MAX_DEPTH/MAX_TEXT.

    Aliases are counted at their expanded size (memoised per anchored node), so the count is what `construct`
    and any later validation would walk; composing itself is linear in the file, so the check costs nothing
    like the expansion it prevents.
    """

    def __init__(
        self,
        stream: str,
        *,
        max_nodes: int = MAX_NODES,
        max_depth: int = MAX_DEPTH,
        max_text: int = MAX_TEXT,
    ) -> None:
        super().__init__(stream)
        self.max_nodes = max_nodes
        self.max_depth = max_depth
        self.max_text = max_text
        self._nodes = 0  # expanded nodes of the current document so far
        self._depth = 0  # depth of the node being composed (the root is 1)
        self._deepest = 0  # deepest level reached under the node being composed (expanded)
        self._sizes: dict[int, tuple[int, int]] = {}  # id(node) -> (expanded nodes, expanded height)

    def compose_document(self) -> yaml.Node | None:
        self._nodes, self._depth, self._deepest, self._sizes = 0, 0, 0, {}
        try:
            return super().compose_document()
        finally:
            self._sizes = {}

    def _count(self, nodes: int, deepest: int, mark: yaml.Mark) -> None:
        self._nodes += nodes
        self._deepest = max(self._deepest, deepest)
        if self._nodes > self.max_nodes:
            raise YamlLimitError(
                f"refused: the document has more than {self.max_nodes:,} nodes once its aliases are expanded "
                "(an alias bomb?)",
                mark,
            )
        if deepest > self.max_depth:
            raise YamlLimitError(f"refused: nesting deeper than {self.max_depth} levels", mark)

    def compose_node(self, parent: yaml.Node | None, index: Any) -> yaml.Node | None:
        if self.check_event(yaml.AliasEvent):
            mark = self.peek_event().start_mark  # type: ignore[no-untyped-call]
            node = super().compose_node(parent, index)
            size, height = self._sizes.get(id(node), (1, 1))
            self._count(size, self._depth + height, mark)
            return node
        mark = self.peek_event().start_mark  # type: ignore[no-untyped-call]
        self._depth += 1
        before, outer_deepest = self._nodes, self._deepest
        self._deepest = self._depth
        try:
            self._count(1, self._depth, mark)
            node = super().compose_node(parent, index)
            if isinstance(node, yaml.ScalarNode) and len(node.value) > self.max_text:
                raise YamlLimitError(
                    f"refused: a text value of {len(node.value):,} characters (the limit is {self.max_text:,})",
                    mark,
                )
            self._sizes[id(node)] = (self._nodes - before, self._deepest - self._depth + 1)
        finally:
            self._deepest = max(outer_deepest, self._deepest)
            self._depth -= 1
        return node


class FileTooLarge(ConfigError):
    """A YAML input file is larger than the limit; the message says so (callers add file:1:)."""


def read_bounded(path: str | Path, limit: int = MAX_FILE_BYTES) -> str:
    """The UTF-8 text of `path`, refusing (FileTooLarge) a file larger than `limit` bytes without reading it all.

    OSError and UnicodeDecodeError pass through, as from Path.read_text."""
    with open(path, "rb") as handle:
        data = handle.read(limit + 1)
    if len(data) > limit:
        raise FileTooLarge(f"refused: the file is larger than {limit:,} bytes (the limit of a tailguard YAML file)")
    return data.decode("utf-8")


def yaml_problem(error: yaml.YAMLError) -> str:
    """What to tell the user about `error`: a refused limit as it is, anything else as invalid YAML."""
    problem = getattr(error, "problem", None) or str(error)
    return str(problem) if isinstance(error, YamlLimitError) else f"invalid YAML: {problem}"


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
