"""Issue 13 item 2: a scale-out comes back down. The shipped scale policies (queue-scale: reactive,
predicted-queue-breach-scale: predictive) restore the pre-scale-out replica count after a sustained calm:
hysteresis (a separate, lower calm threshold held for the recovery's `for`; a value between the two neither fires
nor recovers, and a breach in the calm restarts it), the cooldown (a restore too soon after the scale-out waits
for it), exactly the recorded baseline (never below it, never a human's later change), journaled like any action.
The policies as shipped, through the real engine (evaluation.evaluate), journal and dispatcher, onto FakeScaler.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
from prometheus_client import CollectorRegistry

from tailguard.controller.adapters.stores.journal import ActionStatus, Journal
from tailguard.controller.core.engine import PolicyState
from tailguard.controller.core.model import SignalResult, target_key
from tailguard.controller.core.policy import ForSpec, Policy
from tailguard.controller.core.policy_files import load_policies
from tailguard.controller.core.ports import RangeResult
from tailguard.controller.kit.clock import ManualClock
from tailguard.controller.loop.dispatcher import Actuators, Dispatcher, GlobalLimits
from tailguard.controller.loop.evaluation import EvaluationPorts, evaluate
from tailguard.controller.loop.metrics import ControllerMetrics
from tailguard.controller.testing import FakeAnnotator, FakeScaler

EXAMPLES = Path(__file__).resolve().parents[2] / "rules" / "examples"
CHAT = target_key({"service": "chat"})
FLOOR = 2  # the operator's replica count before the incident


def example(name: str) -> Policy:
    loaded, errors = load_policies([EXAMPLES / f"{name}.yaml"])
    assert errors == []
    return loaded[0].policy


class Loop:
    """One policy evaluated every interval; `value` is what its signal (query or prediction) reads next."""

    def __init__(self, policy: Policy, tmp_path: Path) -> None:
        self.policy = policy
        self.clock = ManualClock(1_767_225_600.0)
        self.value = 0.0
        self.scaler = FakeScaler({"chat": FLOOR})
        self.journal = Journal(tmp_path / "journal.db")
        self.state = PolicyState()
        self.ports = EvaluationPorts(
            source=_Current(self),
            journal=self.journal,
            dispatcher=Dispatcher(
                self.journal, Actuators(scale=self.scaler, annotator=FakeAnnotator()), self.clock, GlobalLimits()
            ),
            clock=self.clock,
            metrics=ControllerMetrics(CollectorRegistry()),
            predictions=_Current(self),
        )
        self.kinds: list[tuple[float, str]] = []

    def hold(self, value: float, seconds: float) -> None:
        """Evaluate every interval for `seconds` with the signal at `value`."""
        self.value = value
        for _ in range(round(seconds / self.policy.interval)):
            self.clock.advance(self.policy.interval)
            outcome = evaluate(self.policy, self.state, self.clock.now(), self.ports)
            self.state = outcome.state
            self.kinds.extend((d.at, d.kind.value) for d in outcome.decisions)

    def counts(self) -> list[tuple[str, int]]:
        return [
            (call.method, call.args["replicas"] if call.method == "set_replicas" else call.args["state"]["replicas"])
            for call in self.scaler.performed()
        ]


class _Current:
    """The metrics source and the prediction port: the policy's one signal reads the loop's value for chat."""

    def __init__(self, loop: Loop) -> None:
        self.loop = loop

    def instant(self, query: str, group_by: object, at: float | None = None) -> SignalResult:
        return SignalResult({CHAT: self.loop.value})

    def range(self, *args: object) -> RangeResult:
        raise AssertionError("an evaluation never asks for a range")

    def predict(self, source: object, policy: Policy, at: float | None = None) -> dict[str, SignalResult]:
        return {signal.name: SignalResult({CHAT: self.loop.value}) for signal in policy.signals if signal.predict}

    def warnings(self) -> list[str]:
        return []


@pytest.fixture
def reactive(tmp_path: Path) -> Iterator[Loop]:
    loop = Loop(example("queue-scale"), tmp_path)
    yield loop
    loop.journal.close()


@pytest.fixture
def predictive(tmp_path: Path) -> Iterator[Loop]:
    loop = Loop(example("predicted-queue-breach-scale"), tmp_path)
    yield loop
    loop.journal.close()


def test_reactive_scale_out_comes_back_to_the_floor_only_after_ten_calm_minutes(reactive: Loop) -> None:
    reactive.hold(60.0, 45)  # 60 waiting per replica for 30 s: ceil(2 * 60 / 20) = 6 replicas
    assert reactive.counts() == [("set_replicas", 6)]
    # Hysteresis: 10 per replica is under the scale-out target (20) but not calm (< 5): no restore, ever.
    reactive.hold(10.0, 30 * 60)
    assert reactive.counts() == [("set_replicas", 6)]
    # Calm for 9 minutes, one busy evaluation (the calm restarts), then calm again: 10 full minutes are needed.
    reactive.hold(2.0, 9 * 60)
    reactive.hold(8.0, 15)
    reactive.hold(2.0, 9 * 60 + 45)
    assert reactive.counts() == [("set_replicas", 6)]
    calm_from = reactive.clock.now() - (9 * 60 + 45) + reactive.policy.interval
    reactive.hold(2.0, 30)
    assert reactive.counts() == [("set_replicas", 6), ("restore_scale", FLOOR)]
    assert reactive.scaler.replica_counts == {"chat": FLOOR}
    resolved = [at for at, kind in reactive.kinds if kind == "resolve"]
    assert resolved == [calm_from + 10 * 60]
    # Journaled like any action: the restore's plan names the pre-incident state it puts back.
    records = {record.type.value: record for record in reactive.journal.all_actions()}
    assert records["scale"].plan is not None and records["scale"].plan["before"] == {"replicas": FLOOR}
    assert records["restore"].status is ActionStatus.SUCCEEDED
    # And nothing more: calm goes on, the floor stays.
    reactive.hold(1.0, 20 * 60)
    assert reactive.counts() == [("set_replicas", 6), ("restore_scale", FLOOR)]


def test_predictive_restore_waits_for_the_cooldown_after_the_scale_out(predictive: Loop) -> None:
    # A recovery hold shorter than the cooldown (2m): the restore is due before the cooldown ends and waits.
    conditions = [
        c.model_copy(update={"recovery": c.recovery.model_copy(update={"for_": ForSpec(seconds=30.0)})})
        for c in predictive.policy.conditions
    ]
    predictive.policy = predictive.policy.model_copy(update={"conditions": conditions})
    predictive.hold(0.9, 30)  # over the cut (0.5) for 2 evaluations: +1 replica
    assert predictive.counts() == [("set_replicas", FLOOR + 1)]
    scaled_at = predictive.clock.now()
    predictive.hold(0.3, 60)  # between the calm threshold (0.1) and the cut: neither fires nor recovers
    predictive.hold(0.05, 45)  # calm for 30 s: the restore is due, 1m45s after the scale-out
    assert predictive.counts() == [("set_replicas", FLOOR + 1)]  # deferred: cooldown 2m
    predictive.hold(0.05, 30)
    assert predictive.counts() == [("set_replicas", FLOOR + 1), ("restore_scale", FLOOR)]
    assert predictive.scaler.replica_counts == {"chat": FLOOR}
    assert predictive.clock.now() - scaled_at >= predictive.policy.limits.cooldown


def test_a_restore_never_goes_below_what_was_there_nor_over_a_human_change(predictive: Loop) -> None:
    predictive.hold(0.9, 30)
    assert predictive.scaler.replica_counts == {"chat": FLOOR + 1}
    predictive.scaler.replica_counts["chat"] = 5  # an operator raises it during the incident
    predictive.hold(0.0, 11 * 60)
    [restore] = [call for call in predictive.scaler.calls if call.method == "restore_scale"]
    assert restore.args["state"]["replicas"] == FLOOR and restore.args["expected"] == {"replicas": FLOOR + 1}
    assert predictive.scaler.replica_counts == {"chat": 5}  # skipped: someone else changed it since
