"""Shared fixtures: a real Prometheus backfilled once per session with tests/support/scenarios.py."""

from __future__ import annotations

import shutil
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

# `tests.support` is imported by absolute name; with `.venv/bin/pytest` (no cwd on sys.path) and no
# tests/__init__.py the repository root must be put on the path explicitly.
_ROOT = str(Path(__file__).resolve().parent.parent)
if _ROOT not in sys.path:
    sys.path.insert(0, _ROOT)

from tests.support.scenarios import History, build_history


@dataclass(frozen=True)
class BackfilledPrometheus:
    url: str
    history: History


def _require_prometheus() -> None:
    if shutil.which("prometheus") is None or shutil.which("promtool") is None:
        pytest.fail("prometheus/promtool are not installed: apt-get install prometheus prometheus-alertmanager")


@pytest.fixture(scope="session")
def backfilled_prometheus(tmp_path_factory: pytest.TempPathFactory) -> Iterator[BackfilledPrometheus]:
    """Prometheus serving one hour of scenario history from promtool-created blocks (read-only use)."""
    _require_prometheus()
    from tailguard.serving.lab.promstack import PrometheusServer, backfill_openmetrics

    work: Path = tmp_path_factory.mktemp("prometheus")
    history = build_history()
    backfill_openmetrics(history.text, work / "data", expected_samples=history.samples)
    with PrometheusServer(data_dir=work / "data", workdir=work / "run").start() as server:
        yield BackfilledPrometheus(server.url, history)
