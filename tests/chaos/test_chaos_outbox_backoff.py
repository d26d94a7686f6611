"""Issue 16 (8): Grafana recovery is quick. The outbox's retry wait is capped (MAX_RETRY_DELAY, 30 s), starts over
for the next item once one is delivered, and does not survive a restart. Deterministic: a ManualClock and a Grafana
stand-in that is down, then back.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

from tailguard.controller.adapters.annotations.grafana import GrafanaAnnotator
from tailguard.controller.adapters.stores.outbox import MAX_RETRY_DELAY, Backoff, Outbox, OutboxStatus, OutboxWorker
from tailguard.controller.core.ports import Annotation, OutcomeStatus
from tailguard.controller.kit.clock import ManualClock
from tailguard.controller.kit.http import HttpAnswer


class FlakyGrafana:
    """A GrafanaPort that refuses every call with a 503 while `down`; records when each call came."""

    def __init__(self, clock: ManualClock) -> None:
        self.clock = clock
        self.down = True
        self.calls: list[float] = []
        self.created: list[Mapping[str, Any]] = []

    def call(self, method: str, path: str, body: Mapping[str, Any] | None = None, *, retry: bool = False) -> HttpAnswer:
        self.calls.append(self.clock.now())
        if self.down:
            return HttpAnswer(503, None, "", f"{method} {path}: HTTP 503: down", True, 1)
        if method == "GET":
            return HttpAnswer(200, [], "[]", None, False, 1)  # a lookup: nothing landed earlier
        assert method == "POST" and body is not None
        self.created.append(body)
        return HttpAnswer(200, {"id": len(self.created)}, "", None, False, 1)


def annotate(annotator: GrafanaAnnotator, clock: ManualClock, key: str) -> None:
    outcome = annotator.annotate(Annotation(clock.now(), f"note {key}", ["test"]), idempotency_key=key)
    assert outcome.status is OutcomeStatus.SUCCEEDED


def run_until_delivered(annotator: GrafanaAnnotator, clock: ManualClock, horizon: float) -> None:
    """What the worker does, on the ManualClock: a pass whenever the head is due."""
    end = clock.now() + horizon
    while clock.now() < end and annotator.outbox.pending():
        annotator.flush()
        head = annotator.outbox.head()
        if head is not None:
            clock.advance(max(0.0, head.next_attempt_at - clock.now()))


def test_the_default_backoff_is_capped_at_30_seconds() -> None:
    assert MAX_RETRY_DELAY == 30.0
    assert Backoff().max_delay == MAX_RETRY_DELAY
    assert max(Backoff().delay(attempts) for attempts in range(1, 60)) == MAX_RETRY_DELAY


def test_after_a_long_outage_grafana_is_used_again_within_the_cap(tmp_path: Path) -> None:
    clock = ManualClock()
    grafana = FlakyGrafana(clock)
    annotator = GrafanaAnnotator(grafana, Outbox(tmp_path / "outbox.db"), clock)  # production defaults
    try:
        annotate(annotator, clock, "first")
        # Down for an hour: retried throughout, never more than the cap apart.
        outage_end = clock.now() + 3600
        while clock.now() < outage_end:
            annotator.flush()
            head = annotator.outbox.head()
            assert head is not None and head.next_attempt_at - clock.now() <= MAX_RETRY_DELAY
            clock.advance(head.next_attempt_at - clock.now())
        gaps = [later - earlier for earlier, later in zip(grafana.calls, grafana.calls[1:], strict=False)]
        assert max(gaps) <= MAX_RETRY_DELAY
        back_at = clock.now() + 1  # Grafana comes back just after an attempt failed
        clock.advance(1)
        grafana.down = False
        run_until_delivered(annotator, clock, horizon=120)
        assert len(grafana.created) == 1
        assert grafana.calls[-1] - back_at <= MAX_RETRY_DELAY  # was up to 300 s (158 s measured)
        # Reset on success: the next item starts over at the first backoff, not at the last item's wait.
        grafana.down = True
        annotate(annotator, clock, "second")
        annotator.flush()
        head = annotator.outbox.head()
        assert head is not None and head.next_attempt_at - clock.now() == Backoff().initial
    finally:
        annotator.close()


def test_a_restart_does_not_inherit_the_stored_backoff(tmp_path: Path) -> None:
    clock = ManualClock()
    grafana = FlakyGrafana(clock)
    path = tmp_path / "outbox.db"
    # The old process waited a long time (an outbox written by a version with a 300 s cap).
    old = GrafanaAnnotator(grafana, Outbox(path), clock, backoff=Backoff(max_delay=300.0))
    annotate(old, clock, "first")
    for _ in range(12):
        old.flush()
        head = old.outbox.head()
        assert head is not None
        clock.advance(head.next_attempt_at - clock.now())
    old.flush()
    head = old.outbox.head()
    assert head is not None and head.next_attempt_at - clock.now() == 300.0
    old.close()

    grafana.down = False
    restarted = Outbox(path)
    worker = OutboxWorker(restarted, lambda item: GrafanaAnnotator(grafana, restarted, clock).deliver(item), clock)
    worker.start()
    try:
        head = restarted.head()
        # Due now, not in 300 s; the worker delivers it in its first pass (real time: a short bounded wait).
        assert head is None or head.next_attempt_at <= clock.now()
        for _ in range(200):
            if not restarted.pending():
                break
            worker.wake()
            worker._stop.wait(0.01)
        [item] = restarted.items()
        assert item.status is OutboxStatus.DELIVERED and len(grafana.created) == 1
    finally:
        worker.stop()
        restarted.close()
