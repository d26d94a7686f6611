"""Loading policy files with errors that point at file, line and field (controller/kit/located_yaml.py).

A file may hold several policy documents; each error names its file, line and field.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml
from pydantic import ValidationError

from tailguard.controller.core.policy import Policy, PolicyReferenceError
from tailguard.controller.kit.located_yaml import (
    MAX_FILE_BYTES,
    BoundedLoader,
    DuplicateKey,
    FileTooLarge,
    construct,
    field_path,
    line_for,
    read_bounded,
    yaml_problem,
)

POLICY_SUFFIXES = (".yaml", ".yml")


@dataclass(frozen=True)
class PolicyError:
    file: str
    line: int
    field: str
    message: str

    def __str__(self) -> str:
        where = f"{self.file}:{self.line}"
        return f"{where}: {self.field}: {self.message}" if self.field else f"{where}: {self.message}"


@dataclass(frozen=True)
class LoadedPolicy:
    policy: Policy
    file: str
    line: int
    # (signal name, line of its `query` field) for each query signal: where a refused query is reported.
    query_lines: tuple[tuple[str, int], ...] = ()

    def query_line(self, signal: str) -> int:
        """The line of `signal`'s query in `file` (the policy's own line when unknown)."""
        return dict(self.query_lines).get(signal, self.line)

    def query_field(self, signal: str) -> str:
        """`signals[i].query` for `signal`, as the policy file spells the field."""
        for index, candidate in enumerate(self.policy.signals):
            if candidate.name == signal:
                return f"signals[{index}].query"
        return "signals"


def _message(error: dict[str, Any]) -> str:
    kind = error["type"]
    if kind == "extra_forbidden":
        return "unknown field (not part of the policy schema)"
    if kind == "missing":
        return "required field is missing"
    if kind == "literal_error":
        return f"expected {error['ctx']['expected']}, got {error.get('input')!r}"
    if kind == "union_tag_invalid":
        return f"unknown action type {error['ctx']['tag']!r}; expected one of {error['ctx']['expected_tags']}"
    if kind == "union_tag_not_found":
        return "an action needs a 'type' (rollback, scale, shift_traffic, restore, annotate or notify)"
    message = str(error["msg"])
    for prefix in ("Value error, ", "Assertion failed, "):
        message = message.removeprefix(prefix)
    if "input" in error and kind not in ("value_error",) and not isinstance(error["input"], (dict, list)):
        message = f"{message}, got {error['input']!r}"
    return message


def parse_policy_text(text: str, file: str) -> tuple[list[LoadedPolicy], list[PolicyError]]:
    policies: list[LoadedPolicy] = []
    errors: list[PolicyError] = []
    if len(text) > MAX_FILE_BYTES:
        return [], [PolicyError(file, 1, "", f"refused: the file is larger than {MAX_FILE_BYTES:,} bytes")]
    # Bounded: aliases count at their expanded size, nesting and text values are limited (kit/located_yaml.py).
    loader = BoundedLoader(text)
    try:
        while loader.check_node():
            node = loader.get_node()
            if node is None:
                continue
            try:
                located = construct(node, loader)
            except DuplicateKey as duplicate:
                errors.append(PolicyError(file, duplicate.line, duplicate.key, "duplicate key"))
                continue
            if located.value is None:
                continue
            if not isinstance(located.value, dict):
                errors.append(PolicyError(file, located.line, "", "expected a mapping (a policy document)"))
                continue
            try:
                policy = Policy.model_validate(located.value)
            except ValidationError as invalid:
                for error in invalid.errors():
                    loc = tuple(error["loc"])
                    cause = error.get("ctx", {}).get("error")
                    if isinstance(cause, PolicyReferenceError):
                        loc = (*loc, *cause.loc)
                    errors.append(
                        PolicyError(file, line_for(located, loc), field_path(loc, located), _message(dict(error)))
                    )
                continue
            query_lines = tuple(
                (signal.name, line_for(located, ("signals", index, "query")))
                for index, signal in enumerate(policy.signals)
                if signal.query is not None
            )
            policies.append(LoadedPolicy(policy, file, located.line, query_lines))
    except yaml.YAMLError as bad_yaml:
        mark = getattr(bad_yaml, "problem_mark", None)
        line = mark.line + 1 if mark is not None else 1
        errors.append(PolicyError(file, line, "", yaml_problem(bad_yaml)))
    finally:
        loader.dispose()
    return policies, errors


def _hidden(relative: Path) -> bool:
    # A mounted ConfigMap holds each file twice: `name.yaml` (a link) and `..2026_11_30_…/name.yaml`
    # (the kubelet's timestamped copy). Hidden paths are never policies of their own.
    return any(part.startswith(".") for part in relative.parts)


def policy_paths(paths: Iterable[str | Path]) -> list[Path]:
    found: list[Path] = []
    for raw in paths:
        path = Path(raw)
        if path.is_dir():
            found.extend(
                sorted(
                    p
                    for p in path.rglob("*")
                    if p.suffix in POLICY_SUFFIXES and p.is_file() and not _hidden(p.relative_to(path))
                )
            )
        else:
            found.append(path)
    return found


def load_policies(paths: Iterable[str | Path]) -> tuple[list[LoadedPolicy], list[PolicyError]]:
    """Load every policy under `paths`. Returns all policies and all errors; callers decide what they mean."""
    policies: list[LoadedPolicy] = []
    errors: list[PolicyError] = []
    for path in policy_paths(paths):
        try:
            text = read_bounded(path)
        except FileTooLarge as too_large:
            errors.append(PolicyError(str(path), 1, "", str(too_large)))
            continue
        except (OSError, UnicodeDecodeError) as unreadable:
            errors.append(PolicyError(str(path), 1, "", f"cannot read policy file: {unreadable}"))
            continue
        file_policies, file_errors = parse_policy_text(text, str(path))
        policies.extend(file_policies)
        errors.extend(file_errors)
    seen: dict[str, LoadedPolicy] = {}
    for loaded in policies:
        first = seen.get(loaded.policy.name)
        if first is not None:
            errors.append(
                PolicyError(
                    loaded.file,
                    loaded.line,
                    "name",
                    f"policy name {loaded.policy.name!r} is already used at {first.file}:{first.line}",
                )
            )
        else:
            seen[loaded.policy.name] = loaded
    return policies, errors
