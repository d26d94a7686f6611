"""Issue 12, item 3 (undo is exact): every change journals the state it replaced; a recovery's `restore` puts
back exactly the pre-incident state, composes across incidents, and never overwrites someone else's change.
Through the real Journal and Dispatcher with the public fakes of the ports."""

from __future__ import annotations

from pathlib import Path

import pytest

from tailguard.controller.adapters.stores.journal import ActionStatus, Journal
from tailguard.controller.core.model import Decision
from tailguard.controller.core.policy_files import parse_policy_text
from tailguard.controller.kit.clock import ManualClock
from tailguard.controller.loop.dispatcher import Actuators, Dispatcher, GlobalLimits
from tailguard.controller.testing import FakeRouter, FakeScaler, make_decision

BUNDLED = {"r1": 90, "r2": 10}  # the bundled route: stable 90 / canary 10


class Rig:
    def __init__(self, path: Path) -> None:
        self.clock = ManualClock()
        self.router = FakeRouter(routes={"chat": dict(BUNDLED)})
        self.scaler = FakeScaler(replicas={"chat": 2})
        self.journal = Journal(path)
        self.dispatcher = Dispatcher(
            self.journal, Actuators(scale=self.scaler, router=self.router), self.clock, GlobalLimits()
        )

    def incident(self, policy: str, action: tuple[str, dict[str, object]]) -> tuple[Decision, Decision]:
        onset = self.clock.now()
        fire = make_decision([action], policy=policy, condition=f"{policy}-breach", onset=onset)
        resolve = make_decision(
            [("restore", {"service": "chat"})], policy=policy, condition=f"{policy}-breach", onset=onset, kind="resolve"
        )
        return fire, resolve

    def run(self, decision: Decision) -> ActionStatus:
        self.clock.advance(15)
        [record] = self.dispatcher.dispatch(decision)
        return record.status


@pytest.fixture
def rig(tmp_path: Path) -> Rig:
    return Rig(tmp_path / "journal.db")


def test_a_change_journals_every_weight_it_replaced_before_acting(rig: Rig) -> None:
    fire, _ = rig.incident("error-rate-shift", ("shift_traffic", {"service": "chat", "version": "r2", "weight": 0}))
    assert rig.run(fire) is ActionStatus.SUCCEEDED
    [record] = rig.journal.actions_for(fire.id)
    assert record.plan is not None and record.plan["before"] == BUNDLED
    assert record.result is not None and record.result["after"] == {"traffic": {"r1": 100, "r2": 0}}


def test_recovery_restores_the_pre_incident_weights_not_100_percent(rig: Rig) -> None:
    fire, resolve = rig.incident(
        "error-rate-shift", ("shift_traffic", {"service": "chat", "version": "r2", "weight": 0})
    )
    assert rig.run(fire) is ActionStatus.SUCCEEDED
    assert rig.router.routes["chat"] == {"r1": 100, "r2": 0}
    assert rig.run(resolve) is ActionStatus.SUCCEEDED
    assert rig.router.routes["chat"] == BUNDLED
    [restore] = rig.router.performed("set_weights")
    assert restore.args["weights"] == BUNDLED and restore.args["expected"] == {"r1": 100, "r2": 0}


def test_scale_out_then_calm_returns_to_the_pre_incident_count(rig: Rig) -> None:
    fire, resolve = rig.incident("queue-scale", ("scale", {"service": "chat", "replicas": 6, "max": 8}))
    assert rig.run(fire) is ActionStatus.SUCCEEDED
    assert rig.scaler.replica_counts["chat"] == 6
    assert rig.run(resolve) is ActionStatus.SUCCEEDED
    assert rig.scaler.replica_counts["chat"] == 2


@pytest.mark.parametrize("order", ["first-restored-first", "last-restored-first"])
def test_two_incidents_on_one_route_restored_in_either_order_end_at_the_baseline(rig: Rig, order: str) -> None:
    first, first_resolve = rig.incident(
        "error-rate-shift", ("shift_traffic", {"service": "chat", "version": "r2", "weight": 0})
    )
    second, second_resolve = rig.incident(
        "canary-guard", ("shift_traffic", {"service": "chat", "version": "r1", "weight": 80})
    )
    assert rig.run(first) is ActionStatus.SUCCEEDED
    assert rig.run(second) is ActionStatus.SUCCEEDED
    assert rig.router.routes["chat"] == {"r1": 80, "r2": 20}
    if order == "first-restored-first":
        # The later incident still holds the route: the first restore writes nothing.
        assert rig.run(first_resolve) is ActionStatus.SKIPPED
        assert rig.router.routes["chat"] == {"r1": 80, "r2": 20}
        assert rig.run(second_resolve) is ActionStatus.SUCCEEDED
    else:
        # Back to what the first (still active) incident set, then to the baseline.
        assert rig.run(second_resolve) is ActionStatus.SUCCEEDED
        assert rig.router.routes["chat"] == {"r1": 100, "r2": 0}
        assert rig.run(first_resolve) is ActionStatus.SUCCEEDED
    assert rig.router.routes["chat"] == BUNDLED


def test_a_restore_never_overwrites_someone_elses_change(rig: Rig) -> None:
    fire, resolve = rig.incident(
        "error-rate-shift", ("shift_traffic", {"service": "chat", "version": "r2", "weight": 0})
    )
    assert rig.run(fire) is ActionStatus.SUCCEEDED
    rig.router.routes["chat"] = {"r1": 50, "r2": 50}  # a human (or Flagger) moved it since
    assert rig.run(resolve) is ActionStatus.SKIPPED
    assert rig.router.routes["chat"] == {"r1": 50, "r2": 50}
    [record] = [r for r in rig.journal.actions_for(resolve.id) if r.decision_kind == "resolve"]
    assert record.result is not None and "changed by someone else" in str(record.result["detail"])


def test_a_restore_of_an_incident_that_changed_nothing_is_skipped(rig: Rig) -> None:
    _, resolve = rig.incident("error-rate-shift", ("shift_traffic", {"service": "chat", "version": "r2", "weight": 0}))
    assert rig.run(resolve) is ActionStatus.SKIPPED
    assert rig.router.performed("set_weights") == [] and rig.router.routes["chat"] == BUNDLED


POLICY = """\
apiVersion: tailguard.io/v1alpha1
kind: Policy
name: p
targets: {groupBy: [service]}
signals: [{name: s, query: up}]
conditions:
  - name: c
    signal: s
    when: {op: ">", value: 1}
    for: 1
    noData: hold
    actions: [{type: %s}]
"""


def test_restore_belongs_in_recovery_only() -> None:
    policies, errors = parse_policy_text(POLICY % "restore", "p.yaml")
    assert policies == [] and len(errors) == 1
    assert "`restore` action belongs in `recovery.actions`" in errors[0].message
    assert parse_policy_text(POLICY % "notify, receiver: x", "p.yaml")[1] == []
