"""`POST /api/v1/decisions/ID/abort` and `tailguard abort` against a real Controller (real journal and dispatcher,
fake ports) served on a loopback port: the answers (202 in flight, 200 cancelled, 409 finished, 404 unknown), the
bearer token, the body's checks, and the control journaled with who and why."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import requests

from tailguard.controller.adapters.stores.journal import Journal
from tailguard.controller.app import operate
from tailguard.controller.app.api import ControllerAPI
from tailguard.controller.core.actions import ActionStatus
from tailguard.controller.core.controls import MAX_ABORT_REASON
from tailguard.controller.core.model import SignalResult, target_key
from tailguard.controller.kit.clock import ManualClock
from tailguard.controller.loop.dispatcher import Actuators, Dispatcher, GlobalLimits
from tailguard.controller.loop.runtime import Controller
from tailguard.controller.testing import FakeLeader, FakeScaler, FakeSource, make_decision
from tests.unit.test_operate import policy_yaml

TOKEN = "s3cret-token"
TIMEOUT = 10
CHECKOUT = target_key({"service": "checkout"})


class Served:
    def __init__(self, controller: Controller, api: ControllerAPI, journal: Journal, scaler: FakeScaler) -> None:
        self.controller, self.api, self.journal, self.scaler = controller, api, journal, scaler

    def abort(self, decision_id: str, body: Any = None, token: str | None = TOKEN) -> requests.Response:
        headers = {"Authorization": f"Bearer {token}"} if token else {}
        url = f"{self.api.url}/api/v1/decisions/{decision_id}/abort"
        return requests.post(url, json=body, headers=headers, timeout=TIMEOUT)

    def fire(self) -> str:
        """One evaluation that fires the policy; the id of its decision."""
        self.controller.start()
        outcome = self.controller.evaluate("checkout-p99")
        assert outcome is not None
        (decision,) = [d for d in outcome.decisions if d.actions]
        return decision.id


def _serve(tmp_path: Path, *, limits: GlobalLimits | None = None, leader: Any = None) -> Served:
    rules = tmp_path / "rules"
    rules.mkdir(exist_ok=True)
    (rules / "checkout.yaml").write_text(policy_yaml())
    clock = ManualClock(1_000.0)
    journal = Journal(tmp_path / "journal.db")
    scaler = FakeScaler({"checkout": 2})
    dispatcher = Dispatcher(journal, Actuators(scale=scaler), clock, limits or GlobalLimits())
    controller = Controller(
        policy_paths=[rules],
        source=FakeSource(default=SignalResult({CHECKOUT: 0.95})),
        journal=journal,
        dispatcher=dispatcher,
        clock=clock,
        schedule=False,
        controls_store=journal,
        leader=leader,
    )
    api = ControllerAPI(controller, "127.0.0.1", 0, webhook_token=TOKEN, leader=leader)
    api.start()
    return Served(controller, api, journal, scaler)


@pytest.fixture
def served(tmp_path: Path) -> Iterator[Served]:
    s = _serve(tmp_path)
    try:
        yield s
    finally:
        s.api.stop()
        s.controller.stop()


@pytest.fixture
def deferring(tmp_path: Path) -> Iterator[Served]:
    s = _serve(tmp_path, limits=GlobalLimits(maxActionsPerHour=0))  # every mutating action is deferred
    try:
        yield s
    finally:
        s.api.stop()
        s.controller.stop()


def test_an_abort_needs_the_token(served: Served) -> None:
    assert served.abort("0123456789abcdef", {"reason": "x"}, token=None).status_code == 401
    assert served.abort("0123456789abcdef", {"reason": "x"}, token="wrong").status_code == 403
    assert served.journal.recent_controls() == []


def test_the_body_needs_a_bounded_reason(served: Served) -> None:
    decision_id = served.fire()
    for body, error in (
        (None, "reason is required"),
        ({"by": "alice"}, "reason is required"),
        ({"reason": "   "}, "reason is required"),
        ({"reason": 7}, "reason is required"),
        ({"reason": "x" * (MAX_ABORT_REASON + 1)}, f"at most {MAX_ABORT_REASON}"),
        ({"reason": "ok", "by": ["alice"]}, "by must be a string"),
        (["reason"], "a JSON object"),
    ):
        answer = served.abort(decision_id, body)
        assert answer.status_code == 400, (body, answer.text)
        assert error in answer.json()["error"]
    assert served.journal.recent_controls() == []


def test_unknown_and_finished_decisions_are_refused(served: Served) -> None:
    unknown = served.abort("0123456789abcdef", {"reason": "stop"})
    assert unknown.status_code == 404 and unknown.json()["state"] == "unknown"
    decision_id = served.fire()  # the scale ran (no workers): finished
    finished = served.abort(decision_id, {"reason": "stop", "by": "alice"})
    assert finished.status_code == 409
    expected = f"decision {decision_id!r} has already finished (scale succeeded); nothing to abort"
    assert finished.json()["error"] == expected
    assert served.journal.recent_controls() == []  # nothing was aborted: no control journaled


def test_deferred_actions_are_cancelled_200_and_journaled_as_a_control(deferring: Served) -> None:
    decision_id = deferring.fire()
    (deferred,) = deferring.journal.actions_for(decision_id)
    assert deferred.status is ActionStatus.DEFERRED
    answer = deferring.abort(decision_id, {"reason": "INC-9: scaling is not the fix", "by": "alice"})
    assert answer.status_code == 200, answer.text
    body = answer.json()
    assert body["state"] == "cancelled" and body["by"] == "alice (bearer token)"
    assert [(a["type"], a["status"]) for a in body["actions"]] == [("scale", "aborted")]
    assert deferring.journal.recent_controls() == [
        {"at": 1_000.0, "action": "abort", "subject": decision_id, "by": "alice (bearer token)",
         "reason": "INC-9: scaling is not the fix"}
    ]  # fmt: skip
    events = deferring.journal.action_events(deferred.idempotency_key)
    assert [e["event"] for e in events] == ["deferred", "aborted"]
    assert deferring.scaler.performed() == []
    again = deferring.abort(decision_id, {"reason": "twice"})
    assert again.status_code == 409 and "scale aborted" in again.json()["error"]


def test_an_action_in_flight_is_answered_202(served: Served) -> None:
    decision = make_decision([("scale", {"service": "checkout", "delta": 1, "max": 4})], policy="checkout-p99")
    served.journal.record_decision(decision, 1_000.0)
    served.journal.mark_started(decision.actions[0].idempotency_key, 1_000.0)  # running (or left by a restart)
    answer = served.abort(decision.id, {"reason": "stop it"})
    assert answer.status_code == 202, answer.text
    assert answer.json()["state"] == "in_flight" and "stops at its next step" in answer.json()["message"]
    assert answer.json()["by"] == "unnamed (bearer token)"
    assert served.journal.abort_requested(decision.actions[0].idempotency_key) is not None


def test_a_standby_sends_an_abort_to_the_leader(tmp_path: Path) -> None:
    s = _serve(tmp_path, leader=FakeLeader(leading=False))
    try:
        answer = s.abort("0123456789abcdef", {"reason": "x"})
        assert answer.status_code == 503 and answer.json()["standby"] is True
    finally:
        s.api.stop()
        s.controller.stop()


def test_tailguard_abort_command(deferring: Served, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    decision_id = deferring.fire()
    token_file = tmp_path / "token"
    token_file.write_text(TOKEN + "\n")
    common = ["--url", deferring.api.url, "--token-file", str(token_file)]
    assert operate.abort_main([decision_id, *common, "--by", "bob", "--reason", "INC-9"]) == 0
    out = capsys.readouterr().out
    assert out.startswith(f"aborted {decision_id} (cancelled; by bob (bearer token)): ")
    assert "  scale on checkout: aborted" in out
    # Already finished: the controller's 409, said on stderr, exit 1, no traceback.
    assert operate.abort_main([decision_id, *common, "--reason", "again"]) == 1
    err = capsys.readouterr().err
    assert err.startswith("tailguard abort: ") and "HTTP 409" in err and "already finished" in err
    assert "Traceback" not in err
    assert operate.abort_main(["0123456789abcdef", *common, "--reason", "x"]) == 1
    assert "HTTP 404" in capsys.readouterr().err
    assert operate.abort_main([decision_id, "--url", deferring.api.url, "--reason", "x"]) == 1  # no token
    assert "HTTP 401" in capsys.readouterr().err
    assert operate.abort_main([decision_id, *common, "--token-file", str(tmp_path / "missing"), "--reason", "x"]) == 1
    assert "cannot read the token" in capsys.readouterr().err


@pytest.mark.parametrize(
    ("argv", "error"),
    [
        (["abc", "--url", "http://127.0.0.1:9"], "--reason is required"),
        (["abc", "--url", "http://127.0.0.1:9", "--reason", " "], "--reason is required"),
        (["a/b", "--url", "http://127.0.0.1:9", "--reason", "x"], "DECISION must be a decision id"),
        (["--url", "http://127.0.0.1:9", "--reason", "x"], "DECISION"),
    ],
)
def test_tailguard_abort_usage_errors(argv: list[str], error: str, capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exited:
        operate.abort_main(argv)
    assert exited.value.code == operate.EXIT_USAGE
    err = capsys.readouterr().err
    assert error in err and "Traceback" not in err


def test_tailguard_abort_without_url_tries_the_kubeconfig_and_says_so(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """No --url and no TAILGUARD_URL: the Kubernetes API's service proxy (controller/app/reach.py); without a usable
    kubeconfig one line names both ways to reach the controller."""
    monkeypatch.delenv("TAILGUARD_URL", raising=False)
    assert operate.abort_main(["abc", "--reason", "x", "--kubeconfig", str(tmp_path / "none")]) == operate.EXIT_FAILED
    (line,) = [line for line in capsys.readouterr().err.splitlines() if line.startswith("tailguard abort: ")]
    assert "no usable kubeconfig" in line and "--url" in line


def test_the_top_level_cli_names_abort(capsys: pytest.CaptureFixture[str]) -> None:
    from tailguard.controller.app.cli import main

    with pytest.raises(SystemExit):
        main(["--help"])
    assert "abort" in capsys.readouterr().out
