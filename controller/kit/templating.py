"""Template substitution for PromQL queries and action parameters.

Queries: `{{ name }}` expands to a complete, escaped PromQL string literal
("value"), so a quote, backslash or newline in a label value can never change
the shape of the query. `{{ selector }}` expands to the policy's equality
matchers (`a="x",b="y"`) and `{{ by }}` to the target labels (`service,version`).

Actions: `{{ name }}` expands to the raw value (they are not PromQL).
"""

from __future__ import annotations

import re
from collections.abc import Mapping

TEMPLATE_VARIABLE = re.compile(r"\{\{\s*([A-Za-z_][A-Za-z0-9_]*)\s*\}\}")
LABEL_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")

SELECTOR_VARIABLE = "selector"
BY_VARIABLE = "by"
QUERY_BUILTINS = frozenset({SELECTOR_VARIABLE, BY_VARIABLE})


def promql_string(value: str) -> str:
    """A double-quoted PromQL string literal that denotes exactly `value`."""
    escaped = (
        value.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n").replace("\r", "\\r").replace("\t", "\\t")
    )
    return f'"{escaped}"'


def promql_selector(matchers: Mapping[str, str]) -> str:
    for name in matchers:
        if not LABEL_NAME.match(name):
            raise ValueError(f"invalid label name {name!r}")
    return ",".join(f"{name}={promql_string(value)}" for name, value in sorted(matchers.items()))


def variables_in(template: str) -> list[str]:
    return TEMPLATE_VARIABLE.findall(template)


def render_query(template: str, *, match: Mapping[str, str], group_by: list[str], variables: Mapping[str, str]) -> str:
    by = ",".join(group_by)
    selector = promql_selector(match)
    values = {**match, **variables}

    def substitute(found: re.Match[str]) -> str:
        name = found.group(1)
        if name == SELECTOR_VARIABLE:
            return selector
        if name == BY_VARIABLE:
            return by
        if name not in values:
            raise KeyError(name)
        return promql_string(values[name])

    return TEMPLATE_VARIABLE.sub(substitute, template)


def render_text(template: str, variables: Mapping[str, str]) -> str:
    def substitute(found: re.Match[str]) -> str:
        name = found.group(1)
        if name not in variables:
            raise KeyError(name)
        return variables[name]

    return TEMPLATE_VARIABLE.sub(substitute, template)
