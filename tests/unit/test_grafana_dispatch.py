"""Every decision becomes a Grafana region through the dispatcher wrapper, also after a crash and a restart."""

from __future__ import annotations

from pathlib import Path

from tailguard.controller.adapters.annotations.grafana import GrafanaAnnotator, GrafanaHttp
from tailguard.controller.adapters.stores.journal import Journal
from tailguard.controller.adapters.stores.outbox import Backoff, Outbox
from tailguard.controller.core.actions import ActionRequest, ActionType
from tailguard.controller.core.model import Decision, DecisionKind, decision_id, target_key
from tailguard.controller.kit.clock import ManualClock
from tailguard.controller.loop.annotating_dispatcher import DecisionAnnotatingDispatcher
from tailguard.controller.loop.dispatcher import Actuators, Dispatcher, GlobalLimits
from tailguard.controller.testing import FakeAnnotator, FakeRollback
from tests.support.fake_grafana import FakeGrafana

TOKEN = "dispatch-token"
ONSET = 1_700_000_000.0
TARGET = target_key({"service": "chat"})
INCIDENT = decision_id("p99-rollback", "p99-above-800ms", TARGET, ONSET)


def make(kind: DecisionKind, at: float, actions: tuple[ActionRequest, ...] = ()) -> Decision:
    return Decision(
        id=INCIDENT,
        kind=kind,
        policy="p99-rollback",
        condition="p99-above-800ms",
        target=TARGET,
        onset=ONSET,
        at=at,
        fired_at=ONSET + 30,
        resolved_at=at if kind is DecisionKind.RESOLVE else None,
        value=1.2 if kind is DecisionKind.FIRE else 0.5,
        threshold=0.8,
        evidence=((ONSET, 1.0), (ONSET + 15, 1.1), (ONSET + 30, 1.2)),
        actions=actions,
        dry_run=False,
        reason="p99 above 0.8 for 3 evaluations" if kind is DecisionKind.FIRE else "p99 back under 0.8",
    )


def annotator(fake: FakeGrafana, path: Path, clock: ManualClock) -> GrafanaAnnotator:
    return GrafanaAnnotator(GrafanaHttp(fake.url, TOKEN, clock, timeout=2.0), Outbox(path), clock, backoff=Backoff())


def test_fire_and_resolve_become_one_region_and_restart_adds_nothing(tmp_path: Path) -> None:
    clock = ManualClock(ONSET + 30)
    rollback = ActionRequest.of(ActionType.ROLLBACK, {"service": "chat"}, f"{INCIDENT}:fire:0")
    with FakeGrafana(token=TOKEN) as grafana:
        journal = Journal(tmp_path / "journal.db")
        grafana_annotator = annotator(grafana, tmp_path / "outbox.db", clock)
        inner = Dispatcher(journal, Actuators(rollback=FakeRollback(), annotator=FakeAnnotator()), clock,
                           GlobalLimits())  # fmt: skip
        dispatcher = DecisionAnnotatingDispatcher(inner, grafana_annotator, journal)
        fire = make(DecisionKind.FIRE, ONSET + 30, (rollback,))
        journal.record_decision(fire, clock.now())
        dispatcher.dispatch(fire)
        clock.advance(300)
        resolve = make(DecisionKind.RESOLVE, ONSET + 330)
        journal.record_decision(resolve, clock.now())
        dispatcher.dispatch(resolve)
        assert grafana_annotator.flush() == 2
        [region] = grafana.annotations()
        assert region["time"] == int(ONSET * 1000) and region["timeEnd"] == int((ONSET + 330) * 1000)
        assert f"decision:{INCIDENT}" in region["tags"] and "condition:p99-above-800ms" in region["tags"]
        journal.close()
        grafana_annotator.outbox.close()

        # A new process: resume re-enqueues the journal's decisions, all deduplicated.
        journal = Journal(tmp_path / "journal.db")
        grafana_annotator = annotator(grafana, tmp_path / "outbox.db", clock)
        inner = Dispatcher(journal, Actuators(rollback=FakeRollback()), clock, GlobalLimits())
        DecisionAnnotatingDispatcher(inner, grafana_annotator, journal).resume()
        assert grafana_annotator.outbox.pending() == []
        assert grafana_annotator.flush() == 0
        assert len(grafana.requests("POST")) == 1 and len(grafana.requests("PATCH")) == 1
        journal.close()
        grafana_annotator.outbox.close()


def test_crash_before_the_enqueue_is_repaired_by_resume(tmp_path: Path) -> None:
    clock = ManualClock(ONSET + 30)
    with FakeGrafana(token=TOKEN) as grafana:
        journal = Journal(tmp_path / "journal.db")
        journal.record_decision(make(DecisionKind.FIRE, ONSET + 30), clock.now())  # committed, then the crash
        grafana_annotator = annotator(grafana, tmp_path / "outbox.db", clock)
        inner = Dispatcher(journal, Actuators(), clock, GlobalLimits())
        DecisionAnnotatingDispatcher(inner, grafana_annotator, journal).resume()
        assert grafana_annotator.flush() == 1
        [region] = grafana.annotations()
        assert "p99 above 0.8 for 3 evaluations" in region["text"]
        journal.close()
        grafana_annotator.outbox.close()
