from __future__ import annotations

import json
from pathlib import Path

from tailguard.controller.adapters.annotations.jsonl import FanoutAnnotator, JsonlAnnotator
from tailguard.controller.core.ports import Annotation, OutcomeStatus
from tailguard.controller.testing import FakeAnnotator, permanent_failure, transient_failure

ANNOTATION = Annotation(
    time=100.0,
    time_end=160.0,
    text="P99 1.2s > 0.8s on chat: rolling back",
    tags=["regression"],
    decision_id="d1",
    labels={"service": "chat"},
)


def test_appends_one_json_object_per_line(tmp_path: Path) -> None:
    path = tmp_path / "sub" / "annotations.jsonl"
    annotator = JsonlAnnotator(path)
    assert annotator.annotate(ANNOTATION, idempotency_key="d1:fire:0").status is OutcomeStatus.SUCCEEDED
    assert annotator.annotate(ANNOTATION, idempotency_key="d1:resolve:0").status is OutcomeStatus.SUCCEEDED
    lines = path.read_text().splitlines()
    assert len(lines) == 2
    assert json.loads(lines[0]) == {
        "idempotency_key": "d1:fire:0",
        "time": 100.0,
        "time_end": 160.0,
        "text": ANNOTATION.text,
        "tags": ["regression"],
        "decision_id": "d1",
        "labels": {"service": "chat"},
    }


def test_deduplicated_by_key_across_restarts(tmp_path: Path) -> None:
    path = tmp_path / "annotations.jsonl"
    JsonlAnnotator(path).annotate(ANNOTATION, idempotency_key="k1")
    reopened = JsonlAnnotator(path)  # a new process
    outcome = reopened.annotate(ANNOTATION, idempotency_key="k1")
    assert outcome.status is OutcomeStatus.SUCCEEDED and outcome.detail["deduplicated"] is True
    reopened.annotate(ANNOTATION, idempotency_key="k2")
    assert [e["idempotency_key"] for e in reopened.entries()] == ["k1", "k2"]


def test_a_torn_last_line_is_tolerated_and_terminated(tmp_path: Path) -> None:
    path = tmp_path / "annotations.jsonl"
    JsonlAnnotator(path).annotate(ANNOTATION, idempotency_key="k1")
    with path.open("a") as handle:
        handle.write('{"idempotency_key": "k2", "te')  # the process died mid-write
    annotator = JsonlAnnotator(path)
    assert annotator.keys() == {"k1"}
    annotator.annotate(ANNOTATION, idempotency_key="k2")
    assert [e["idempotency_key"] for e in annotator.entries()] == ["k1", "k2"]


def test_unwritable_path_is_a_failed_outcome(tmp_path: Path) -> None:
    blocker = tmp_path / "file"
    blocker.write_text("x")
    outcome = JsonlAnnotator(blocker / "annotations.jsonl").annotate(ANNOTATION, idempotency_key="k")
    assert outcome.status is OutcomeStatus.FAILED and outcome.transient is False
    assert outcome.error is not None and outcome.error.startswith(f"annotation log {blocker / 'annotations.jsonl'}")


def test_fanout_reaches_all_and_reports_failures(tmp_path: Path) -> None:
    jsonl = JsonlAnnotator(tmp_path / "a.jsonl")
    grafana = FakeAnnotator()
    grafana.script(transient_failure("grafana: HTTP 503"))
    fanout = FanoutAnnotator([jsonl, grafana])
    first = fanout.annotate(ANNOTATION, idempotency_key="k")
    assert first.status is OutcomeStatus.FAILED and first.transient is True
    assert first.error == "FakeAnnotator: grafana: HTTP 503"
    assert jsonl.keys() == {"k"}  # the local log got it despite the other failure
    second = fanout.annotate(ANNOTATION, idempotency_key="k")  # a retry: the JSONL dedups
    assert second.status is OutcomeStatus.SUCCEEDED
    assert len(jsonl.entries()) == 1 and len(grafana.annotations) == 1


def test_fanout_permanent_failure_and_raising_annotator() -> None:
    broken = FakeAnnotator()
    broken.script(RuntimeError("boom"))
    refusing = FakeAnnotator()
    refusing.script(permanent_failure("HTTP 400"))
    outcome = FanoutAnnotator([broken, refusing]).annotate(ANNOTATION, idempotency_key="k")
    assert outcome.status is OutcomeStatus.FAILED and outcome.transient is False
    assert outcome.error == "FakeAnnotator: RuntimeError: boom; FakeAnnotator: HTTP 400"
