"""GrafanaAnnotator against the spec-validating fake Grafana: exactly once through 401/500/timeout/down-then-up."""

from __future__ import annotations

import logging
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

from tailguard.controller.adapters.annotations.grafana import (
    GrafanaAnnotator,
    GrafanaHttp,
    decision_text,
    key_tag,
)
from tailguard.controller.adapters.annotations.jsonl import FanoutAnnotator, JsonlAnnotator
from tailguard.controller.adapters.annotations.settings import GrafanaSettings, GrafanaTokenError
from tailguard.controller.adapters.stores.outbox import Backoff, Outbox, OutboxStatus
from tailguard.controller.core.ports import Annotation, OutcomeStatus
from tailguard.controller.kit.clock import ManualClock
from tests.support.fake_grafana import FakeGrafana, SpecViolation, _load_operations, check_request

TOKEN = "glsa_secret_token_value"
ONSET = 1_700_000_000.0


@dataclass(frozen=True)
class Rollout:
    labels: dict[str, str]
    revision: str
    previous_revision: str | None
    at: float
    source: str
    diff: dict[str, Any] = field(default_factory=dict)


@pytest.fixture
def grafana() -> Iterator[FakeGrafana]:
    with FakeGrafana(token=TOKEN) as fake:
        yield fake


def annotator_for(fake: FakeGrafana, path: Path, clock: ManualClock, *, timeout: float = 2.0) -> GrafanaAnnotator:
    http = GrafanaHttp(fake.url, TOKEN, clock, timeout=timeout, retries=2)
    return GrafanaAnnotator(http, Outbox(path), clock, backoff=Backoff(initial=1.0, max_delay=30.0))


def decision(kind: str, **extra: Any) -> dict[str, Any]:
    body: dict[str, Any] = {
        "id": "d0c151011d000001",
        "kind": kind,
        "policy": "p99-rollback",
        "condition": "p99-above-800ms",
        "target": {"service": "chat"},
        "onset": ONSET,
        "at": ONSET + 45,
        "fired_at": ONSET + 45,
        "resolved_at": None,
        "value": 1.23,
        "threshold": 0.8,
        "evidence": [[ONSET, 1.1]],
        "actions": [{"type": "rollback", "params": {"service": "chat"}, "idempotency_key": "k"}],
        "dry_run": False,
        "reason": "p99 above 0.8 for 3 evaluations",
        "branch": "attributedToRollout -> rollback",
        "attribution": {"revision": "r7", "previous_revision": "r6", "source": "argocd", "at": ONSET - 60},
    }
    body.update(extra)
    return body


def deliver_all(annotator: GrafanaAnnotator, clock: ManualClock, rounds: int = 10) -> None:
    for _ in range(rounds):
        annotator.flush()
        if not annotator.outbox.pending():
            return
        clock.advance(60)


def test_decision_region_opens_at_onset_and_closes_with_patch(grafana: FakeGrafana, tmp_path: Path) -> None:
    clock = ManualClock(ONSET + 50)
    annotator = annotator_for(grafana, tmp_path / "outbox.db", clock)
    outcome = annotator.annotate_decision(decision("fire"))
    assert outcome.status is OutcomeStatus.SUCCEEDED and outcome.detail["queued"] is True
    assert grafana.requests() == []  # durable enqueue only: no HTTP while deciding
    assert annotator.flush() == 1
    [opened] = grafana.annotations()
    assert opened["time"] == int(ONSET * 1000)
    assert opened["timeEnd"] == opened["time"]  # a point until it resolves
    for tag in ("tailguard", "policy:p99-rollback", "condition:p99-above-800ms", "decision:d0c151011d000001"):
        assert tag in opened["tags"]
    assert "attributed to rollout r7 (from r6) via argocd" in opened["text"]
    assert "branch: attributedToRollout -> rollback" in opened["text"]
    assert "p99 above 0.8 for 3 evaluations" in opened["text"]

    annotator.annotate_decision(decision("resolve", at=ONSET + 600, resolved_at=ONSET + 600, value=0.4))
    assert annotator.flush() == 1
    [region] = grafana.annotations()
    assert region["id"] == opened["id"]
    assert region["timeEnd"] == int((ONSET + 600) * 1000)
    assert "resolved" in region["tags"]
    assert [r.method for r in grafana.requests()] == ["POST", "PATCH"]
    assert grafana.requests("PATCH")[0].path == f"/api/annotations/{opened['id']}"
    assert grafana.state.rejections == []


def test_enqueue_twice_delivers_once(grafana: FakeGrafana, tmp_path: Path) -> None:
    clock = ManualClock(ONSET)
    annotator = annotator_for(grafana, tmp_path / "outbox.db", clock)
    annotation = Annotation(time=ONSET, text="rolled back chat", tags=["regression"], decision_id="abc")
    first = annotator.annotate(annotation, idempotency_key="abc:fire:0")
    second = annotator.annotate(annotation, idempotency_key="abc:fire:0")
    assert first.detail["queued"] is True and second.detail["deduplicated"] is True
    deliver_all(annotator, clock)
    [stored] = grafana.annotations()
    assert key_tag("abc:fire:0") in stored["tags"] and "incident:abc" in stored["tags"]
    assert len(grafana.requests("POST")) == 1


def test_401_keeps_the_annotation_until_the_token_works(grafana: FakeGrafana, tmp_path: Path) -> None:
    clock = ManualClock(ONSET)
    annotator = annotator_for(grafana, tmp_path / "outbox.db", clock)
    grafana.state.token = "rotated"
    annotator.annotate_decision(decision("fire"))
    assert annotator.flush() == 0
    [item] = annotator.outbox.pending()
    assert "401" in (item.last_error or "")
    assert TOKEN not in (item.last_error or "")
    grafana.state.token = TOKEN
    deliver_all(annotator, clock)
    assert len(grafana.annotations()) == 1
    assert annotator.outbox.pending() == []


def test_500_then_success_no_duplicate(grafana: FakeGrafana, tmp_path: Path) -> None:
    clock = ManualClock(ONSET)
    annotator = annotator_for(grafana, tmp_path / "outbox.db", clock)
    grafana.fail_next(500)
    annotator.annotate_decision(decision("fire"))
    assert annotator.flush() == 0
    [item] = annotator.outbox.pending()
    assert item.next_attempt_at > clock.now()  # backoff: not retried before it is due
    assert annotator.flush() == 0
    clock.advance(5)
    assert annotator.flush() == 1
    assert len(grafana.annotations()) == 1


def test_timeout_after_the_post_landed_is_found_by_tag_not_posted_again(grafana: FakeGrafana, tmp_path: Path) -> None:
    clock = ManualClock(ONSET)
    annotator = annotator_for(grafana, tmp_path / "outbox.db", clock, timeout=0.3)
    grafana.delay_next(1.0)  # Grafana stores it, then answers too late
    annotator.annotate_decision(decision("fire"))
    assert annotator.flush() == 0
    assert len(grafana.annotations()) == 1
    clock.advance(5)
    assert annotator.flush() == 1
    assert len(grafana.annotations()) == 1
    gets = grafana.requests("GET")
    assert gets and "tags=decision%3Ad0c151011d000001" in gets[0].query
    # The id found by the lookup is the one the resolve PATCHes.
    annotator.annotate_decision(decision("resolve", resolved_at=ONSET + 300))
    assert annotator.flush() == 1
    [region] = grafana.annotations()
    assert region["timeEnd"] == int((ONSET + 300) * 1000)
    assert len(grafana.requests("POST")) == 1


def test_down_then_up_delivers_in_order_exactly_once(grafana: FakeGrafana, tmp_path: Path) -> None:
    clock = ManualClock(ONSET)
    annotator = annotator_for(grafana, tmp_path / "outbox.db", clock)
    grafana.down()
    annotator.annotate_rollout(Rollout({"service": "chat"}, "r7", "r6", ONSET - 60, "argocd", {}))
    annotator.annotate_decision(decision("fire"))
    annotator.annotate_decision(decision("resolve", resolved_at=ONSET + 900))
    for _ in range(3):
        assert annotator.flush() == 0
        clock.advance(120)
    assert len(annotator.outbox.pending()) == 3
    grafana.up()
    deliver_all(annotator, clock)
    annotations = grafana.annotations()
    assert len(annotations) == 2  # the rollout and the decision's region
    assert [r.method for r in grafana.requests() if r.method != "GET"] == ["POST", "POST", "PATCH"]
    region = next(a for a in annotations if "region" in a["tags"])
    assert region["timeEnd"] == int((ONSET + 900) * 1000)


def test_outbox_survives_a_restart_and_resumes(grafana: FakeGrafana, tmp_path: Path) -> None:
    clock = ManualClock(ONSET)
    path = tmp_path / "outbox.db"
    grafana.down()
    first = annotator_for(grafana, path, clock)
    first.annotate_decision(decision("fire"))
    first.annotate(Annotation(time=ONSET, text="scaled", tags=["scale"]), idempotency_key="x:fire:1")
    assert first.flush() == 0
    first.outbox.close()  # the process dies

    grafana.up()
    clock.advance(600)
    second = annotator_for(grafana, path, clock)
    assert len(second.outbox.pending()) == 2
    deliver_all(second, clock)
    assert len(grafana.annotations()) == 2
    # A third process finds nothing left to do and posts nothing.
    second.outbox.close()
    third = annotator_for(grafana, path, clock)
    assert third.flush() == 0
    assert len(grafana.requests("POST")) == 2


def test_resolve_without_a_delivered_opening_posts_the_whole_region(grafana: FakeGrafana, tmp_path: Path) -> None:
    clock = ManualClock(ONSET)
    annotator = annotator_for(grafana, tmp_path / "outbox.db", clock)
    annotator.annotate_decision(decision("resolve", resolved_at=ONSET + 120))
    deliver_all(annotator, clock)
    [region] = grafana.annotations()
    assert region["time"] == int(ONSET * 1000) and region["timeEnd"] == int((ONSET + 120) * 1000)


def test_rejected_by_spec_is_dead_not_retried_forever(grafana: FakeGrafana, tmp_path: Path) -> None:
    clock = ManualClock(ONSET)
    annotator = annotator_for(grafana, tmp_path / "outbox.db", clock)
    annotator.outbox.enqueue("bad", "grafana.create", {"body": {"text": "x", "tme": 1}, "lookup": []}, clock.now())
    annotator.annotate(Annotation(time=ONSET, text="after", tags=[]), idempotency_key="after")
    deliver_all(annotator, clock)
    assert annotator.outbox.get("bad").status is OutboxStatus.DEAD  # type: ignore[union-attr]
    assert "tme" in grafana.state.rejections[0]
    assert [a["text"] for a in grafana.annotations()] == ["after"]


def test_rollout_annotation_carries_revision_and_engine_arg_diff(grafana: FakeGrafana, tmp_path: Path) -> None:
    clock = ManualClock(ONSET)
    annotator = annotator_for(grafana, tmp_path / "outbox.db", clock)
    diff = {"--max-num-seqs": ("256", "8"), "--kv-cache-dtype": {"old": None, "new": "fp8"}}
    rollout = Rollout({"service": "chat", "namespace": "llm"}, "r8", "r7", ONSET, "argocd", diff)
    annotator.annotate_rollout(rollout)
    annotator.annotate_rollout(rollout)  # seen again by the tracker: still one annotation
    deliver_all(annotator, clock)
    [stored] = grafana.annotations()
    assert {"rollout", "revision:r8", "service:chat", "namespace:llm"} <= set(stored["tags"])
    assert "--max-num-seqs: 256 -> 8" in stored["text"]
    assert "--kv-cache-dtype: (unset) -> fp8" in stored["text"]
    assert stored["time"] == int(ONSET * 1000)


def test_fanout_with_jsonl_keeps_both(grafana: FakeGrafana, tmp_path: Path) -> None:
    clock = ManualClock(ONSET)
    grafana_annotator = annotator_for(grafana, tmp_path / "outbox.db", clock)
    jsonl = JsonlAnnotator(tmp_path / "annotations.jsonl")
    fanout = FanoutAnnotator([jsonl, grafana_annotator])
    outcome = fanout.annotate(Annotation(time=ONSET, text="hello", tags=["t"]), idempotency_key="k1")
    assert outcome.status is OutcomeStatus.SUCCEEDED
    grafana_annotator.flush()
    assert len(jsonl.entries()) == 1 and len(grafana.annotations()) == 1


def test_token_never_logged(grafana: FakeGrafana, tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.DEBUG)
    clock = ManualClock(ONSET)
    annotator = annotator_for(grafana, tmp_path / "outbox.db", clock)
    grafana.state.token = "other"
    annotator.annotate_decision(decision("fire"))
    annotator.flush()
    assert TOKEN not in caplog.text
    assert all(TOKEN not in (item.last_error or "") for item in annotator.outbox.items())


def test_worker_thread_delivers_after_grafana_returns(grafana: FakeGrafana, tmp_path: Path) -> None:
    clock = ManualClock(ONSET)
    annotator = annotator_for(grafana, tmp_path / "outbox.db", clock)
    annotator.backoff = Backoff(initial=0.0, max_delay=0.05)
    annotator.start(idle_interval=0.05)
    try:
        annotator.annotate_decision(decision("fire"))
        for _ in range(200):
            if grafana.annotations():
                break
            import time

            time.sleep(0.02)
        assert len(grafana.annotations()) == 1
    finally:
        annotator.close()


def test_settings_token_sources(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    token_file = tmp_path / "token"
    token_file.write_text(" abc \n")
    assert GrafanaSettings(url="http://g:3000/", tokenFile=token_file).token() == "abc"
    monkeypatch.setenv("GRAFANA_TOKEN", "xyz")
    settings = GrafanaSettings(url="http://g:3000", tokenEnv="GRAFANA_TOKEN")
    assert settings.token() == "xyz" and settings.url == "http://g:3000"
    monkeypatch.delenv("GRAFANA_TOKEN")
    with pytest.raises(GrafanaTokenError, match="GRAFANA_TOKEN is not set"):
        settings.token()
    with pytest.raises(GrafanaTokenError, match="is empty"):
        (tmp_path / "empty").write_text("\n")
        GrafanaSettings(url="http://g", tokenFile=tmp_path / "empty").token()
    with pytest.raises(ValueError, match="http"):
        GrafanaSettings(url="g:3000")


def test_decision_text_without_attribution_says_so() -> None:
    text = decision_text(decision("fire", attribution=None, branch=None))
    assert "not attributed to a rollout" in text and "branch" not in text


@pytest.mark.parametrize(
    ("method", "path", "query", "body", "message"),
    [
        ("POST", "/api/annotations", "", {"txt": "x"}, "missing required property 'text'"),
        ("POST", "/api/annotations", "", {"text": "x", "time": "now"}, "expected integer"),
        ("POST", "/api/annotations", "", {"text": "x", "colour": "red"}, "'colour' is not declared"),
        ("GET", "/api/annotations", "tag=a", None, "'tag' is not declared"),
        ("GET", "/api/annotations", "limit=ten", None, "expected an integer"),
        ("GET", "/api/annotations", "type=other", None, "is not one of"),
        ("PUT", "/api/annotations", "", {"text": "x"}, "not allowed"),
        ("POST", "/api/annotation", "", {"text": "x"}, "no such path"),
        ("PATCH", "/api/annotations/3", "", {"timeEnd": 1.5}, "expected integer"),
        ("POST", "/api/dashboards/db", "", {"dashboard": {}, "overwrite": "yes"}, "expected boolean"),
    ],
)
def test_fake_rejects_what_the_spec_does_not_allow(method: str, path: str, query: str, body: Any, message: str) -> None:
    with pytest.raises(SpecViolation, match=message):
        check_request(_load_operations(), method, path, query, body)
