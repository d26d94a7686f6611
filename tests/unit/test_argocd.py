"""The Argo CD rollback actuator against the spec-validating fake Argo CD (loopback, swagger-checked)."""

from __future__ import annotations

import json
import logging
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tailguard.controller.adapters.argocd.client import ArgoCDClient, HistoryEntry
from tailguard.controller.adapters.argocd.settings import ArgoCDApp, ArgoCDSettings, AutoSyncMode
from tailguard.controller.adapters.rollback.argocd import ArgoCDRollback, BadRevisionRecord, pick_target
from tailguard.controller.adapters.stores.journal import Journal
from tailguard.controller.core.ports import OutcomeStatus, RollbackRequest
from tailguard.controller.kit.clock import ManualClock
from tailguard.controller.loop.dispatcher import Actuators, Dispatcher, GlobalLimits
from tailguard.controller.testing import make_decision
from tests.support.dispatch import dispatched
from tests.support.fake_argocd import FakeArgoCD, SwaggerValidator, application

T0 = 1_700_000_000.0
KEY = "d1:fire:1"


@pytest.fixture
def fake() -> Iterator[FakeArgoCD]:
    with FakeArgoCD() as server:
        server.add_app(application("llm-web", [("r1", T0 - 3000), ("r2", T0 - 2000), ("r3", T0 - 60)]))
        yield server
    assert server.state.spec_violations == [], server.state.spec_violations


def deployer(
    fake: FakeArgoCD,
    *,
    token: str | None = "argocd-test-token",
    auto_sync: AutoSyncMode = "notifyOnly",
    timeout: float = 2.0,
    record: BadRevisionRecord | None = None,
    notices: list[str] | None = None,
) -> ArgoCDRollback:
    clock = ManualClock(T0)
    client = ArgoCDClient(fake.url, clock=clock, token=lambda: token, timeout=timeout, retries=3)
    return ArgoCDRollback(
        client,
        {"web": ArgoCDApp(name="llm-web")},
        clock=clock,
        auto_sync=auto_sync,
        wait_timeout=60,
        poll_interval=5,
        record=record,
        notice=(lambda text, _info: notices.append(text)) if notices is not None else None,
    )


def rollback_posts(fake: FakeArgoCD) -> list[Any]:
    return [call.body for call in fake.calls("POST", "/rollback") if call.status == 200]


def test_rollback_to_the_entry_before_the_current_rollout(fake: FakeArgoCD) -> None:
    outcome = deployer(fake).rollback(RollbackRequest("web", idempotency_key=KEY))
    assert outcome.status is OutcomeStatus.SUCCEEDED, outcome.error
    assert outcome.detail["to_revision"] == "r2" and outcome.detail["history_id"] == 2
    assert outcome.detail["health"] == "Healthy" and outcome.detail["operation_phase"] == "Succeeded"
    assert rollback_posts(fake) == [{"name": "llm-web", "id": 2, "dryRun": False, "prune": False}]
    status = fake.app("llm-web")["status"]
    assert status["sync"]["revision"] == "r2" and status["history"][-1]["revision"] == "r2"


def test_rollback_targets_the_entry_before_the_attributed_rollout(fake: FakeArgoCD) -> None:
    outcome = deployer(fake).rollback(RollbackRequest("web", idempotency_key=KEY, rollout_revision="r2"))
    assert outcome.status is OutcomeStatus.SUCCEEDED
    assert (outcome.detail["bad_revision"], outcome.detail["to_revision"]) == ("r2", "r1")


def test_the_dispatcher_hands_over_the_attributed_revision_of_the_rollback_action(
    fake: FakeArgoCD, tmp_path: Path
) -> None:
    # The engine puts the revision the breach is attributed to into the rollback action; the dispatcher passes it.
    decision = make_decision([("rollback", {"service": "web", "rollout_revision": "r2"})])
    with Journal(tmp_path / "journal.db") as journal:
        dispatcher = Dispatcher(journal, Actuators(rollback=deployer(fake)), ManualClock(T0), GlobalLimits())
        [record] = dispatcher.dispatch(decision)
    assert record.result is not None
    outcome = record.result
    assert outcome["detail"]["to_revision"] == "r1"


def test_never_targets_a_revision_recorded_as_bad(fake: FakeArgoCD, tmp_path: Path) -> None:
    record = BadRevisionRecord(tmp_path / "bad.json")
    record.record("llm-web", "r2", "old:fire:0", {}, T0 - 1000)
    outcome = deployer(fake, record=BadRevisionRecord(tmp_path / "bad.json")).rollback(
        RollbackRequest("web", idempotency_key=KEY)
    )
    assert outcome.detail["to_revision"] == "r1"
    assert BadRevisionRecord(tmp_path / "bad.json").bad("llm-web") == {"r2", "r3"}


def test_no_earlier_good_revision_is_skipped_with_the_reason(fake: FakeArgoCD) -> None:
    record = BadRevisionRecord()
    record.record("llm-web", "r1", "a:fire:0", {}, T0)
    record.record("llm-web", "r2", "b:fire:0", {}, T0)
    outcome = deployer(fake, record=record).rollback(RollbackRequest("web", idempotency_key=KEY))
    assert outcome.status is OutcomeStatus.SKIPPED
    assert outcome.error == "rollback of 'llm-web': no earlier good revision before r3 in its history (bad: r1, r2, r3)"
    assert rollback_posts(fake) == []


def test_auto_sync_with_notify_only_does_not_roll_back(fake: FakeArgoCD) -> None:
    fake.add_app(application("llm-web", [("r1", T0 - 3000), ("r2", T0 - 60)], automated=True))
    outcome = deployer(fake, auto_sync="notifyOnly").rollback(RollbackRequest("web", idempotency_key=KEY))
    assert outcome.status is OutcomeStatus.FAILED and not outcome.transient
    assert outcome.error is not None and "automated sync is enabled, and autoSync is notifyOnly" in outcome.error
    assert fake.calls("POST") == [] and fake.calls("PATCH") == []


def test_auto_sync_refusal_from_the_server_is_reported(fake: FakeArgoCD) -> None:
    """The real error shape: HTTP 400, gRPC code 9; seen when auto-sync was enabled after our read."""
    app = application("llm-web", [("r1", T0 - 3000), ("r2", T0 - 60)], automated=True)
    del app["spec"]["syncPolicy"]
    fake.add_app(app)
    target = deployer(fake, auto_sync="notifyOnly")
    with fake.lock:
        fake.state.apps["llm-web"]["spec"]["syncPolicy"] = {"automated": {"prune": True}}
    # Read before the flip: the deployer sees no auto-sync, the POST is refused by Argo CD.
    target.client.get_app = lambda name, ns=None: app  # type: ignore[method-assign]
    outcome = target.rollback(RollbackRequest("web", idempotency_key=KEY))
    assert outcome.status is OutcomeStatus.FAILED and "notifyOnly" in (outcome.error or "")
    refused = fake.calls("POST", "/rollback")
    assert [call.status for call in refused] == [400]


def test_auto_sync_disabled_first_is_recorded_and_noticed(fake: FakeArgoCD) -> None:
    fake.add_app(application("llm-web", [("r1", T0 - 3000), ("r2", T0 - 60)], automated=True))
    notices: list[str] = []
    outcome = deployer(fake, auto_sync="disableAutoSync", notices=notices).rollback(
        RollbackRequest("web", idempotency_key=KEY)
    )
    assert outcome.status is OutcomeStatus.SUCCEEDED, outcome.error
    assert outcome.detail["auto_sync_disabled"] is True
    assert outcome.detail["previous_automated"] == {"prune": True, "selfHeal": True}
    (patch,) = fake.calls("PATCH")
    assert patch.body["patchType"] == "merge"
    assert json.loads(patch.body["patch"]) == {"spec": {"syncPolicy": {"automated": None}}}
    assert "automated" not in fake.app("llm-web")["spec"].get("syncPolicy", {})
    assert len(notices) == 1 and "re-enable it after fixing Git" in notices[0]


def test_unknown_history_id_is_a_clear_refusal(fake: FakeArgoCD) -> None:
    fake.state.hidden_ids.add(2)
    outcome = deployer(fake).rollback(RollbackRequest("web", idempotency_key=KEY))
    assert outcome.status is OutcomeStatus.FAILED and not outcome.transient
    assert outcome.error == (
        "rollback of 'llm-web' to r2 (history id 2) refused: application llm-web does not have deployment id '2' "
        "in history"
    )
    assert len(fake.calls("POST")) == 1


def test_401_names_the_token_and_never_shows_it(fake: FakeArgoCD, caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.DEBUG)
    outcome = deployer(fake, token="wrong-secret-token").rollback(RollbackRequest("web", idempotency_key=KEY))
    assert outcome.status is OutcomeStatus.FAILED and not outcome.transient
    assert outcome.error is not None and "unauthorized" in outcome.error and "check the Argo CD token" in outcome.error
    assert "wrong-secret-token" not in json.dumps(outcome.to_json()) + caplog.text
    assert len(fake.calls("GET")) == 1  # not retried


def test_missing_token_fails_without_a_request(fake: FakeArgoCD) -> None:
    outcome = deployer(fake, token=None).rollback(RollbackRequest("web", idempotency_key=KEY))
    assert outcome.status is OutcomeStatus.FAILED and "no Argo CD token" in (outcome.error or "")
    assert fake.state.requests == []


def test_500_on_read_is_retried(fake: FakeArgoCD) -> None:
    fake.fail_next(500, 1, method="GET")
    outcome = deployer(fake).rollback(RollbackRequest("web", idempotency_key=KEY))
    assert outcome.status is OutcomeStatus.SUCCEEDED
    assert len(rollback_posts(fake)) == 1


def test_500_on_every_try_is_a_transient_failure(fake: FakeArgoCD) -> None:
    fake.fail_next(500, 3, method="POST")
    target = deployer(fake)
    outcome = dispatched(
        lambda: target.rollback(RollbackRequest("web", idempotency_key=KEY)), clock=target.clock, attempts=3
    )
    assert outcome.status is OutcomeStatus.FAILED and outcome.transient
    assert outcome.error is not None and "HTTP 500" in outcome.error
    assert [call.status for call in fake.calls("POST")] == [500, 500, 500]
    assert fake.app("llm-web")["status"]["sync"]["revision"] == "r3"


def test_500_on_post_then_success_rolls_back_once(fake: FakeArgoCD) -> None:
    fake.fail_next(503, 1, method="POST")
    target = deployer(fake)
    outcome = dispatched(
        lambda: target.rollback(RollbackRequest("web", idempotency_key=KEY)), clock=target.clock, attempts=3
    )
    assert outcome.status is OutcomeStatus.SUCCEEDED
    assert [call.status for call in fake.calls("POST")] == [503, 200]


def test_a_rollback_is_posted_at_most_once_per_dispatcher_attempt(fake: FakeArgoCD, tmp_path: Path) -> None:
    # The client's read retries (retries=3) never multiply the dispatcher's attempts for the POST. (A deadline of
    # 0.5 s: past the 2 attempts, the next backoff would end after it.)
    fake.fail_next(500, 10, method="POST")
    with Journal(tmp_path / "journal.db") as journal:
        dispatcher = Dispatcher(
            journal,
            Actuators(rollback=deployer(fake)),
            ManualClock(T0),
            GlobalLimits(),
            attempts=2,
            deadline_for=lambda _policy: 0.5,
        )
        [record] = dispatcher.dispatch(make_decision([("rollback", {"service": "web"})]))
    assert record.status.value == "failed" and record.attempts == 2
    assert record.result is not None and record.result["transient"] and record.result["detail"]["attempts"] == 2
    assert [call.status for call in fake.calls("POST")] == [500, 500]


def test_post_timeout_that_took_effect_is_not_repeated(fake: FakeArgoCD) -> None:
    fake.answer_late(0.6, 1, method="POST")
    outcome = deployer(fake, timeout=0.2).rollback(RollbackRequest("web", idempotency_key=KEY))
    assert outcome.status is OutcomeStatus.SUCCEEDED, outcome.error
    assert len(fake.calls("POST")) == 1  # the re-read showed the operation running: no second POST
    assert fake.app("llm-web")["status"]["sync"]["revision"] == "r2"


def test_read_timeout_is_transient(fake: FakeArgoCD) -> None:
    fake.delay_next(0.6, 3, method="GET")
    outcome = deployer(fake, timeout=0.2).rollback(RollbackRequest("web", idempotency_key=KEY))
    assert outcome.status is OutcomeStatus.FAILED and outcome.transient
    assert outcome.error is not None and "timed out" in outcome.error
    assert rollback_posts(fake) == []


def test_repeated_key_and_resume_do_not_roll_back_twice(fake: FakeArgoCD) -> None:
    record = BadRevisionRecord()
    first = deployer(fake, record=record).rollback(RollbackRequest("web", idempotency_key=KEY))
    again = deployer(fake, record=record).rollback(RollbackRequest("web", idempotency_key=KEY))
    # A new process that lost the record: the app already runs the target, so nothing is POSTed either.
    resumed = deployer(fake).rollback(RollbackRequest("web", idempotency_key=KEY, rollout_revision="r3"))
    assert first.status is again.status is resumed.status is OutcomeStatus.SUCCEEDED
    assert again.detail["replayed"] is True and resumed.detail["already_done"] is True
    assert len(rollback_posts(fake)) == 1


def test_failed_operation_is_reported(fake: FakeArgoCD) -> None:
    fake.state.rollback_phase = "Failed"
    outcome = deployer(fake).rollback(RollbackRequest("web", idempotency_key=KEY))
    assert outcome.status is OutcomeStatus.FAILED
    assert outcome.error == "rollback of 'llm-web' to r2: operation Failed: sync failed"


def test_not_healthy_within_the_wait_is_reported(fake: FakeArgoCD) -> None:
    fake.state.rollback_health = "Degraded"
    outcome = deployer(fake).rollback(RollbackRequest("web", idempotency_key=KEY))
    assert outcome.status is OutcomeStatus.FAILED
    assert outcome.error is not None and "not Healthy after 60s (operation Succeeded, health Degraded)" in outcome.error


def test_unknown_service_fails_clearly(fake: FakeArgoCD) -> None:
    outcome = deployer(fake).rollback(RollbackRequest("nope", idempotency_key=KEY))
    assert outcome.error == "no Argo CD application for service 'nope' (known: web)"


def test_pick_target_skips_bad_and_uses_the_last_deployment_of_the_bad_revision() -> None:
    history = [HistoryEntry(i, rev, None, {}) for i, rev in enumerate(["a", "b", "c", "b", "d"], start=1)]
    assert pick_target(history, "d", set()) == history[3]
    assert pick_target(history, "b", set()) == history[2]
    assert pick_target(history, "b", {"c"}) == history[0]
    assert pick_target(history, "zz", set()) == history[3]


def test_settings_need_exactly_one_token_source() -> None:
    with pytest.raises(ValueError, match="exactly one of tokenFile or tokenEnv"):
        ArgoCDSettings.model_validate({"url": "http://a", "apps": {"web": "llm-web"}})
    settings = ArgoCDSettings.model_validate({"url": "http://a", "apps": {"web": "llm-web"}, "tokenEnv": "T"})
    assert settings.apps["web"].name == "llm-web"


# -- the fake itself rejects what the swagger does not allow ------------------------------------------------


@pytest.mark.parametrize(
    ("method", "path", "body", "error"),
    [
        (
            "POST",
            "/api/v1/applications/web/rollback",
            {"name": "web", "id": 1, "dry_run": False},
            "body.dry_run: property not declared by the schema",
        ),
        ("POST", "/api/v1/applications/web/rollback", {"name": "web", "id": "one"}, "body.id: expected an integer"),
        ("GET", "/api/v1/applications/web?refreshh=true", None, "query parameter 'refreshh' is not declared"),
        ("POST", "/api/v1/applications/web", {}, "method POST is not defined"),
        ("GET", "/api/v2/apps", None, "path /api/v2/apps is not in the Argo CD API"),
        ("PATCH", "/api/v1/applications/web", {"name": "web", "patch": {"spec": {}}}, "body.patch: expected a string"),
    ],
)
def test_validator_rejects_requests_the_spec_does_not_allow(method: str, path: str, body: Any, error: str) -> None:
    validator = SwaggerValidator.load()
    with pytest.raises(ValueError, match=error.replace("(", r"\(").replace(")", r"\)").replace("?", r"\?")):
        validator.validate_request(method, path, body, body is not None)


def test_fake_applications_match_the_application_schema() -> None:
    validator = SwaggerValidator.load()
    app = application("web", [("r1", T0)], automated=True, helm_parameters={"r1": [("maxNumSeqs", "64")]})
    validator.validate(app, {"$ref": "#/definitions/v1alpha1Application"}, "app")
