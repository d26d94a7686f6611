"""Where the Protocols live: the external ports in the core, one module per port family (controller/core/ports/),
the loop's own seams beside the loop (controller/loop/ports.py), the API's beside the API (controller/app/ports.py),
and three adapters' or tools' own seams beside their only users (listed below, with why). Nothing else defines one.

The kit's Clock is the one Protocol below the core (the kit's HTTP call waits through it); the ports package
re-exports it, so `from tailguard.controller.core.ports import Clock` finds it there too.
"""

from __future__ import annotations

import ast
from pathlib import Path

from tailguard.controller.core import ports
from tailguard.controller.kit import clock

ROOT = Path(__file__).resolve().parents[2]
CORE_PORTS = Path("controller/core/ports")
SEAMS = {Path("controller/loop/ports.py"), Path("controller/app/ports.py")}
# (file, Protocol): defined beside their one user, each for a reason
BESIDE_THEIR_USER = {
    (Path("controller/kit/clock.py"), "Clock"),  # below the core: the kit's HTTP call waits through it
    (Path("controller/adapters/annotations/grafana.py"), "GrafanaPort"),  # its HTTP answer type stays out of the core
    (Path("controller/adapters/metrics/grid.py"), "RangeGridSource"),  # answers numpy grids, kept out of the core
}


def _protocols(path: Path) -> list[str]:
    tree = ast.parse(path.read_text(encoding="utf-8"))
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.ClassDef):
            bases = {base.id if isinstance(base, ast.Name) else getattr(base, "attr", "") for base in node.bases}
            if "Protocol" in bases:
                found.append(node.name)
    return found


def test_every_protocol_is_in_a_ports_module() -> None:
    outside = [
        f"{path.relative_to(ROOT)}:{name}"
        for package in ("controller", "predictors")
        for path in sorted((ROOT / package).rglob("*.py"))
        for name in _protocols(path)
        if CORE_PORTS not in path.relative_to(ROOT).parents
        and path.relative_to(ROOT) not in SEAMS
        and (path.relative_to(ROOT), name) not in BESIDE_THEIR_USER
    ]
    assert outside == []


def test_the_core_ports_are_split_by_family() -> None:
    families = sorted(path.stem for path in (ROOT / CORE_PORTS).glob("*.py") if path.stem != "__init__")
    assert len(families) >= 10, families
    for path in (ROOT / CORE_PORTS).glob("*.py"):
        assert len(path.read_text(encoding="utf-8").splitlines()) < 200, path


def test_the_index_names_every_core_port() -> None:
    defined = {
        name for path in (ROOT / CORE_PORTS).glob("*.py") if path.stem != "__init__" for name in _protocols(path)
    }
    assert defined <= set(ports.__all__)


def test_the_kit_clock_is_re_exported_by_the_ports() -> None:
    assert ports.Clock is clock.Clock
    assert "RollbackPort" in _protocols(ROOT / CORE_PORTS / "rollback.py")
