"""Every Protocol of the controller and the predictors lives in controller/core/ports.py (one module to read).

The one exception is the kit's Clock (the kit sits below the core and its HTTP call waits through the clock);
ports.py re-exports it, so `from controller.core.ports import Clock` finds it there too.
"""

from __future__ import annotations

import ast
from pathlib import Path

from controller.core import ports
from controller.kit import clock

ROOT = Path(__file__).resolve().parents[2]
PORTS = Path("controller/core/ports.py")
KIT_CLOCK = (Path("controller/kit/clock.py"), "Clock")


def _protocols(path: Path) -> list[str]:
    tree = ast.parse(path.read_text(encoding="utf-8"))
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.ClassDef):
            bases = {base.id if isinstance(base, ast.Name) else getattr(base, "attr", "") for base in node.bases}
            if "Protocol" in bases:
                found.append(node.name)
    return found


def test_every_protocol_is_in_core_ports() -> None:
    outside = [
        f"{path.relative_to(ROOT)}:{name}"
        for package in ("controller", "predictors")
        for path in sorted((ROOT / package).rglob("*.py"))
        for name in _protocols(path)
        if path.relative_to(ROOT) != PORTS and (path.relative_to(ROOT), name) != KIT_CLOCK
    ]
    assert outside == []


def test_the_kit_clock_is_re_exported_by_the_ports() -> None:
    assert ports.Clock is clock.Clock
    assert "GrafanaPort" in _protocols(ROOT / PORTS)
