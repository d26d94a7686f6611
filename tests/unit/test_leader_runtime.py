"""The controller evaluates and acts only while its LeaderElector leads (two replicas, one Lease, the fake API)."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

from kubernetes import client as k8s
from prometheus_client import CollectorRegistry

from controller.clock import ManualClock
from controller.journal import Journal
from controller.leader import LeaderElector
from controller.metrics import ControllerMetrics
from controller.runtime import Controller
from controller.sources.fakes import FakeSource
from tests.support.fake_kubernetes import FakeKubernetes

POLICY = """\
apiVersion: tailguard.io/v1alpha1
kind: Policy
name: lat
interval: 15s
targets:
  groupBy: [service]
signals:
  - name: p99
    query: histogram_quantile(0.99, sum by (le, {{ by }}) (rate(lat_bucket[1m])))
conditions:
  - name: p99-high
    signal: p99
    when: {op: ">", value: 0.8}
    for: 2
    noData: hold
    actions:
      - type: annotate
        text: "p99 {{ value }}"
"""


class CountingDispatcher:
    def __init__(self) -> None:
        self.resumed = 0

    def dispatch(self, decision: Any) -> Sequence[Any]:
        return []

    def resume(self) -> Sequence[Any]:
        self.resumed += 1
        return []


def replica(
    tmp_path: Path, name: str, fake: FakeKubernetes, clock: ManualClock
) -> tuple[Controller, LeaderElector, CountingDispatcher]:
    rules = tmp_path / "rules"
    rules.mkdir(exist_ok=True)
    (rules / "lat.yaml").write_text(POLICY)
    elector = LeaderElector(k8s.CoordinationV1Api(fake.api_client()), "tailguard", "llm", name, 15, clock)
    dispatcher = CountingDispatcher()
    controller = Controller(
        policy_paths=[rules],
        source=FakeSource(),
        journal=Journal(tmp_path / f"{name}.db"),
        dispatcher=dispatcher,
        clock=clock,
        metrics=ControllerMetrics(CollectorRegistry()),
        schedule=False,
        leader=elector,
    )
    return controller, elector, dispatcher


def test_only_the_leader_evaluates_and_a_follower_takes_over(tmp_path: Path) -> None:
    clock = ManualClock()
    with FakeKubernetes() as fake:
        first, first_elector, first_dispatcher = replica(tmp_path, "pod-a", fake, clock)
        second, second_elector, second_dispatcher = replica(tmp_path, "pod-b", fake, clock)
        assert first_elector.run_once() and not second_elector.run_once()
        first.start()
        second.start()
        try:
            assert first_dispatcher.resumed == 1 and second_dispatcher.resumed == 0  # a follower resumes nothing
            assert first.evaluate("lat") is not None
            assert second.evaluate("lat") is None
            assert second.skipped_not_leader == {"lat": 1}
            follower_ready = second.readiness()
            assert follower_ready.ready and any("follower" in w for w in follower_ready.warnings)
            # pod-a stops renewing; after expiry pod-b leads, resumes once, and evaluates
            clock.advance(16)
            assert first.evaluate("lat") is None  # its deadline passed: it stops acting on its own
            assert second_elector.run_once() is True  # the record it saw at t0 has not changed for 16 s
            assert second.evaluate("lat") is not None
            assert second_dispatcher.resumed == 1
        finally:
            first.stop()
            second.stop()
