"""The dispatcher with sharded leader election (`may_act_for`, controller/adapters/lease/shards.py): an action
runs only while this replica leads its policy's shard, asked before each one, in both modes; an action of a
shard not led stays planned in the journal (nothing performed) and runs when the shard is led again."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from tailguard.controller.adapters.stores.journal import ActionStatus, Journal
from tailguard.controller.core.engine import PolicyState
from tailguard.controller.core.model import Decision
from tailguard.controller.kit.clock import ManualClock
from tailguard.controller.loop.dispatcher import Actuators, Dispatcher, GlobalLimits
from tailguard.controller.testing import (
    FakeAnnotator,
    FakeDeployer,
    FakeNotifier,
    FakeRouter,
    condition_state,
    make_decision,
)

OURS, THEIRS = "queue-ours", "queue-theirs"


@pytest.fixture
def journal(tmp_path: Path) -> Iterator[Journal]:
    with Journal(tmp_path / "journal.db") as opened:
        yield opened


def rollback(policy: str, service: str) -> Decision:
    return make_decision([("rollback", {"service": service})], policy=policy, service=service)


def test_resume_runs_only_the_actions_of_led_shards_and_the_rest_later(journal: Journal) -> None:
    clock = ManualClock()
    deployer = FakeDeployer(replicas={"chat": 2, "code": 2}, revisions={"chat": 3, "code": 3})
    actuators = Actuators(deployer, deployer, FakeRouter(), FakeAnnotator(), FakeNotifier())
    ours, theirs = rollback(OURS, "chat"), rollback(THEIRS, "code")
    for decision in (ours, theirs):  # planned by an evaluation, not dispatched (a crash, a lost Lease)
        journal.commit_evaluation(decision.policy, PolicyState(), [decision], clock.now())
    leading = {OURS}
    dispatcher = Dispatcher(journal, actuators, clock, GlobalLimits(), may_act_for=lambda policy: policy in leading)
    # Never planned by its decision: each waits for an evaluation of a led policy to plan it (issue 23).
    [waiting] = dispatcher.resume()
    assert (waiting.policy, waiting.status) == (OURS, ActionStatus.DEFERRED)
    [record] = dispatcher.retry_deferred(OURS, condition_state(ours))
    assert (record.policy, record.status) == (OURS, ActionStatus.SUCCEEDED)
    assert [c.idempotency_key for c in deployer.calls] == [ours.actions[0].idempotency_key]
    [pending] = journal.pending_actions()
    assert (pending.policy, pending.status) == (THEIRS, ActionStatus.PLANNED)
    leading.add(THEIRS)  # this replica takes that shard over later
    [waiting] = dispatcher.resume()
    assert (waiting.policy, waiting.status) == (THEIRS, ActionStatus.DEFERRED)
    [later] = dispatcher.retry_deferred(THEIRS, condition_state(theirs))
    assert (later.policy, later.status, later.attempts) == (THEIRS, ActionStatus.SUCCEEDED, 1)
    assert len(deployer.performed("rollback")) == 2 and journal.pending_actions() == []


def test_a_queued_action_is_asked_again_when_it_runs(journal: Journal) -> None:
    clock = ManualClock()
    deployer = FakeDeployer(replicas={"chat": 2}, revisions={"chat": 3})
    actuators = Actuators(deployer, deployer, FakeRouter(), FakeAnnotator(), FakeNotifier())
    leading: set[str] = set()  # the shard was lost between the decision and the worker picking the action up
    dispatcher = Dispatcher(
        journal, actuators, clock, GlobalLimits(), workers=True, may_act_for=lambda policy: policy in leading
    )
    try:
        decision = rollback(OURS, "chat")
        journal.commit_evaluation(decision.policy, PolicyState(), [decision], clock.now())
        dispatcher.dispatch(decision)
        assert dispatcher.wait_idle(30)
        assert deployer.calls == []
        [pending] = journal.pending_actions()
        assert pending.status is ActionStatus.PLANNED
        leading.add(OURS)
        dispatcher.resume()
        assert dispatcher.wait_idle(30)
        assert [c.idempotency_key for c in deployer.calls] == [decision.actions[0].idempotency_key]
        assert journal.pending_actions() == []
    finally:
        dispatcher.close()
