"""LocalTierClient against the real serving tier process: every Deployer / TrafficRouter call end to end."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
import requests

from tailguard.controller.adapters.tier.local_tier import LocalTierClient, TierError
from tailguard.controller.core.ports import OutcomeStatus, RollbackRequest, ScaleRequest, ScaleState, TrafficRequest
from tailguard.controller.kit.clock import SystemClock
from tests.support.fake_tier import running_serving_tier

pytestmark = pytest.mark.integration

TIER_CONFIG = """\
services:
  - name: chat
    namespace: llm
    model: tiny-llama
    profile: stable
    replicas: 1
"""


@pytest.fixture(scope="module")
def tier_url(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    with running_serving_tier(tmp_path_factory.mktemp("tier"), TIER_CONFIG) as url:
        yield url


@pytest.fixture
def client(tier_url: str) -> LocalTierClient:
    return LocalTierClient(tier_url, timeout=10.0, retries=2, clock=SystemClock(), backoff=0.1)


def _roll_out(tier_url: str, key: str, canary_weight: int | None = None) -> int:
    answer = requests.post(
        f"{tier_url}/api/v1/services/chat/rollout",
        json={"profile_name": "stable", "idempotency_key": key, "canary_weight": canary_weight},
        timeout=30,
    )
    assert answer.status_code == 200, answer.text
    return int(answer.json()["revision"])


def test_scale_and_read_back(client: LocalTierClient) -> None:
    assert client.healthy()
    before = client.replicas("chat")
    outcome = client.set_replicas(ScaleRequest("chat", before + 1, idempotency_key="it-scale-1"))
    assert outcome.status is OutcomeStatus.SUCCEEDED
    assert (outcome.detail["from"], outcome.detail["to"], outcome.detail["replayed"]) == (
        before,
        before + 1,
        False,
    )
    assert client.replicas("chat") == before + 1
    replay = client.set_replicas(ScaleRequest("chat", before + 5, idempotency_key="it-scale-1"))
    assert replay.status is OutcomeStatus.SUCCEEDED and replay.detail["replayed"] is True
    assert client.replicas("chat") == before + 1  # the replayed key changed nothing


def test_canary_weight_is_set_and_verified(tier_url: str, client: LocalTierClient) -> None:
    canary = _roll_out(tier_url, "it-canary", canary_weight=50)
    version = f"r{canary}"
    outcome = client.set_weight(TrafficRequest("chat", version, 10, idempotency_key="it-weight-1"))
    assert outcome.status is OutcomeStatus.SUCCEEDED, outcome.error
    assert outcome.detail["verified"] is True and outcome.detail["verified_weight"] == 10
    assert client.weights("chat")[version] == 10
    unknown = client.set_weight(TrafficRequest("chat", "r99", 10, idempotency_key="it-weight-2"))
    assert unknown.status is OutcomeStatus.FAILED and unknown.transient is False
    assert unknown.error is not None and "live versions" in unknown.error


def test_rollback_until_no_earlier_good_revision(tier_url: str, client: LocalTierClient) -> None:
    _roll_out(tier_url, "it-full")
    while True:
        active = int(client.service("chat")["active_revision"])
        outcome = client.rollback(RollbackRequest("chat", idempotency_key=f"it-rollback-{active}"))
        if outcome.status is not OutcomeStatus.SUCCEEDED:
            break
        assert outcome.detail["from_revision"] == active and outcome.detail["to_revision"] < active
    # r1 is the only good revision left: the tier refuses, and the client says so without retrying.
    assert outcome.status is OutcomeStatus.FAILED and outcome.transient is False
    assert outcome.error == "rollback of 'chat' refused: service 'chat' has no good revision earlier than r1"
    bad = [r["revision"] for r in client.revisions("chat") if r["bad"]]
    assert 1 not in bad and len(bad) == len(client.revisions("chat")) - 1


def test_unknown_service(client: LocalTierClient) -> None:
    with pytest.raises(TierError, match="HTTP 404: unknown service 'nope'"):
        client.replicas("nope")
    outcome = client.rollback(RollbackRequest("nope", idempotency_key="it-nope"))
    assert outcome.status is OutcomeStatus.FAILED and outcome.transient is False


def test_restore_calls_set_every_weight_and_the_replicas_exactly(tier_url: str, client: LocalTierClient) -> None:
    # Issue 12 (undo is exact): the tier's additive {"weights": {...}} form and the restore ports over it.
    canary = f"r{_roll_out(tier_url, 'it-restore-canary', canary_weight=10)}"
    before = dict(client.weights("chat"))
    assert before[canary] == 10
    assert (
        client.set_weight(TrafficRequest("chat", canary, 0, idempotency_key="it-restore-shift")).status
        is OutcomeStatus.SUCCEEDED
    )
    shifted = dict(client.weights("chat"))
    changed = client.set_weights("chat", {v: 0 for v in before}, expected=shifted, idempotency_key="it-restore-bad")
    assert changed.status is OutcomeStatus.FAILED and changed.transient is False  # must sum to 100
    someone = client.set_weights("chat", before, expected=before, idempotency_key="it-restore-0")
    assert someone.status is OutcomeStatus.SKIPPED and "changed by someone else" in someone.detail["reason"]
    assert client.weights("chat") == shifted  # not overwritten
    restored = client.set_weights("chat", before, expected=shifted, idempotency_key="it-restore-1")
    assert restored.status is OutcomeStatus.SUCCEEDED and restored.detail["verified"] is True
    assert client.weights("chat") == before
    replicas = client.scale_state("chat").to_json()["replicas"]
    client.set_replicas(ScaleRequest("chat", replicas + 2, idempotency_key="it-restore-scale"))
    back = client.restore_scale(
        "chat",
        ScaleState(replicas=replicas),
        expected=ScaleState(replicas=replicas + 2),
        idempotency_key="it-restore-2",
    )
    assert back.status is OutcomeStatus.SUCCEEDED and client.replicas("chat") == replicas
