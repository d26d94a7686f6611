"""Generic and Slack-compatible webhook payloads: shape, HMAC signature, retries, links with the right time range."""

from __future__ import annotations

import json
from typing import Any
from urllib.parse import parse_qs, urlsplit

import pytest
from pydantic import ValidationError

from tailguard.controller.adapters.notify.webhook import (
    SIGNATURE_HEADER,
    TIMESTAMP_HEADER,
    LinkSettings,
    WebhookNotifier,
    WebhookReceiver,
    decision_links,
    slack_payload,
    verify_signature,
)
from tailguard.controller.core.ports import NotifyPayload, NotifyRequest, OutcomeStatus
from tailguard.controller.kit.clock import ManualClock
from tests.support.dispatch import dispatched
from tests.support.webhook_receiver import receiver

SECRET = "payload-secret"
ONSET = 1_700_000_000.0


def decision(**extra: Any) -> dict[str, Any]:
    body: dict[str, Any] = {
        "id": "abcdef0123456789",
        "kind": "fire",
        "policy": "p99-rollback",
        "condition": "p99-above-800ms",
        "target": {"namespace": "llm", "service": "chat", "version": "r2"},
        "onset": ONSET,
        "at": ONSET + 45,
        "resolved_at": None,
        "value": 1.5,
        "threshold": 0.8,
        "evidence": [[ONSET, 0.9], [ONSET + 15, 1.2], [ONSET + 30, 1.5]],
        "dry_run": False,
        "reason": "p99 > 0.8 for 3 evaluations",
        "branch": "attributedToRollout",
        "attribution": {"revision": "r2", "previous_revision": "r1"},
    }
    body.update(extra)
    return body


LINKS = LinkSettings(
    grafanaUrl="https://grafana.example.com/", dashboardUid="tailguard-vllm-slo", argocdUrl="https://argocd.example.com"
)


def payload(**extra: Any) -> dict[str, Any]:
    d = decision(**extra)
    return {
        "message": "P99 regression on chat: rolling back",
        "decision": d,
        "evidence": d["evidence"],
        "actions": [{"type": "rollback", "status": "succeeded"}],
        "links": decision_links(LINKS, d, ONSET + 60),
    }


def test_links_open_15m_before_onset_to_5m_after_now_in_ms() -> None:
    links = decision_links(LINKS, decision(), ONSET + 60)
    url = urlsplit(links["grafana"])
    assert f"{url.scheme}://{url.netloc}{url.path}" == "https://grafana.example.com/d/tailguard-vllm-slo"
    query = parse_qs(url.query)
    assert query["from"] == [str(int((ONSET - 900) * 1000))]
    assert query["to"] == [str(int((ONSET + 60 + 300) * 1000))]
    assert query["var-service"] == ["chat"] and query["var-namespace"] == ["llm"] and query["var-version"] == ["r2"]
    assert links["argocd"] == "https://argocd.example.com/applications/chat"


def test_links_of_a_resolved_decision_end_at_the_resolution() -> None:
    links = decision_links(LINKS, decision(kind="resolve", resolved_at=ONSET + 600), ONSET + 5000)
    query = parse_qs(urlsplit(links["grafana"]).query)
    assert query["to"] == [str(int((ONSET + 600 + 300) * 1000))]


def test_links_only_for_what_is_configured() -> None:
    assert decision_links(LinkSettings(), decision(), ONSET) == {}
    only_argo = LinkSettings(argocdUrl="https://argo", argocdApp="{namespace}-{service}")
    assert decision_links(only_argo, decision(), ONSET) == {"argocd": "https://argo/applications/llm-chat"}
    # A template naming a label the target lacks gives no link rather than a wrong one.
    assert decision_links(LinkSettings(argocdUrl="https://argo", argocdApp="{app}"), decision(), ONSET) == {}
    with pytest.raises(ValidationError, match="http"):
        LinkSettings(grafanaUrl="grafana:3000")


def test_generic_payload_carries_decision_evidence_links_and_is_signed(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("TG_PAYLOAD_SECRET", SECRET)
    with receiver() as (url, state):
        clock = ManualClock(ONSET + 60)
        notifier = WebhookNotifier({"ops": WebhookReceiver(url=url, secretEnv="TG_PAYLOAD_SECRET")}, clock)
        outcome = notifier.notify(
            NotifyRequest("ops", NotifyPayload.from_json(payload()), idempotency_key="abcdef0123456789:fire:2")
        )
    assert outcome.status is OutcomeStatus.SUCCEEDED and outcome.detail["format"] == "generic"
    [(headers, body)] = state.requests
    assert verify_signature(SECRET, headers[TIMESTAMP_HEADER], body, headers[SIGNATURE_HEADER], now=clock.now())
    sent = json.loads(body)
    assert sent["decision"]["id"] == "abcdef0123456789"
    assert sent["evidence"][-1] == [ONSET + 30, 1.5]
    assert set(sent["links"]) == {"grafana", "argocd"}
    assert sent["idempotency_key"] == "abcdef0123456789:fire:2" and sent["receiver"] == "ops"


def test_slack_payload_is_text_and_blocks_signed_and_retried(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("TG_PAYLOAD_SECRET", SECRET)
    with receiver(503) as (url, state):
        settings = WebhookReceiver(url=url, secretEnv="TG_PAYLOAD_SECRET", format="slack")
        clock = ManualClock(ONSET + 60)
        notifier = WebhookNotifier({"slack": settings}, clock)
        outcome = dispatched(
            lambda: notifier.notify(
                NotifyRequest("slack", NotifyPayload.from_json(payload()), idempotency_key="k:fire:1")
            ),
            clock=clock,
            backoff=0.01,
        )
    assert outcome.status is OutcomeStatus.SUCCEEDED and outcome.detail["attempts"] == 2
    assert len(state.requests) == 2 and state.requests[0][1] == state.requests[1][1]  # the same message again
    headers, body = state.requests[1]
    assert verify_signature(SECRET, headers[TIMESTAMP_HEADER], body, headers[SIGNATURE_HEADER], now=clock.now())
    sent = json.loads(body)
    assert set(sent) == {"text", "blocks"}  # nothing Slack would not understand
    assert "p99-rollback/p99-above-800ms" in sent["text"] and "rolling back" in sent["text"]
    kinds = [block["type"] for block in sent["blocks"]]
    assert kinds[0] == "header" and "actions" in kinds and kinds[-1] == "context"
    buttons = next(block for block in sent["blocks"] if block["type"] == "actions")["elements"]
    urls = {button["text"]["text"]: button["url"] for button in buttons}
    assert urls["Argo CD app"] == "https://argocd.example.com/applications/chat"
    assert f"from={int((ONSET - 900) * 1000)}" in urls["Grafana dashboard"]
    everything = json.dumps(sent)
    assert "attributed to rollout* r2" in everything and "rollback: succeeded" in everything
    assert "abcdef0123456789" in everything


def test_slack_text_is_escaped_and_blocks_are_bounded() -> None:
    sent = slack_payload({"message": "<script> & " + "x" * 5000, "decision": decision(policy="a<b")})
    section = sent["blocks"][1]["text"]["text"]
    assert "&lt;script&gt; &amp;" in section and len(section) <= 3000
    assert len(sent["blocks"][0]["text"]["text"]) <= 150


def test_slack_payload_without_links_or_decision_still_valid() -> None:
    sent = slack_payload({"message": "hello"})
    assert sent["text"].endswith("hello")
    assert all(block["type"] != "actions" for block in sent["blocks"])


def test_unknown_format_is_rejected() -> None:
    with pytest.raises(ValidationError, match="generic"):
        WebhookReceiver(url="http://127.0.0.1:1/x", secretEnv="X", format="teams")
