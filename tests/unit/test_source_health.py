"""Say when blind (issue 24, item 1): a per-source health model fed by every evaluation (up / degraded / blind,
since when, the last error, the policies affected), in /metrics, first on the status page and in `tailguard
status` (its exit code), logged at WARNING once per transition; never a breach; readiness stays "serves its API"."""

from __future__ import annotations

import logging
import socket
from pathlib import Path
from typing import Any

import pytest
from prometheus_client import CollectorRegistry

from tailguard.controller.adapters.metrics.prometheus import PrometheusSettings, PrometheusSource
from tailguard.controller.adapters.stores.journal import Journal
from tailguard.controller.app.api import ControllerAPI
from tailguard.controller.app.operate import EXIT_BLIND, EXIT_DEGRADED, EXIT_OK, format_status, health_exit, status_main
from tailguard.controller.app.status_page import render_status_page
from tailguard.controller.core.model import SignalResult, target_key
from tailguard.controller.core.source_health import (
    PROMETHEUS,
    SourceHealth,
    SourceReading,
    SourceStatus,
    keep_policies,
    record,
)
from tailguard.controller.kit.clock import ManualClock, SystemClock
from tailguard.controller.loop.metrics import ControllerMetrics
from tailguard.controller.loop.runtime import Controller
from tailguard.controller.testing import FakeDispatcher, FakeLeader
from tests.unit.test_runtime import policy_yaml

T0 = 1_767_362_520.0  # 2026-01-02 14:02:00Z


def _reading(
    policy: str, at: float, failed: int, queried: int = 2, error: str | None = "connection refused"
) -> SourceReading:
    return SourceReading(PROMETHEUS, policy, at, queried, failed, error if failed else None)


def test_the_model_says_up_degraded_blind_since_when_why_and_which_policies() -> None:
    health = SourceHealth(PROMETHEUS)
    health = record(health, _reading("a", T0, 0))
    health = record(health, _reading("b", T0, 0))
    assert (health.status, health.since) == (SourceStatus.UP, T0)
    health = record(health, _reading("a", T0 + 15, 1, error="timeout"))
    assert (health.status, health.since, health.affected) == (SourceStatus.DEGRADED, T0 + 15, ("a",))
    health = record(health, _reading("a", T0 + 30, 2))
    assert health.status is SourceStatus.DEGRADED  # b still sees
    health = record(health, _reading("b", T0 + 45, 2))
    assert (health.status, health.since) == (SourceStatus.BLIND, T0 + 45)
    health = record(health, _reading("a", T0 + 60, 2))
    assert health.since == T0 + 45  # still blind: since does not move
    assert health.summary() == ("BLIND since 14:02:45Z: Prometheus unreachable (2 policies: a, b): connection refused")
    assert health.last_success_at == T0 + 15 and health.last_error_at == T0 + 60
    # A removed policy is not blind any more; the last one answering again makes the source up.
    health = keep_policies(health, ["b"], T0 + 70)
    assert (health.status, health.affected) == (SourceStatus.BLIND, ("b",))
    health = record(health, _reading("b", T0 + 75, 0))
    assert (health.status, health.since, health.affected) == (SourceStatus.UP, T0 + 75, ())
    # A policy error (a query the source refused as bad data) and a policy with no query are not outages.
    assert record(health, _reading("b", T0 + 90, 0, queried=0)) is health


def _closed_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


@pytest.fixture
def rules(tmp_path: Path) -> Path:
    directory = tmp_path / "rules"
    directory.mkdir()
    for name in ("lat-a", "lat-b"):
        (directory / f"{name}.yaml").write_text(policy_yaml(name, for_=1))
    return directory


def test_an_unreachable_prometheus_is_blind_everywhere_and_never_a_breach(
    rules: Path, tmp_path: Path, caplog: pytest.LogCaptureFixture, capsys: pytest.CaptureFixture[str]
) -> None:
    """The real Prometheus adapter, pointed at a closed port: every query fails as an outage."""
    registry = CollectorRegistry()
    clock = ManualClock(T0)
    source = PrometheusSource(
        PrometheusSettings(url=f"http://127.0.0.1:{_closed_port()}", timeout=1.0, retries=0), SystemClock()
    )
    dispatcher = FakeDispatcher()
    controller = Controller(
        policy_paths=[rules], source=source, journal=Journal(tmp_path / "journal.db"), dispatcher=dispatcher,
        clock=clock, metrics=ControllerMetrics(registry), schedule=False,
    )  # fmt: skip
    controller.start()
    try:
        with caplog.at_level(logging.INFO, logger="tailguard.health"):
            for _ in range(3):  # three rounds: one WARNING line on the transition, not one per evaluation
                controller.evaluate("lat-a")
                controller.evaluate("lat-b")
                clock.advance(15)
        warnings = [r for r in caplog.records if r.name == "tailguard.health"]
        assert [r.levelno for r in warnings] == [logging.WARNING]
        # The first evaluation that saw nothing made it blind (the only policy read then).
        assert (
            warnings[0]
            .getMessage()
            .startswith(
                "source Prometheus is blind: BLIND since 14:02:00Z: Prometheus unreachable (1 policy: lat-a): "
                "prometheus query failed: cannot connect to http://127.0.0.1:"
            )
        )
        assert dispatcher.dispatched == []  # a source error is never a breach
        value = registry.get_sample_value
        assert value("tailguard_source_up", {"source": "prometheus"}) == 0
        assert value("tailguard_source_status", {"source": "prometheus", "status": "blind"}) == 1
        assert value("tailguard_source_status", {"source": "prometheus", "status": "up"}) == 0
        assert value("tailguard_source_status_since_timestamp_seconds", {"source": "prometheus"}) == T0
        assert value("tailguard_last_successful_evaluation_timestamp_seconds", {"policy": "lat-a"}) is None
        assert value("tailguard_last_evaluation_timestamp_seconds", {"policy": "lat-a"}) == T0 + 30
        assert value("tailguard_policy_interval_seconds", {"policy": "lat-a"}) == 15
        assert value("tailguard_leader") == 1
        exposition = controller.metrics.exposition().decode()
        assert 'tailguard_build_info{python="' in exposition and "process_resident_memory_bytes" in exposition
        # Readiness: it serves its API (not unready because Prometheus is down), and says why it is blind.
        readiness = controller.readiness()
        assert readiness.ready
        assert any(w.startswith("BLIND since 14:02:00Z: Prometheus unreachable") for w in readiness.warnings)
        document = controller.status()
        assert document["health"]["status"] == "blind"
        (prometheus,) = document["health"]["sources"]
        assert prometheus["blindPolicies"] == ["lat-a", "lat-b"] and prometheus["since"] == T0
        assert prometheus["lastError"].endswith("Connection refused")
        # The status page shows it first, red; `tailguard status` prints it first and exits 4.
        page = render_status_page(document)
        banner = page.index('data-health="blind"')
        assert banner < page.index('id="policies"')
        assert "BLIND since 14:02:00Z: Prometheus unreachable<div" in page
        assert "blind: lat-a, lat-b" in page
        assert format_status(document).startswith("BLIND since 14:02:00Z: Prometheus unreachable (2 policies")
        assert health_exit(document) == EXIT_BLIND
        # `tailguard status --url` against the running API: the same lines first, exit code 4.
        api = ControllerAPI(controller, "127.0.0.1", 0, webhook_token="t0ken")
        api.start()
        try:
            (tmp_path / "token").write_text("t0ken")
            capsys.readouterr()
            assert status_main(["--url", api.url, "--token-file", str(tmp_path / "token")]) == EXIT_BLIND
            assert capsys.readouterr().out.startswith("BLIND since 14:02:00Z: Prometheus unreachable (2 policies")
        finally:
            api.stop()
    finally:
        controller.stop()
        source.close()


def test_a_source_answering_again_is_up_logged_once_and_the_last_success_moves(
    rules: Path, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    registry = CollectorRegistry()
    clock = ManualClock(T0)
    good = SignalResult({target_key({"service": "chat"}): 0.1})
    answers = {"down": True}

    def answer(_query: str, _at: float | None) -> SignalResult:
        return SignalResult.failed("HTTP 503 from Prometheus") if answers["down"] else good

    controller = Controller(
        policy_paths=[rules], source=_Scripted(answer), journal=Journal(tmp_path / "journal.db"),
        dispatcher=FakeDispatcher(), clock=clock, metrics=ControllerMetrics(registry), schedule=False,
    )  # fmt: skip
    controller.start()
    try:
        with caplog.at_level(logging.INFO, logger="tailguard.health"):
            controller.evaluate("lat-a")
            controller.evaluate("lat-b")
            assert health_exit(controller.status()) == EXIT_BLIND
            answers["down"] = False
            clock.advance(15)
            controller.evaluate("lat-a")
            assert health_exit(controller.status()) == EXIT_DEGRADED  # lat-b's last evaluation was still blind
            controller.evaluate("lat-b")
            assert health_exit(controller.status()) == EXIT_OK
        lines = [r.getMessage() for r in caplog.records if r.name == "tailguard.health"]
        assert [line.split(":")[0] for line in lines] == [
            "source Prometheus is blind",
            "source Prometheus is degraded",
            "source Prometheus is up again (was degraded)",
        ]
        assert registry.get_sample_value("tailguard_source_up", {"source": "prometheus"}) == 1
        assert (
            registry.get_sample_value("tailguard_last_successful_evaluation_timestamp_seconds", {"policy": "lat-a"})
            == T0 + 15
        )
        assert 'data-health="up"' in render_status_page(controller.status())
    finally:
        controller.stop()


class _Scripted:
    def __init__(self, answer: object) -> None:
        self.answer = answer

    def instant(self, query: str, group_by: object, at: float | None = None) -> SignalResult:
        return self.answer(query, at)  # type: ignore[operator,no-any-return]

    def range(self, *args: object) -> object:
        raise AssertionError("no range queries here")


class _ShardedLeader(FakeLeader):
    """A ShardedLeaderPort holding shard 0 of 2 (the policies of shard 1 belong to another replica)."""

    def __init__(self) -> None:
        super().__init__(leading=True)
        self.held = {0: True, 1: False}

    def leads(self, policy: str) -> bool:
        return True

    def publish_for(self, policy: str) -> bool:
        return True

    def shard_leadership(self) -> dict[int, bool]:
        return dict(self.held)


@pytest.mark.parametrize("leader", [FakeLeader(leading=False), _ShardedLeader()], ids=["standby", "sharded"])
def test_leader_and_shard_gauges_follow_the_elector(rules: Path, tmp_path: Path, leader: FakeLeader) -> None:
    registry = CollectorRegistry()
    controller = Controller(
        policy_paths=[rules], source=_Scripted(lambda *_: SignalResult({})), journal=Journal(tmp_path / "j.db"),
        dispatcher=FakeDispatcher(), clock=ManualClock(T0), metrics=ControllerMetrics(registry), schedule=False,
        leader=leader,
    )  # fmt: skip
    value = registry.get_sample_value
    try:
        _check_gauges(leader, value)
    finally:
        controller.stop()


def _check_gauges(leader: FakeLeader, value: Any) -> None:
    if isinstance(leader, _ShardedLeader):
        assert value("tailguard_leader") == 1
        assert (value("tailguard_shard_leader", {"shard": "0"}), value("tailguard_shard_leader", {"shard": "1"})) == (
            1,
            0,
        )
        leader.held = {0: False, 1: True}  # read at each scrape
        assert value("tailguard_shard_leader", {"shard": "1"}) == 1
    else:
        assert value("tailguard_leader") == 0
        assert value("tailguard_shard_leader", {"shard": "0"}) is None
        leader.leading = True
        assert value("tailguard_leader") == 1
