"""The loop embedded through the public face (controller/loop/embedding.py, as serving/lab/surge.py uses it): one
evaluation decides, commits to a real journal and acts through the journal-first dispatcher, exactly once."""

from __future__ import annotations

from pathlib import Path

from tailguard.controller import (
    Actuators,
    Journal,
    ManualClock,
    PolicyState,
    SignalResult,
    embed_dispatcher,
    embed_loop,
    load_policies,
    target_key,
)
from tailguard.controller.core.signals import render_signal_queries
from tailguard.controller.loop.evaluation import UnconfiguredPredictions
from tailguard.controller.testing import FakeAnnotator, FakeSource
from tests.unit.test_runtime import policy_yaml


def test_an_embedded_loop_fires_journals_and_acts_once(tmp_path: Path) -> None:
    (tmp_path / "lat.yaml").write_text(policy_yaml("lat-a", for_=1))
    loaded, errors = load_policies([tmp_path / "lat.yaml"])
    assert not errors
    policy = loaded[0].policy
    query = render_signal_queries(policy)["p99"]
    chat = target_key({"service": "chat"})
    clock = ManualClock(1000.0)
    annotator = FakeAnnotator()
    journal = Journal(tmp_path / "journal.db")
    try:
        loop = embed_loop(
            journal,
            Actuators(annotator=annotator),
            clock,
            FakeSource(instant_answers={query: SignalResult({chat: 0.93})}),
            UnconfiguredPredictions(),
        )
        outcome = loop.evaluate(policy, PolicyState(), clock.now())
        (decision,) = outcome.decisions
        assert decision.kind.value == "fire"
        # the dispatcher ran the decision's annotation: one effective call, journaled as succeeded
        assert [call.method for call in annotator.performed()] == ["annotate"]
        (action,) = journal.actions_for(decision.id)
        assert action.status.value == "succeeded"
        assert journal.load_state("lat-a") == outcome.state
        # the next evaluation, still breaching, adds nothing (no action twice)
        again = loop.evaluate(policy, outcome.state, clock.now() + 15)
        assert not [d for d in again.decisions if d.kind.value == "fire"]
        assert len(annotator.performed()) == 1
    finally:
        journal.close()


def test_without_incidents_the_evaluations_dispatch_to_the_dispatcher_itself(tmp_path: Path) -> None:
    journal = Journal(tmp_path / "journal.db")
    try:
        embedded = embed_dispatcher(journal, Actuators(), ManualClock(0.0))
        assert embedded.port is embedded.dispatcher and embedded.change_tracker is None
    finally:
        journal.close()
