"""Issue 13 item 2 on the spec-validating fake Kubernetes API: the shipped scale policies, evaluated by the real
engine (evaluation.evaluate) with the real journal and dispatcher, move the HPA's floor out on a breach and back to
exactly the operator's floor (minReplicas) after the calm hysteresis; the exact writes and the final HPA."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from kubernetes import client as k8s
from prometheus_client import CollectorRegistry

from tailguard.controller.adapters.scale.hpa import HpaBounds, HpaScaler
from tailguard.controller.adapters.stores.journal import ActionStatus, Journal
from tailguard.controller.core.engine import PolicyState
from tailguard.controller.core.model import SignalResult, target_key
from tailguard.controller.core.policy import Policy
from tailguard.controller.core.policy_files import load_policies
from tailguard.controller.core.ports import RangeResult
from tailguard.controller.kit.clock import ManualClock
from tailguard.controller.loop.dispatcher import Actuators, Dispatcher, GlobalLimits
from tailguard.controller.loop.evaluation import EvaluationPorts, evaluate
from tailguard.controller.loop.metrics import ControllerMetrics
from tailguard.controller.testing import FakeAnnotator
from tests.support.fake_kubernetes import FakeKubernetes, hpa

pytestmark = pytest.mark.integration

EXAMPLES = Path(__file__).resolve().parents[2] / "rules" / "examples"
CHAT = target_key({"service": "chat"})
FLOOR, CEILING = 2, 8  # the operator's HPA


@pytest.fixture
def fake() -> Iterator[FakeKubernetes]:
    with FakeKubernetes() as server:
        server.put_object(hpa("chat", min_replicas=FLOOR, max_replicas=CEILING))
        yield server


class Signal:
    """The metrics source and the prediction port: the policy's one signal reads `value` for chat."""

    value = 0.0

    def instant(self, query: str, group_by: object, at: float | None = None) -> SignalResult:
        return SignalResult({CHAT: self.value})

    def range(self, *args: object) -> RangeResult:
        raise AssertionError("an evaluation never asks for a range")

    def predict(self, source: object, policy: Policy, at: float | None = None) -> dict[str, SignalResult]:
        return {s.name: SignalResult({CHAT: self.value}) for s in policy.signals if s.predict is not None}

    def warnings(self) -> list[str]:
        return []


def run(fake: FakeKubernetes, tmp_path: Path, policy_name: str, script: list[tuple[float, float]]) -> Journal:
    """Evaluate the shipped policy every interval through `script` [(value, seconds)] against the HPA."""
    (loaded,), errors = load_policies([EXAMPLES / f"{policy_name}.yaml"])
    assert errors == []
    policy = loaded.policy
    clock = ManualClock(1_767_225_600.0)
    scaler = HpaScaler(
        k8s.AutoscalingV2Api(fake.api_client()), clock=clock, bounds=HpaBounds(max_replicas=CEILING), namespace="llm"
    )
    journal = Journal(tmp_path / "journal.db")
    signal = Signal()
    ports = EvaluationPorts(
        source=signal,
        journal=journal,
        dispatcher=Dispatcher(journal, Actuators(scale=scaler, annotator=FakeAnnotator()), clock, GlobalLimits()),
        clock=clock,
        metrics=ControllerMetrics(CollectorRegistry()),
        predictions=signal,
    )
    state = PolicyState()
    for value, seconds in script:
        signal.value = value
        for _ in range(round(seconds / policy.interval)):
            clock.advance(policy.interval)
            state = evaluate(policy, state, clock.now(), ports).state
    return journal


def floors_written(fake: FakeKubernetes) -> list[tuple[int, int]]:
    return [
        (call.body["spec"]["minReplicas"], call.body["spec"]["maxReplicas"])
        for call in fake.calls("update", "horizontalpodautoscalers")
    ]


def test_reactive_queue_scale_raises_the_floor_then_restores_exactly_the_operators(
    fake: FakeKubernetes, tmp_path: Path
) -> None:
    # 45 waiting per replica for 30 s: ceil(2 * 45 / 20) = 5; between the thresholds (10) for 20 min: held;
    # calm (< 5) for 10 min: restored.
    journal = run(fake, tmp_path, "queue-scale", [(45.0, 45), (10.0, 20 * 60), (2.0, 10 * 60 + 15)])
    try:
        assert floors_written(fake) == [(5, CEILING), (FLOOR, CEILING)]
        spec = fake.get_object("horizontalpodautoscalers", "llm", "chat")["spec"]  # type: ignore[index]
        assert (spec["minReplicas"], spec["maxReplicas"]) == (FLOOR, CEILING)
        assert spec["metrics"][0]["pods"]["target"]["averageValue"] == "5"  # untouched
        statuses = {r.type.value: r.status for r in journal.all_actions() if r.type.value in ("scale", "restore")}
        assert statuses == {"scale": ActionStatus.SUCCEEDED, "restore": ActionStatus.SUCCEEDED}
    finally:
        journal.close()


def test_predictive_scale_out_is_one_replica_over_the_floor_and_comes_back(
    fake: FakeKubernetes, tmp_path: Path
) -> None:
    journal = run(fake, tmp_path, "predicted-queue-breach-scale", [(0.9, 30), (0.3, 15 * 60), (0.02, 10 * 60 + 15)])
    try:
        assert floors_written(fake) == [(FLOOR + 1, CEILING), (FLOOR, CEILING)]
        plans: dict[str, Any] = {r.type.value: r.plan for r in journal.all_actions()}
        assert plans["scale"]["before"]["minReplicas"] == FLOOR  # the recorded baseline the restore puts back
    finally:
        journal.close()
