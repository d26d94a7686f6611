"""The optional extras of the package (pyproject.toml [project.optional-dependencies]) and the one sentence that
names the missing one.

`tailguard run` starts without an extra when the configuration has no section that needs it; a section that needs
a missing one is a ConfigError (exit 2) naming the extra to install. Whether an extra is installed is asked of the
import system (`importlib.util.find_spec`), which imports nothing.
"""

from __future__ import annotations

import importlib.util
from dataclasses import dataclass

from tailguard.controller.kit.errors import ConfigError


@dataclass(frozen=True)
class Extra:
    name: str
    modules: tuple[str, ...]  # the top-level import names it brings

    def install_hint(self) -> str:
        return f"pip install 'tailguard[{self.name}]'"


CLUSTER = Extra("cluster", ("kubernetes", "grafana_client"))
ML = Extra("ml", ("sklearn", "skops", "threadpoolctl"))


def _installed(module: str) -> bool:
    try:
        return importlib.util.find_spec(module) is not None
    except (ImportError, ValueError):  # a broken or blocked install counts as missing
        return False


def missing_modules(extra: Extra) -> list[str]:
    return [module for module in extra.modules if not _installed(module)]


def require(extra: Extra, needed_by: str) -> None:
    """ConfigError (one sentence) when `extra` is not installed; `needed_by` names the section that needs it."""
    missing = missing_modules(extra)
    if missing:
        raise ConfigError(
            f"{needed_by} needs the {extra.name} extra ({', '.join(missing)} not installed): {extra.install_hint()}"
        )


def missing_extra_message(error: ModuleNotFoundError, extra: Extra, needed_by: str) -> str | None:
    """The sentence for a ModuleNotFoundError of one of `extra`'s modules; None for any other missing module."""
    top = (error.name or "").split(".")[0]
    if top not in extra.modules:
        return None
    return f"{needed_by} needs the {extra.name} extra ({top} not installed): {extra.install_hint()}"
