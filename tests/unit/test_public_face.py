"""The controller's public face (controller/__init__.py): every name it lists resolves to the object its home module
defines, the names the type checker and import-linter see (the TYPE_CHECKING imports) are the names it loads, and
it stays light: importing one module of the controller does not load the loop, the tools or the adapters."""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

import tailguard.controller.testing
from tailguard import controller
from tailguard.controller.loop.embedding import embed_loop
from tailguard.controller.tools.backtest import run_backtest

FACE = Path(controller.__file__)


def test_every_listed_name_is_its_home_modules_object() -> None:
    assert controller.embed_loop is embed_loop
    assert controller.run_backtest is run_backtest
    assert tailguard.controller.testing is tailguard.controller.testing
    for name in controller.__all__:
        assert getattr(controller, name) is not None, name


def test_an_unknown_name_is_an_attribute_error() -> None:
    try:
        controller.no_such_name  # type: ignore[attr-defined]  # noqa: B018
    except AttributeError as missing:
        assert "no_such_name" in str(missing)
    else:
        raise AssertionError("controller.no_such_name resolved")


def test_the_type_checked_imports_are_the_loaded_names() -> None:
    tree = ast.parse(FACE.read_text())
    checked: dict[str, str] = {}
    for node in ast.walk(tree):
        if isinstance(node, ast.If) and isinstance(node.test, ast.Name) and node.test.id == "TYPE_CHECKING":
            for statement in node.body:
                assert isinstance(statement, ast.ImportFrom) and statement.module is not None
                for alias in statement.names:
                    checked[alias.name] = statement.module
    homes = {name: f"tailguard.controller{home}" for name, home in controller._HOMES.items()}
    homes.update({name: "tailguard.controller" for name in controller._MODULES})
    assert checked == homes
    assert sorted(controller.__all__) == sorted(homes)


def test_one_module_of_the_controller_does_not_load_the_face() -> None:
    # a fresh interpreter: what `import tailguard.controller.kit.errors` (the predictors, the serving tier) loads
    code = (
        "import sys, tailguard.controller.kit.errors; "
        "print(sorted(m for m in sys.modules if m.startswith(('tailguard.controller.loop', "
        "'tailguard.controller.tools', 'tailguard.controller.adapters'))))"
    )
    loaded = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60, check=True)
    assert loaded.stdout.strip() == "[]"


def test_the_app_through_the_face_after_the_predictors_no_circle() -> None:
    # the predictors import the controller's kit first; the face's build (the app, which imports the predictors)
    # loads only when asked for, so neither import order meets a partly initialised module
    code = (
        "import tailguard.predictors.serving; from tailguard import controller; "
        "print(controller.build.__module__, controller.run_backtest.__name__)"
    )
    loaded = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, check=True)
    assert loaded.stdout.split() == ["tailguard.controller.app.build", "run_backtest"]
