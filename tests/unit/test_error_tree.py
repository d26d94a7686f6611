"""One error tree (controller/kit/errors.py): every exception class the project defines derives from
TailguardError, except ShutdownInterrupt, a BaseException by design (no `except Exception` may swallow a shutdown).
"""

from __future__ import annotations

import importlib
import inspect
import pkgutil

from tailguard.controller.kit.cli_args import UsageError
from tailguard.controller.kit.errors import ConfigError, TailguardError
from tailguard.controller.kit.located_yaml import DuplicateKey

OUTSIDE_BY_DESIGN = {"tailguard.controller.kit.clock.ShutdownInterrupt"}


def _project_exceptions() -> dict[str, type[BaseException]]:
    found: dict[str, type[BaseException]] = {}
    for package in ("tailguard.controller", "tailguard.predictors", "tailguard.serving"):
        root = importlib.import_module(package)
        for info in pkgutil.walk_packages(root.__path__, f"{package}."):
            if info.name.endswith("__main__"):
                continue
            module = importlib.import_module(info.name)
            for name, value in vars(module).items():
                if inspect.isclass(value) and issubclass(value, BaseException) and value.__module__ == info.name:
                    found[f"{info.name}.{name}"] = value
    return found


def test_every_exception_class_is_in_the_tree() -> None:
    found = _project_exceptions()
    assert len(found) > 40
    outside = {name for name, error in found.items() if not issubclass(error, TailguardError)}
    assert outside == OUTSIDE_BY_DESIGN


def test_the_kit_errors_are_config_errors() -> None:
    assert issubclass(UsageError, ConfigError) and issubclass(UsageError, ValueError)
    assert issubclass(DuplicateKey, ConfigError)
