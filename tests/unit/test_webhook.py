from __future__ import annotations

import hashlib
import hmac
import json
import logging
from pathlib import Path
from typing import Any

import pytest
from pydantic import ValidationError

from tailguard.controller.adapters.notify.webhook import WebhookNotifier, WebhookReceiver, sign, verify_signature
from tailguard.controller.core.ports import NotifyPayload, NotifyRequest, OutcomeStatus
from tailguard.controller.kit.clock import ManualClock
from tests.support.dispatch import dispatched
from tests.support.webhook_receiver import receiver

SECRET = "s3cr3t-value"


@pytest.fixture
def secret_env(monkeypatch: pytest.MonkeyPatch) -> str:
    monkeypatch.setenv("TG_TEST_WEBHOOK_SECRET", SECRET)
    return "TG_TEST_WEBHOOK_SECRET"


def test_hmac_sha256_matches_rfc4231_case_2() -> None:
    expected = "5bdcc146bf60754e6a042426089575c75a003f089d2739839dec58b964ec3843"
    assert hmac.new(b"Jefe", b"what do ya want for nothing?", hashlib.sha256).hexdigest() == expected


def test_signature_against_a_known_vector() -> None:
    # Computed independently:
    # printf '%s' '1700000000.{"decision":{"id":"abc"}}' | openssl dgst -sha256 -hmac ...
    body = '{"decision":{"id":"abc"}}'
    expected = "sha256=109da400b130dcca1cdc9d1053a1039527ab62a1d3c0c94a921c239895c0f17b"
    assert sign(SECRET, "1700000000", body) == expected
    now = 1_700_000_010.0  # the receiver's clock, ten seconds later
    assert verify_signature(SECRET, "1700000000", body.encode(), expected, now=now)
    assert not verify_signature(SECRET, "1700000001", body, expected, now=now)  # another timestamp
    assert not verify_signature(SECRET, "1700000000", body + " ", expected, now=now)  # another body
    assert not verify_signature("other", "1700000000", body, expected, now=now)
    assert not verify_signature(SECRET, "1700000000", body, expected.removeprefix("sha256="), now=now)


def test_a_signature_outside_the_replay_window_is_refused() -> None:
    """Issue 24: the helper had no replay window: a notification captured once verified forever."""
    body = '{"decision":{"id":"abc"}}'
    signed = sign(SECRET, "1700000000", body)
    assert verify_signature(SECRET, "1700000000", body, signed, now=1_700_000_000.0 + 299)
    assert verify_signature(SECRET, "1700000000", body, signed, now=1_700_000_000.0 - 299)  # sender's clock ahead
    assert not verify_signature(SECRET, "1700000000", body, signed, now=1_700_000_000.0 + 301)  # replayed later
    assert not verify_signature(SECRET, "1700000000", body, signed, now=1_700_000_000.0 - 301)
    assert not verify_signature(SECRET, "1700000000", body, signed)  # today's clock: years later
    assert verify_signature(SECRET, "1700000000", body, signed, now=1_700_003_000.0, window=3600)
    assert not verify_signature(SECRET, "nan", body, sign(SECRET, "nan", body), now=1_700_000_000.0)


def test_a_retry_late_in_the_window_is_signed_afresh(secret_env: str) -> None:
    """A retry keeps its first timestamp (the same message) while a receiver would still accept it; a retry past
    half the replay window gets a new timestamp, so a receiver never refuses a genuine retry as a replay."""
    clock = ManualClock(1_700_000_000.0)
    with receiver() as (url, state):
        notifier = WebhookNotifier({"oncall": WebhookReceiver(url=url, secretEnv=secret_env)}, clock)
        for advance in (0.0, 100.0, 100.0):  # sent at +0, +100, +200 (half the window is 150)
            clock.advance(advance)
            notifier.notify(
                NotifyRequest(
                    "oncall", NotifyPayload.from_json({"decision": {"id": "d1"}}), idempotency_key="d1:fire:2"
                )
            )
    stamps = [headers["X-Tailguard-Timestamp"] for headers, _ in state.requests]
    assert stamps == ["1700000000", "1700000000", "1700000200"]
    for (headers, body), now in zip(state.requests, (1_700_000_000.0, 1_700_000_100.0, 1_700_000_200.0), strict=True):
        assert verify_signature(
            SECRET, headers["X-Tailguard-Timestamp"], body, headers["X-Tailguard-Signature"], now=now
        )


def test_notify_posts_signed_json(secret_env: str) -> None:
    clock = ManualClock(1_700_000_000.0)
    with receiver() as (url, state):
        notifier = WebhookNotifier({"oncall": WebhookReceiver(url=url, secretEnv=secret_env)}, clock)
        payload = {"decision": {"id": "d1"}, "evidence": [[1.0, 1.2]], "actions": [], "links": {}}
        outcome = notifier.notify(
            NotifyRequest("oncall", NotifyPayload.from_json(payload), idempotency_key="d1:fire:2")
        )
    assert outcome.status is OutcomeStatus.SUCCEEDED and outcome.detail["http_status"] == 200
    [(headers, body)] = state.requests
    assert headers["X-Tailguard-Timestamp"] == "1700000000"
    assert headers["Idempotency-Key"] == "d1:fire:2"
    assert headers["Content-Type"] == "application/json"
    assert verify_signature(
        SECRET, headers["X-Tailguard-Timestamp"], body, headers["X-Tailguard-Signature"], now=clock.now()
    )
    sent = json.loads(body)
    assert sent["decision"] == {"id": "d1"} and sent["evidence"] == [[1.0, 1.2]]
    assert sent["receiver"] == "oncall" and sent["idempotency_key"] == "d1:fire:2"


def test_503_is_retried_then_succeeds(secret_env: str) -> None:
    clock = ManualClock()
    with receiver(503, 503) as (url, state):
        notifier = WebhookNotifier({"r": WebhookReceiver(url=url, secretEnv=secret_env, retries=3)}, clock)
        start = clock.now()
        outcome = dispatched(
            lambda: notifier.notify(NotifyRequest("r", NotifyPayload.from_json({"decision": {}}), idempotency_key="k")),
            clock=clock,
            attempts=3,
            backoff=1.0,
        )
    assert outcome.status is OutcomeStatus.SUCCEEDED and outcome.detail["attempts"] == 3
    assert len(state.requests) == 3
    assert clock.now() - start == pytest.approx(1.0 + 2.0)
    # Every attempt is the same message: same body, timestamp, signature and key.
    assert len({(h["X-Tailguard-Signature"], h["Idempotency-Key"], b) for h, b in state.requests}) == 1


def test_400_is_not_retried(secret_env: str) -> None:
    with receiver(400) as (url, state):
        notifier = WebhookNotifier({"r": WebhookReceiver(url=url, secretEnv=secret_env, retries=3)}, ManualClock())
        outcome = notifier.notify(NotifyRequest("r", NotifyPayload.from_json({}), idempotency_key="k"))
    assert outcome.status is OutcomeStatus.FAILED and outcome.transient is False
    assert outcome.error is not None and "HTTP 400" in outcome.error
    assert len(state.requests) == 1


def test_503_until_the_bound_is_a_transient_failure(secret_env: str) -> None:
    with receiver(503, 503, 503) as (url, state):
        clock = ManualClock()
        notifier = WebhookNotifier({"r": WebhookReceiver(url=url, secretEnv=secret_env, retries=2)}, clock)
        outcome = dispatched(
            lambda: notifier.notify(NotifyRequest("r", NotifyPayload.from_json({}), idempotency_key="k")),
            clock=clock,
            attempts=2,
        )
    assert outcome.status is OutcomeStatus.FAILED and outcome.transient is True
    assert len(state.requests) == 2


def test_secret_never_logged_nor_in_errors(secret_env: str, caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.DEBUG)  # every logger, urllib3's included
    with receiver(503, 503, 500) as (url, _state):
        clock = ManualClock()
        notifier = WebhookNotifier({"r": WebhookReceiver(url=url, secretEnv=secret_env, retries=3)}, clock)
        outcome = dispatched(
            lambda: notifier.notify(NotifyRequest("r", NotifyPayload.from_json({"decision": {}}), idempotency_key="k")),
            clock=clock,
        )
    assert outcome.status is OutcomeStatus.FAILED
    assert caplog.records, "the failures should have been logged"
    assert SECRET not in caplog.text
    assert SECRET not in (outcome.error or "") and SECRET not in json.dumps(outcome.to_json())


def test_url_credentials_stay_out_of_our_logs_and_errors(secret_env: str, caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.DEBUG, logger="tailguard.controller")
    token = "url-token-123"
    with receiver(503, 400) as (url, _state):
        leaky_url = url.replace("http://", f"http://user:{token}@") + f"?token={token}"
        clock = ManualClock()
        notifier = WebhookNotifier({"r": WebhookReceiver(url=leaky_url, secretEnv=secret_env, retries=3)}, clock)
        outcome = dispatched(
            lambda: notifier.notify(NotifyRequest("r", NotifyPayload.from_json({}), idempotency_key="k")), clock=clock
        )
    assert outcome.status is OutcomeStatus.FAILED
    ours = [r.getMessage() for r in caplog.records if r.name.startswith("tailguard.controller")]
    assert ours and not any(token in message for message in ours)
    assert token not in json.dumps(outcome.to_json())


def test_missing_secret_is_a_clear_failure_without_sending(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("TG_UNSET_SECRET", raising=False)
    with receiver() as (url, state):
        notifier = WebhookNotifier({"r": WebhookReceiver(url=url, secretEnv="TG_UNSET_SECRET")}, ManualClock())
        outcome = notifier.notify(NotifyRequest("r", NotifyPayload.from_json({}), idempotency_key="k"))
    assert outcome.status is OutcomeStatus.FAILED and outcome.transient is False
    assert outcome.error == "receiver 'r': environment variable TG_UNSET_SECRET is not set or empty"
    assert state.requests == []


def test_secret_from_file(tmp_path: Path) -> None:
    path = tmp_path / "secret"
    path.write_text(SECRET + "\n")
    with receiver() as (url, state):
        clock = ManualClock()
        notifier = WebhookNotifier({"r": WebhookReceiver(url=url, secretFile=path)}, clock)
        assert (
            notifier.notify(NotifyRequest("r", NotifyPayload.from_json({}), idempotency_key="k")).status
            is OutcomeStatus.SUCCEEDED
        )
    headers, body = state.requests[0]
    assert verify_signature(
        SECRET, headers["X-Tailguard-Timestamp"], body, headers["X-Tailguard-Signature"], now=clock.now()
    )


def test_unknown_receiver() -> None:
    notifier = WebhookNotifier({}, ManualClock())
    outcome = notifier.notify(NotifyRequest("pager", NotifyPayload.from_json({}), idempotency_key="k"))
    assert outcome.status is OutcomeStatus.FAILED
    assert outcome.error == "unknown receiver 'pager'; configured: none"


@pytest.mark.parametrize(
    "settings, message",
    [
        ({"url": "http://127.0.0.1:1/x"}, "exactly one of secretEnv"),
        ({"url": "http://127.0.0.1:1/x", "secretEnv": "A", "secretFile": "/x"}, "exactly one of secretEnv"),
        ({"url": "ftp://x", "secretEnv": "A"}, "http:// or https:// URL"),
        ({"url": "http://x", "secretEnv": "A", "secret": "inline"}, "Extra inputs are not permitted"),
        ({"url": "http://x", "secretEnv": "A", "timeout": 0}, "greater than 0"),
    ],
)
def test_receiver_settings_are_strict(settings: dict[str, Any], message: str) -> None:
    with pytest.raises(ValidationError, match=message):
        WebhookReceiver.model_validate(settings)
