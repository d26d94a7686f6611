from __future__ import annotations

import socket
from collections.abc import Iterator

import pytest

from tailguard.controller.adapters.tier.local_tier import LocalTierClient, TierError
from tailguard.controller.core.ports import OutcomeStatus, RollbackRequest, ScaleRequest, TrafficRequest
from tailguard.controller.kit.clock import ManualClock
from tests.support.dispatch import dispatched
from tests.support.fake_tier import FakeTierState, running_fake_tier


@pytest.fixture
def tier() -> Iterator[tuple[str, FakeTierState]]:
    with running_fake_tier("chat") as served:
        yield served


def _client(url: str, clock: ManualClock | None = None, **kwargs: float) -> LocalTierClient:
    return LocalTierClient(url, clock=clock or ManualClock(), **kwargs)  # type: ignore[arg-type]


def test_rollback_sends_the_key_in_header_and_body(tier: tuple[str, FakeTierState]) -> None:
    url, state = tier
    outcome = _client(url).rollback(RollbackRequest("chat", idempotency_key="d1:fire:1"))
    assert outcome.status is OutcomeStatus.SUCCEEDED
    assert outcome.detail["from_revision"] == 3 and outcome.detail["to_revision"] == 2
    assert outcome.detail["replayed"] is False
    [request] = state.mutations("rollback")
    assert request.path == "/api/v1/services/chat/rollback"
    assert request.headers["Idempotency-Key"] == "d1:fire:1"
    assert request.body == {"idempotency_key": "d1:fire:1", "to_revision": None, "reason": None}


def test_a_repeated_key_is_a_replayed_success(tier: tuple[str, FakeTierState]) -> None:
    url, state = tier
    client = _client(url)
    client.rollback(RollbackRequest("chat", idempotency_key="k"))
    again = client.rollback(RollbackRequest("chat", idempotency_key="k"))
    assert again.status is OutcomeStatus.SUCCEEDED and again.detail["replayed"] is True
    assert state.services["chat"].active == 2  # one rollback, not two


def test_no_earlier_good_revision_is_a_permanent_failure_with_the_servers_message(
    tier: tuple[str, FakeTierState],
) -> None:
    url, state = tier
    clock = ManualClock()
    client = _client(url, clock)
    assert client.rollback(RollbackRequest("chat", idempotency_key="a")).status is OutcomeStatus.SUCCEEDED
    assert client.rollback(RollbackRequest("chat", idempotency_key="b")).status is OutcomeStatus.SUCCEEDED
    start = clock.now()
    outcome = client.rollback(RollbackRequest("chat", idempotency_key="c"))
    assert outcome.status is OutcomeStatus.FAILED and outcome.transient is False
    assert outcome.error == "rollback of 'chat' refused: service 'chat' has no good revision earlier than r1"
    assert len(state.mutations("rollback")) == 3 and clock.now() == start  # not retried


def test_5xx_is_retried_with_backoff_then_succeeds(tier: tuple[str, FakeTierState]) -> None:
    url, state = tier
    clock = ManualClock()
    state.fail_next(503, 502)
    start = clock.now()
    client = _client(url, clock, retries=3, backoff=0.5)
    outcome = dispatched(
        lambda: client.set_replicas(ScaleRequest("chat", 4, idempotency_key="s")), clock=clock, backoff=0.5
    )
    assert outcome.status is OutcomeStatus.SUCCEEDED and outcome.detail["attempts"] == 3
    assert outcome.detail["from"] == 2 and outcome.detail["to"] == 4
    assert clock.now() - start == pytest.approx(0.5 + 1.0)
    assert [r.headers["Idempotency-Key"] for r in state.mutations("scale")] == ["s", "s", "s"]


def test_5xx_beyond_the_retries_is_a_transient_failure(tier: tuple[str, FakeTierState]) -> None:
    url, state = tier
    state.fail_next(503, 503, 503)
    clock = ManualClock()
    client = _client(url, clock, retries=2)
    outcome = dispatched(lambda: client.rollback(RollbackRequest("chat", idempotency_key="r")), clock=clock, attempts=2)
    assert outcome.status is OutcomeStatus.FAILED and outcome.transient is True
    assert outcome.error is not None and "HTTP 503: injected 503" in outcome.error
    assert len(state.mutations("rollback")) == 2


def test_4xx_is_not_retried(tier: tuple[str, FakeTierState]) -> None:
    url, state = tier
    outcome = _client(url).rollback(RollbackRequest("nope", idempotency_key="r"))
    assert outcome.status is OutcomeStatus.FAILED and outcome.transient is False
    assert outcome.error == (
        "rollback of 'nope' failed: POST http://"
        + url.split("//")[1]
        + "/api/v1/services/nope/rollback: HTTP 404: unknown service 'nope'"
    )
    assert len(state.mutations("rollback")) == 1


def test_a_timeout_is_retried(tier: tuple[str, FakeTierState]) -> None:
    url, state = tier
    state.delay_next(2.0)
    clock = ManualClock()
    client = _client(url, clock, timeout=0.3, retries=2)
    outcome = dispatched(
        lambda: client.set_replicas(ScaleRequest("chat", 3, idempotency_key="t")), clock=clock, attempts=2
    )
    assert outcome.status is OutcomeStatus.SUCCEEDED
    assert outcome.detail["attempts"] == 2


def test_connection_refused_is_transient() -> None:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    outcome = _client(f"http://127.0.0.1:{port}", retries=2).rollback(RollbackRequest("chat", idempotency_key="x"))
    assert outcome.status is OutcomeStatus.FAILED and outcome.transient is True
    assert outcome.error is not None and "connection failed" in outcome.error


def test_replicas_reads_the_service(tier: tuple[str, FakeTierState]) -> None:
    url, _ = tier
    assert _client(url).replicas("chat") == 2
    with pytest.raises(TierError, match="HTTP 404: unknown service 'nope'") as error:
        _client(url).replicas("nope")
    assert error.value.transient is False


def test_set_weight_verifies_by_reading_back(tier: tuple[str, FakeTierState]) -> None:
    url, state = tier
    state.services["chat"].weights = {"r2": 90, "r3": 10}
    outcome = _client(url).set_weight(TrafficRequest("chat", "r3", 50, idempotency_key="w"))
    assert outcome.status is OutcomeStatus.SUCCEEDED
    assert outcome.detail["verified"] is True and outcome.detail["verified_weight"] == 50
    assert outcome.detail["weights"] == {"r3": 50, "r2": 50}
    [request] = state.mutations("weights")
    assert request.body == {"version": "r3", "weight": 50, "idempotency_key": "w"}


def test_set_weight_that_does_not_hold_fails(tier: tuple[str, FakeTierState]) -> None:
    url, state = tier
    state.services["chat"].weights = {"r2": 90, "r3": 10}
    state.lie_about_weights = True
    outcome = _client(url).set_weight(TrafficRequest("chat", "r3", 20, idempotency_key="w"))
    assert outcome.status is OutcomeStatus.FAILED and outcome.transient is False
    assert outcome.error == "weight of 'chat' 'r3': asked for 20%, the tier reports 50%"


def test_constructor_rejects_a_non_positive_timeout() -> None:
    with pytest.raises(ValueError, match="timeout must be positive"):
        LocalTierClient("http://127.0.0.1:1", timeout=0, clock=ManualClock())
