"""Alert storms degrade gracefully (issue 24 item 7): a real Alertmanager flushing hundreds of groups at once into
the controller's webhook, with the API's connection cap set below the storm (100 connections, 400 groups: the
shape of 1,000 groups against the default cap of 1,000 with Alertmanager's retries and resolved notifications on
top). At 7710821 the connections past the cap were reset (RST) and the controller logged a traceback for each
request whose connection went away mid-body; Alertmanager's retries hid it.

Now connections past the cap wait for a slot and are answered late: no connection is reset, every group is
delivered, nothing is given up, and the controller's log holds no traceback. Below the cap nothing fails at all.
The real Controller (fake source and dispatcher) evaluates what the alerts trigger, as in production."""

from __future__ import annotations

import logging
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
from prometheus_client import CollectorRegistry

from tailguard.controller.adapters.stores.journal import Journal
from tailguard.controller.app.api import ControllerAPI
from tailguard.controller.core.model import SignalResult, target_key
from tailguard.controller.kit.clock import ManualClock
from tailguard.controller.loop.metrics import ControllerMetrics
from tailguard.controller.loop.runtime import Controller
from tailguard.controller.testing import FakeDispatcher, FakeSource
from tests.bench.bench_webhook import POLICY
from tests.support.alert_storm import run_storm

pytestmark = pytest.mark.integration


@dataclass
class Served:
    api: ControllerAPI
    controller: Controller


@pytest.fixture
def served(tmp_path: Path, request: pytest.FixtureRequest) -> Iterator[Served]:
    (tmp_path / "rules").mkdir()
    (tmp_path / "rules" / "checkout.yaml").write_text(POLICY, encoding="utf-8")
    controller = Controller(
        policy_paths=[tmp_path / "rules"],
        source=FakeSource(default=SignalResult({target_key({"service": "checkout"}): 0.95})),
        journal=Journal(tmp_path / "journal.db"),
        dispatcher=FakeDispatcher(),
        clock=ManualClock(),
        metrics=ControllerMetrics(CollectorRegistry()),
        schedule=False,
    )
    api = ControllerAPI(controller, "127.0.0.1", 0, max_connections=request.param)
    api.start()
    controller.start()
    try:
        yield Served(api, controller)
    finally:
        api.stop()
        controller.stop()


def no_tracebacks(caplog: pytest.LogCaptureFixture) -> list[str]:
    return [
        f"{record.name}: {record.getMessage()}"
        for record in caplog.records
        if record.exc_info is not None or record.levelno >= logging.ERROR
    ]


@pytest.mark.parametrize("served", [100], indirect=True)
def test_a_storm_past_the_connection_cap_resets_nothing_and_delivers_every_group(
    served: Served, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    with caplog.at_level(logging.WARNING):
        result = run_storm(served.api.url + "/api/v1/alerts", 400, tmp_path / "storm")
    print(f"\nstorm past the cap (100): {result.to_json()}")
    assert result.resets == 0, result
    assert result.delivered == 400 and result.failed_notifications == 0, result
    assert no_tracebacks(caplog) == []
    assert served.api.open_connections() <= 100


@pytest.mark.parametrize("served", [1000], indirect=True)
def test_a_storm_below_the_connection_cap_fails_no_request(
    served: Served, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    with caplog.at_level(logging.WARNING):
        result = run_storm(served.api.url + "/api/v1/alerts", 300, tmp_path / "storm")
    print(f"\nstorm below the cap (1000): {result.to_json()}")
    assert result.failed_requests == 0 and result.resets == 0 and result.closed == 0, result
    assert result.delivered == 300 and result.requests == 300, result
    assert no_tracebacks(caplog) == []
