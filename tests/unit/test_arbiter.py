"""Issue 12, item 1: action precedence and retries across policies (the arbiter).

Two policies on one service, through the real Controller, Dispatcher and Journal with the public fakes of the
ports (controller/testing): queue-scale (scale) and p99-rollback (rollback), the global limits of the shipped
configuration (cooldown 2m). A lower-precedence recent action never blocks a higher one; an action the global
limits refuse is DEFERRED (each refusal journaled as an event), retried with the same idempotency key while its
condition still fires, and ends SUPPRESSED with the reason once the condition resolves; a restart keeps the rule.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

import pytest
from prometheus_client import CollectorRegistry

from tailguard.controller.adapters.stores.journal import Journal
from tailguard.controller.app.settings import SettingsError, load_settings
from tailguard.controller.core import limits
from tailguard.controller.core.actions import ActionStatus, ActionType
from tailguard.controller.core.model import SignalResult, decision_id, target_key
from tailguard.controller.core.policy import Policy
from tailguard.controller.core.ports import MetricsSource
from tailguard.controller.kit.clock import ManualClock
from tailguard.controller.loop.dispatcher import Actuators, Dispatcher, GlobalLimits
from tailguard.controller.loop.metrics import ControllerMetrics
from tailguard.controller.loop.runtime import Controller
from tailguard.controller.testing import FakeAnnotator, FakeDeployer, FakeSource

T0 = 1_700_000_000.0
CHAT = target_key({"service": "chat"})

QUEUE_SCALE = """\
apiVersion: tailguard.io/v1alpha1
kind: Policy
name: queue-scale
interval: 15s
targets:
  groupBy: [service]
signals:
  - name: waiting-per-replica
    query: sum by ({{{{ by }}}}) (vllm:num_requests_waiting{{ {{{{ selector }}}} }})
conditions:
  - name: queue-above-target
    signal: waiting-per-replica
    when: {{op: ">", value: 20}}
    for: {for_}
    noData: hold
    actions:
      - type: scale
        service: "{{{{ service }}}}"
        targetPerReplica: 20
        min: 1
        max: 8
      - type: annotate
        text: "{{{{ value }}}} waiting per replica on {{{{ service }}}}: scaling out"
limits:
  cooldown: 2m
  maxActionsPerHour: 10
"""

P99_ROLLBACK = """\
apiVersion: tailguard.io/v1alpha1
kind: Policy
name: p99-rollback
interval: 15s
targets:
  groupBy: [service]
signals:
  - name: p99-e2e-latency
    query: histogram_quantile(0.99, sum by (le, {{{{ by }}}}) (rate(lat_bucket{{ {{{{ selector }}}} }}[1m])))
conditions:
  - name: p99-above-800ms
    signal: p99-e2e-latency
    when: {{op: ">", value: 0.8}}
    for: {for_}
    noData: hold
    actions:
      - type: annotate
        text: "P99 {{{{ value }}}}s on {{{{ service }}}}: rolling back"
      - type: rollback
        service: "{{{{ service }}}}"
limits:
  cooldown: 10m
  maxActionsPerHour: 3
"""


class Loop:
    """The controller as `tailguard run` wires it, minus the network: evaluations are run by hand, 15 s apart."""

    def __init__(self, tmp_path: Path, *, scale_for: int, rollback_for: int) -> None:
        self.rules = tmp_path / "rules"
        self.rules.mkdir()
        (self.rules / "queue-scale.yaml").write_text(QUEUE_SCALE.format(for_=scale_for))
        (self.rules / "p99-rollback.yaml").write_text(P99_ROLLBACK.format(for_=rollback_for))
        self.path = tmp_path / "journal.db"
        self.clock = ManualClock(T0)
        self.limits = GlobalLimits(cooldown=120.0, maxActionsPerHour=10)
        # Both signals breach: a bad rollout fills the queue and slows every request.
        self.values = {"waiting-per-replica": 45.0, "p99-e2e-latency": 2.0}
        self.deployer = FakeDeployer(replicas={"chat": 2}, revisions={"chat": 3})
        self.annotator = FakeAnnotator()
        self.start()

    def start(self) -> None:
        self.journal = Journal(self.path)
        self.dispatcher = Dispatcher(
            self.journal,
            Actuators(rollback=self.deployer, scale=self.deployer, annotator=self.annotator),
            self.clock,
            self.limits,
        )
        self.controller = Controller(
            policy_paths=[self.rules],
            source=FakeSource(),
            journal=self.journal,
            dispatcher=self.dispatcher,
            clock=self.clock,
            metrics=ControllerMetrics(CollectorRegistry()),
            query_signals=self._query,
            schedule=False,
        )
        self.controller.start()

    def restart(self) -> None:
        """The process stops; a new one opens the same journal."""
        self.controller.stop()
        self.start()

    def _query(self, source: MetricsSource, policy: Policy, at: float | None) -> Mapping[str, SignalResult]:
        return {signal.name: SignalResult({CHAT: self.values[signal.name]}) for signal in policy.signals}

    def tick(self) -> None:
        """One scheduled evaluation of each loaded policy at the current time, then 15 s pass."""
        for name in sorted(self.controller.policies()):
            self.controller.evaluate(name)
        self.clock.advance(15)

    def port_calls(self) -> list[tuple[str, dict[str, Any], str | None]]:
        return [(call.method, dict(call.args), call.idempotency_key) for call in self.deployer.calls]

    def rows(self) -> list[tuple[str, str, str, int]]:
        return [(r.policy, r.type.value, r.status.value, r.attempts) for r in self.journal.all_actions()]


def key(policy: str, condition: str, onset: float, index: int) -> str:
    return f"{decision_id(policy, condition, CHAT, onset)}:fire:{index}"


SCALE_AT_T0 = key("queue-scale", "queue-above-target", T0, 0)
ROLLBACK_AT_T0 = key("p99-rollback", "p99-above-800ms", T0, 1)


def refusal(since: int) -> str:
    return (
        f"global cooldown: rollback on chat by policy 'p99-rollback' {since}s ago, {120 - since}s left (cooldown 120s)"
    )


@pytest.fixture
def scale_first(tmp_path: Path) -> Iterator[Loop]:
    loop = Loop(tmp_path, scale_for=2, rollback_for=3)  # the queue fills first: scale at +15 s, rollback at +30 s
    yield loop
    loop.controller.stop()


@pytest.fixture
def rollback_first(tmp_path: Path) -> Iterator[Loop]:
    loop = Loop(tmp_path, scale_for=3, rollback_for=2)  # rollback at +15 s, the scale decided at +30 s
    yield loop
    loop.controller.stop()


# ----- the reproduction ----------------------------------------------------------------------------------------


def test_a_recent_scale_never_blocks_the_rollback(scale_first: Loop) -> None:
    """The issue: queue-scale scales first; the P99 rollback seconds later was refused by the global cooldown
    and recorded as final (one scale, zero rollbacks over 10 minutes of 2 s P99)."""
    loop = scale_first
    for _ in range(41):  # 10 minutes of breach, both policies every 15 s
        loop.tick()
    assert loop.port_calls() == [
        ("set_replicas", {"service": "chat", "replicas": 5}, SCALE_AT_T0),
        ("rollback", {"service": "chat"}, ROLLBACK_AT_T0),
    ]
    assert loop.deployer.active_revision["chat"] == 2 and loop.deployer.replica_counts["chat"] == 5
    assert loop.rows() == [
        ("queue-scale", "scale", "succeeded", 1),
        ("queue-scale", "annotate", "succeeded", 1),
        ("p99-rollback", "annotate", "succeeded", 1),
        ("p99-rollback", "rollback", "succeeded", 1),
    ]
    rollback = loop.journal.get_action(ROLLBACK_AT_T0)
    assert rollback is not None and rollback.started_at == T0 + 30 and rollback.error is None
    assert loop.journal.action_events(ROLLBACK_AT_T0) == [] and loop.journal.action_events(SCALE_AT_T0) == []


def test_a_scale_deferred_by_a_rollback_runs_after_the_cooldown_with_the_same_key(rollback_first: Loop) -> None:
    loop = rollback_first
    for _ in range(3):  # +0, +15 (rollback), +30 (scale decided, refused)
        loop.tick()
    scale_key = key("queue-scale", "queue-above-target", T0, 0)
    rollback_key = key("p99-rollback", "p99-above-800ms", T0, 1)
    assert loop.port_calls() == [("rollback", {"service": "chat"}, rollback_key)]
    deferred = loop.journal.get_action(scale_key)
    assert deferred is not None and deferred.status is ActionStatus.DEFERRED and deferred.attempts == 0
    assert deferred.error == refusal(15)
    for _ in range(6):  # +45 ... +120: still firing, still cooling down
        loop.tick()
    assert loop.port_calls() == [("rollback", {"service": "chat"}, rollback_key)]
    loop.tick()  # +135: the rollback is 120 s old
    loop.tick()  # +150: nothing more
    assert loop.port_calls() == [
        ("rollback", {"service": "chat"}, rollback_key),
        ("set_replicas", {"service": "chat", "replicas": 5}, scale_key),
    ]
    done = loop.journal.get_action(scale_key)
    assert done is not None and done.status is ActionStatus.SUCCEEDED and done.attempts == 1
    assert done.started_at == T0 + 135 and done.error is None
    assert loop.journal.action_events(scale_key) == [
        *({"at": T0 + since + 15, "event": "deferred", "detail": refusal(since)} for since in range(15, 120, 15)),
        {"at": T0 + 135, "event": "started", "detail": "the global limits allow it now"},
        {"at": T0 + 135, "event": "succeeded", "detail": None},
    ]
    assert loop.rows() == [
        ("p99-rollback", "annotate", "succeeded", 1),
        ("p99-rollback", "rollback", "succeeded", 1),
        ("queue-scale", "scale", "succeeded", 1),
        ("queue-scale", "annotate", "succeeded", 1),
    ]
    # /api/v1/decisions: the scale's record shows each refusal and the outcome.
    (fire,) = [d for d in loop.controller.recent_decisions() if d["policy"] == "queue-scale"]
    scale_record = fire["action_records"][0]
    assert scale_record["status"] == "succeeded" and scale_record["idempotency_key"] == scale_key
    assert [event["event"] for event in scale_record["events"]] == ["deferred"] * 7 + ["started", "succeeded"]


def test_a_deferred_action_ends_suppressed_when_its_condition_resolves(rollback_first: Loop) -> None:
    loop = rollback_first
    for _ in range(5):  # refused at +30, +45, +60
        loop.tick()
    loop.values["waiting-per-replica"] = 5.0  # the rollback drained the queue
    for _ in range(20):  # +75 (resolved) ... well past the cooldown
        loop.tick()
    scale_key = key("queue-scale", "queue-above-target", T0, 0)
    assert [method for method, _, _ in loop.port_calls()] == ["rollback"]
    ended = loop.journal.get_action(scale_key)
    assert ended is not None and ended.status is ActionStatus.SUPPRESSED and ended.attempts == 0
    assert ended.error == f"condition resolved while deferred: {refusal(45)}"
    assert loop.journal.action_events(scale_key) == [
        {"at": T0 + 30, "event": "deferred", "detail": refusal(15)},
        {"at": T0 + 45, "event": "deferred", "detail": refusal(30)},
        {"at": T0 + 60, "event": "deferred", "detail": refusal(45)},
        {"at": T0 + 75, "event": "suppressed", "detail": f"condition resolved while deferred: {refusal(45)}"},
    ]


# ----- restarts ----------------------------------------------------------------------------------------------


def test_a_restart_keeps_a_deferred_action_until_its_condition_is_seen_firing(rollback_first: Loop) -> None:
    loop = rollback_first
    for _ in range(4):  # refused at +30 and +45
        loop.tick()
    scale_key = key("queue-scale", "queue-above-target", T0, 0)
    loop.restart()
    loop.clock.advance(120)  # the new process starts well after the cooldown: resume alone must not run it
    assert [method for method, _, _ in loop.port_calls()] == ["rollback"]
    record = loop.journal.get_action(scale_key)
    assert record is not None and record.status is ActionStatus.DEFERRED
    loop.tick()  # the first evaluation after the restart still sees the queue above target: now it runs
    assert loop.port_calls()[1:] == [("set_replicas", {"service": "chat", "replicas": 5}, scale_key)]
    assert [event["event"] for event in loop.journal.action_events(scale_key)] == [
        "deferred",
        "deferred",
        "started",
        "succeeded",
    ]


def test_a_deferred_action_whose_condition_resolved_across_a_restart_never_runs(rollback_first: Loop) -> None:
    loop = rollback_first
    for _ in range(3):
        loop.tick()
    scale_key = key("queue-scale", "queue-above-target", T0, 0)
    loop.restart()
    loop.clock.advance(300)
    loop.values["waiting-per-replica"] = 3.0
    loop.tick()
    assert [method for method, _, _ in loop.port_calls()] == ["rollback"]
    ended = loop.journal.get_action(scale_key)
    assert ended is not None and ended.status is ActionStatus.SUPPRESSED
    assert ended.error == f"condition resolved while deferred: {refusal(15)}"


def test_a_deferred_action_of_a_policy_removed_across_a_restart_ends_suppressed(rollback_first: Loop) -> None:
    loop = rollback_first
    for _ in range(3):
        loop.tick()
    scale_key = key("queue-scale", "queue-above-target", T0, 0)
    loop.controller.stop()
    (loop.rules / "queue-scale.yaml").unlink()
    loop.start()
    ended = loop.journal.get_action(scale_key)
    assert ended is not None and ended.status is ActionStatus.SUPPRESSED
    assert ended.error == f"policy removed while deferred: {refusal(15)}"
    assert [method for method, _, _ in loop.port_calls()] == ["rollback"]


def test_the_deferral_outlives_the_budget_too(rollback_first: Loop) -> None:
    """A budget refusal is deferred like a cooldown one; the budget counts every mutating action (the rollback)."""
    loop = rollback_first
    loop.limits = GlobalLimits(maxActionsPerHour=1)
    loop.restart()  # the same journal (still empty), with these limits
    for _ in range(3):
        loop.tick()
    scale_key = key("queue-scale", "queue-above-target", T0, 0)
    record = loop.journal.get_action(scale_key)
    budget = "global budget: 1 mutating action(s) on chat in the last hour across all policies (max 1)"
    assert record is not None and record.status is ActionStatus.DEFERRED and record.error == budget
    while loop.clock.now() <= T0 + 15 + 3600:  # the rollback leaves the hour at +3615
        loop.tick()
    assert loop.port_calls()[1:] == [("set_replicas", {"service": "chat", "replicas": 5}, scale_key)]
    done = loop.journal.get_action(scale_key)
    assert done is not None and done.started_at == T0 + 15 + 3600 and done.status is ActionStatus.SUCCEEDED


# ----- precedence ---------------------------------------------------------------------------------------------


def test_precedence_is_configurable(tmp_path: Path) -> None:
    """With scale above rollback, the issue's order is reversed: the rollback waits for the scale's cooldown."""
    loop = Loop(tmp_path, scale_for=2, rollback_for=3)
    try:
        loop.limits = GlobalLimits(cooldown=120.0, precedence=(ActionType.SCALE, ActionType.ROLLBACK))
        loop.restart()
        for _ in range(3):
            loop.tick()
        record = loop.journal.get_action(ROLLBACK_AT_T0)
        assert record is not None and record.status is ActionStatus.DEFERRED
        assert record.error == (
            "global cooldown: scale on chat by policy 'queue-scale' 15s ago, 105s left (cooldown 120s)"
        )
        assert [method for method, _, _ in loop.port_calls()] == ["set_replicas"]
    finally:
        loop.controller.stop()


def past(action_type: str, at: float, decision: str = "other:fire") -> limits.PastAction:
    return limits.PastAction(action_type, at, "p", decision)


@pytest.mark.parametrize(
    "wanted, recent, allowed",
    [
        ("rollback", [past("scale", 90.0)], True),  # a lower-precedence scale never blocks a rollback
        ("rollback", [past("shift_traffic", 90.0)], True),
        ("rollback", [past("rollback", 90.0)], False),  # equal precedence cools down
        ("shift_traffic", [past("rollback", 90.0)], False),  # higher precedence cools down
        ("scale", [past("shift_traffic", 90.0)], False),
        ("shift_traffic", [past("scale", 90.0)], True),
        ("scale", [past("rollback", 90.0, "mine:fire")], True),  # one decision is one intervention
        ("scale", [past("rollback", 0.0)], True),  # cooldown over (100 s ago, cooldown 60 s)
        ("restore", [past("scale", 90.0)], False),  # a type the order does not list ranks last
    ],
)
def test_global_refusal_precedence(wanted: str, recent: list[limits.PastAction], allowed: bool) -> None:
    refused = limits.global_refusal(wanted, "mine:fire", recent, 100.0, service="chat", cooldown=60.0, max_actions=None)
    assert (refused is None) is allowed
    if refused is not None:
        assert refused.limit == "cooldown" and refused.reason.startswith(f"global cooldown: {recent[0].type} on chat")


def test_global_refusal_budget_counts_every_type() -> None:
    recent = [past("scale", 10.0), past("shift_traffic", 20.0, "mine:fire")]
    refused = limits.global_refusal("rollback", "mine:fire", recent, 100.0, service="chat", cooldown=0, max_actions=2)
    assert refused == limits.Refusal(
        "budget", "global budget: 2 mutating action(s) on chat in the last hour across all policies (max 2)"
    )
    order = ("scale", "rollback")
    assert (
        limits.global_refusal(
            "rollback",
            "x:fire",
            [past("scale", 90.0)],
            100.0,
            service="chat",
            cooldown=60.0,
            max_actions=None,
            precedence=order,
        )
        is not None
    )


def test_settings_precedence(tmp_path: Path) -> None:
    base = "prometheus: {url: 'http://127.0.0.1:9090'}\npolicies: [r.yaml]\nlimits:\n  cooldown: 2m\n"
    path = tmp_path / "controller.yaml"
    path.write_text(base)
    assert load_settings(path).limits.precedence == (
        ActionType.ROLLBACK,
        ActionType.SHIFT_TRAFFIC,
        ActionType.SCALE,
    )
    path.write_text(base + "  precedence: [rollback, scale]\n")
    assert load_settings(path).limits.precedence == (ActionType.ROLLBACK, ActionType.SCALE)
    path.write_text(base + "  precedence: [rollback, annotate]\n")
    with pytest.raises(SettingsError) as raised:
        load_settings(path)
    assert ":5: limits.precedence" in str(raised.value.errors[0])
    assert "'annotate' is not a mutating action type" in str(raised.value.errors[0])
