"""The public fakes of the loop's ports (controller/testing) satisfy their Protocols and do what they say."""

from __future__ import annotations

from tailguard.controller.core.attribution import Rollout
from tailguard.controller.core.engine import PolicyState
from tailguard.controller.core.model import SignalResult, target_key
from tailguard.controller.core.ports import (
    ChangeTrackerPort,
    DispatcherPort,
    HandoverPort,
    JournalPort,
    LeaderPort,
    PredictionPort,
)
from tailguard.controller.testing import (
    FakeChangeTracker,
    FakeDispatcher,
    FakeHandover,
    FakeJournal,
    FakeLeader,
    FakePredictions,
    make_decision,
)

T0 = 1_700_000_000.0


def test_fake_journal_keeps_states_and_decisions_newest_first() -> None:
    journal: JournalPort = FakeJournal()
    first, second = make_decision([], onset=T0), make_decision([], onset=T0 + 60)
    journal.commit_evaluation("p", PolicyState(), [first], T0)
    journal.commit_evaluation("p", PolicyState(), [second, first], T0 + 60)
    assert journal.load_state("p") == PolicyState() and journal.load_state("other") is None
    assert [(d["id"], d["recorded_at"]) for d in journal.recent_decisions()] == [(second.id, T0 + 60), (first.id, T0)]


def test_fake_dispatcher_records() -> None:
    fake = FakeDispatcher()
    dispatcher: DispatcherPort = fake
    decision = make_decision([("annotate", {"text": "t"})])
    assert dispatcher.dispatch(decision) == [] and dispatcher.resume() == []
    assert fake.dispatched == [decision] and fake.resumed == 1


def test_fake_leader_and_handover() -> None:
    fake = FakeLeader(leading=False)
    leader: LeaderPort = fake
    handover: HandoverPort = FakeHandover({"p": {target_key({"service": "chat"}): (T0,)}})
    leader.attach_handover(handover)
    assert not leader.is_leader() and not leader.publish()
    fake.leading = True
    assert leader.is_leader() and leader.publish() and fake.published == 2 and fake.handover is handover
    handover.inherit_handover(handover.handover_snapshot())
    assert isinstance(handover, FakeHandover) and handover.inherited == [handover.times]


def test_fake_change_tracker_filters_by_since() -> None:
    old = Rollout({"service": "chat"}, "r1", None, T0 - 600, "fake")
    new = Rollout({"service": "chat"}, "r2", "r1", T0, "fake")
    tracker: ChangeTrackerPort = FakeChangeTracker([old, new], errors=["argocd: down"])
    feed = tracker.rollouts(T0 - 60)
    assert feed.rollouts == (new,) and feed.error == "argocd: down"


def test_fake_predictions_answer_the_same_signals() -> None:
    signal = SignalResult({target_key({"service": "chat"}): 0.9})
    fake = FakePredictions({"p99_predicted": signal}, warnings=["model is stale"])
    predictions: PredictionPort = fake
    assert predictions.warnings() == ["model is stale"]
    assert fake.signals == {"p99_predicted": signal}
