"""Operator controls (spec.suspend, pause/resume, the kill switch), the status API, `tailguard status`, and the
status page, against a real Controller served on a loopback port (fake source and dispatcher)."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import requests

from tailguard.controller.adapters.stores.journal import Journal
from tailguard.controller.app import operate
from tailguard.controller.app.api import ControllerAPI
from tailguard.controller.app.status_page import render_status_page
from tailguard.controller.core.controls import ALL, Control, Controls, ControlsError, effective_policy
from tailguard.controller.core.engine import PolicyState, transition
from tailguard.controller.core.model import DecisionKind, SignalResult, target_key
from tailguard.controller.core.policy import Policy
from tailguard.controller.kit.clock import ManualClock
from tailguard.controller.loop.runtime import Controller
from tailguard.controller.testing import FakeDispatcher, FakeHandover, FakeLeader, FakeSource

TOKEN = "s3cret-token"
TIMEOUT = 10
CHECKOUT = target_key({"service": "checkout"})


def policy_yaml(name: str = "checkout-p99", *, suspend: bool = False) -> str:
    return f"""\
apiVersion: tailguard.io/v1alpha1
kind: Policy
name: {name}
suspend: {str(suspend).lower()}
targets:
  groupBy: [service]
signals:
  - name: p99
    query: max by ({{{{ by }}}}) (lat{{ {{{{ selector }}}} }})
conditions:
  - name: p99-high
    signal: p99
    when: {{op: ">", value: 0.8}}
    for: 1
    noData: hold
    actions:
      - type: scale
        service: "{{{{ service }}}}"
        delta: 1
        max: 4
"""


def _policy(suspend: bool = False) -> Policy:
    import yaml

    return Policy.model_validate(yaml.safe_load(policy_yaml(suspend=suspend)))


# -- the engine: spec.suspend ----------------------------------------------------------------------------------


def test_a_suspended_policy_journals_suppressed_suspended_and_fires_once_resumed() -> None:
    observations = {"p99": SignalResult({CHECKOUT: 0.95})}
    state, decisions = transition(_policy(suspend=True), observations, PolicyState(), 100.0)
    assert [(d.kind, d.reason, d.actions) for d in decisions] == [(DecisionKind.SUPPRESSED, "suspended", ())]
    state, decisions = transition(_policy(suspend=True), observations, state, 115.0)
    assert decisions == []  # reported once
    state, decisions = transition(_policy(suspend=False), observations, state, 130.0)
    assert [d.kind for d in decisions] == [DecisionKind.FIRE] and decisions[0].actions[0].type == "scale"


def test_suspend_is_in_the_generated_schema() -> None:
    schema = json.loads((Path(__file__).resolve().parents[2] / "rules" / "schema.json").read_text())
    assert schema["properties"]["suspend"]["type"] == "boolean"


# -- the controls set --------------------------------------------------------------------------------------------


def test_controls_pause_resume_kill_switch_and_merge() -> None:
    controls = Controls().with_control("a", Control(True, "alice", "incident 1", 10.0))
    assert controls.pause_of("a") is not None and controls.pause_of("b") is None
    assert effective_policy(_policy(), controls.with_control("checkout-p99", Control(True, "x", "", 1.0))).suspend
    killed = controls.with_control(ALL, Control(True, "bob", "stop everything", 11.0))
    assert killed.pause_of("b") is not None and killed.killed is not None
    resumed_later = Controls({"a": Control(False, "carol", "", 20.0)})
    assert killed.merged(resumed_later).pause_of("a") is killed.latest[ALL]  # the kill switch still holds
    assert killed.merged(resumed_later).latest["a"].paused is False
    assert Controls.decode(killed.encode()) == killed
    with pytest.raises(ControlsError):
        Controls.decode('{"a": {"by": "x"}}')


def test_controls_survive_a_journal_reopen(tmp_path: Path) -> None:
    path = tmp_path / "j.db"
    with Journal(path) as journal:
        controls = Controls({ALL: Control(True, "alice", "freeze", 5.0)})
        journal.record_control(controls, "pause", ALL, "alice", "freeze", 5.0)
    with Journal(path) as journal:
        assert journal.load_controls() == controls
        assert journal.recent_controls() == [
            {"at": 5.0, "action": "pause", "subject": ALL, "by": "alice", "reason": "freeze"}
        ]


# -- served ------------------------------------------------------------------------------------------------------


class Served:
    def __init__(self, controller: Controller, api: ControllerAPI, dispatcher: FakeDispatcher, clock: ManualClock):
        self.controller, self.api, self.dispatcher, self.clock = controller, api, dispatcher, clock

    def get(self, path: str, token: str | None = TOKEN) -> requests.Response:
        headers = {"Authorization": f"Bearer {token}"} if token else {}
        return requests.get(self.api.url + path, headers=headers, timeout=TIMEOUT)

    def post(self, path: str, body: dict[str, Any] | None = None, token: str | None = TOKEN) -> requests.Response:
        headers = {"Authorization": f"Bearer {token}"} if token else {}
        return requests.post(self.api.url + path, json=body or {}, headers=headers, timeout=TIMEOUT)

    def fired(self) -> list[str]:
        return [d.kind.value for d in self.dispatcher.dispatched if d.actions]


def _serve(tmp_path: Path, leader: Any = None) -> Served:
    rules = tmp_path / "rules"
    rules.mkdir(exist_ok=True)
    (rules / "checkout.yaml").write_text(policy_yaml())
    journal = Journal(tmp_path / "journal.db")
    dispatcher = FakeDispatcher()
    clock = ManualClock(1_000.0)
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
    api = ControllerAPI(controller, "127.0.0.1", 0, webhook_token=TOKEN, leader=leader,
                        status_links={"grafanaDashboard": "https://grafana.example/d/tailguard-vllm-slo"})  # fmt: skip
    api.start()
    return Served(controller, api, dispatcher, clock)


@pytest.fixture
def served(tmp_path: Path) -> Iterator[Served]:
    s = _serve(tmp_path)
    try:
        yield s
    finally:
        s.api.stop()
        s.controller.stop()


def test_every_control_and_the_status_need_the_token(served: Served) -> None:
    for path in ("/api/v1/status", "/status"):
        assert served.get(path, token=None).status_code == 401
        assert served.get(path, token="wrong").status_code == 403
    assert served.post("/api/v1/policies/checkout-p99/pause", token=None).status_code == 401
    assert served.post("/api/v1/pause", token="wrong").status_code == 403
    assert served.post("/api/v1/policies/nope/pause", {"reason": "x"}).status_code == 404


def test_pause_stops_the_next_action_resume_lets_it_run_and_both_are_journaled(served: Served) -> None:
    served.controller.start()
    answer = served.post("/api/v1/policies/checkout-p99/pause", {"by": "alice", "reason": "INC-7 investigating"})
    assert answer.status_code == 200, answer.text
    assert answer.json()["control"]["by"] == "alice (bearer token)"
    outcome = served.controller.evaluate("checkout-p99")
    assert outcome is not None
    assert [(d.kind, d.reason) for d in outcome.decisions] == [(DecisionKind.SUPPRESSED, "suspended")]
    assert served.fired() == []
    status = served.get("/api/v1/status").json()
    policy = status["policies"][0]
    assert policy["suspended"] is True and policy["paused"]["reason"] == "INC-7 investigating"
    assert served.post("/api/v1/policies/checkout-p99/resume", {"by": "alice", "reason": "fixed"}).status_code == 200
    served.clock.advance(15.0)
    served.controller.evaluate("checkout-p99")
    assert served.fired() == ["fire"]
    status = served.get("/api/v1/status").json()
    assert [c["action"] for c in status["controls"]] == ["resume", "pause"]
    assert status["policies"][0]["targets"][0]["phase"] == "firing"
    assert status["policies"][0]["targets"][0]["threshold"] == 0.8


def test_the_kill_switch_survives_a_restart(tmp_path: Path) -> None:
    first = _serve(tmp_path)
    try:
        assert first.post("/api/v1/pause", {"by": "oncall", "reason": "freeze"}).status_code == 200
    finally:
        first.api.stop()
        first.controller.stop()
    second = _serve(tmp_path)
    try:
        second.controller.start()
        outcome = second.controller.evaluate("checkout-p99")
        assert outcome is not None and [d.reason for d in outcome.decisions] == ["suspended"]
        assert second.get("/api/v1/status").json()["killSwitch"]["by"] == "oncall (bearer token)"
    finally:
        second.api.stop()
        second.controller.stop()


def test_a_standby_sends_status_reads_and_controls_to_the_leader(tmp_path: Path) -> None:
    leader = FakeLeader(leading=False)
    s = _serve(tmp_path, leader=leader)
    try:
        answer = s.get("/api/v1/status")
        assert answer.status_code == 503 and answer.json()["standby"] is True and "Retry-After" in answer.headers
        assert s.post("/api/v1/pause", {"reason": "x"}).status_code == 503
    finally:
        s.api.stop()
        s.controller.stop()


def test_tailguard_status_from_the_api_and_from_the_journal(
    served: Served, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    served.controller.start()
    served.controller.evaluate("checkout-p99")
    token_file = tmp_path / "token"
    token_file.write_text(TOKEN + "\n")
    assert operate.status_main(["--url", served.api.url, "--token-file", str(token_file)]) == 0
    table = capsys.readouterr().out
    assert "checkout-p99" in table and "firing" in table and "> 0.8" in table and "LAST DECISIONS" in table
    assert operate.status_main(["--url", served.api.url, "--token-file", str(token_file), "-o", "json"]) == 0
    assert json.loads(capsys.readouterr().out)["policies"][0]["targets"][0]["phase"] == "firing"
    assert operate.status_main(["--url", served.api.url, "--watch", "0.1", "--count", "2",
                                "--token-file", str(token_file)]) == 0  # fmt: skip
    assert capsys.readouterr().out.count("LAST DECISIONS") == 2
    assert operate.status_main(["--url", served.api.url]) == 1  # no token: 401
    assert "HTTP 401" in capsys.readouterr().err
    assert operate.status_main(["--journal", str(tmp_path / "journal.db"), "-o", "json"]) == 0
    offline = json.loads(capsys.readouterr().out)
    assert offline["policies"][0]["name"] == "checkout-p99" and offline["decisions"][0]["kind"] == "fire"


def test_tailguard_pause_and_resume_commands(served: Served, tmp_path: Path) -> None:
    served.controller.start()
    token_file = tmp_path / "token"
    token_file.write_text(TOKEN)
    common = ["--url", served.api.url, "--token-file", str(token_file)]
    assert operate.pause_main(["checkout-p99", *common, "--by", "bob", "--reason", "deploy freeze"]) == 0
    assert served.controller.controls().pause_of("checkout-p99") is not None
    assert operate.pause_main(["--all", *common, "--by", "bob", "--reason", "all stop"]) == 0
    assert served.controller.controls().killed is not None
    assert operate.resume_main(["--all", *common, "--by", "bob"]) == 0
    assert operate.resume_main(["checkout-p99", *common, "--by", "bob"]) == 0
    assert served.controller.controls().pause_of("checkout-p99") is None
    with pytest.raises(SystemExit):
        operate.pause_main(["checkout-p99", *common])  # no --reason


def test_the_status_page_is_self_contained_and_escapes(served: Served) -> None:
    served.controller.start()
    served.controller.evaluate("checkout-p99")
    session = requests.Session()
    signed_in = session.post(f"{served.api.url}/status/login", data={"token": TOKEN}, timeout=TIMEOUT)
    page = signed_in  # the 303 is followed to /status with the session cookie
    assert page.status_code == 200 and page.headers["Content-Type"].startswith("text/html")
    text = page.text
    assert 'data-phase="firing"' in text and 'data-kind="fire"' in text
    assert "https://grafana.example/d/tailguard-vllm-slo?from=" in text
    assert "<link" not in text and "src=" not in text  # no external assets
    hostile = render_status_page({"policies": [{"name": "<script>x</script>", "targets": []}], "decisions": []})
    assert "<script>x</script>" not in hostile and "&lt;script&gt;" in hostile


def test_the_status_page_signs_in_with_a_form_and_never_reads_a_token_in_the_url(served: Served) -> None:
    """No token in URLs: the page answers the sign-in form (401) until a POSTed token earns a short-lived,
    HttpOnly session cookie; a token in the query string is ignored; the cookie expires."""
    served.controller.start()
    url = served.api.url
    form = requests.get(f"{url}/status?token={TOKEN}", timeout=TIMEOUT)
    assert form.status_code == 401 and "action=status/login" in form.text and "checkout-p99" not in form.text
    wrong = requests.post(f"{url}/status/login", data={"token": "nope"}, timeout=TIMEOUT, allow_redirects=False)
    assert wrong.status_code == 403 and "Set-Cookie" not in wrong.headers
    answer = requests.post(f"{url}/status/login", data={"token": TOKEN}, timeout=TIMEOUT, allow_redirects=False)
    assert answer.status_code == 303 and answer.headers["Location"] == "../status"  # relative: works behind a proxy
    cookie = answer.headers["Set-Cookie"]
    assert "HttpOnly" in cookie and "SameSite=Lax" in cookie and "Max-Age=900" in cookie and TOKEN not in cookie
    session = answer.cookies.get("tailguard_session")
    page = requests.get(f"{url}/status", cookies={"tailguard_session": session}, timeout=TIMEOUT)
    assert page.status_code == 200 and "checkout-p99" in page.text
    forged = requests.get(f"{url}/status", cookies={"tailguard_session": "99999999999.00"}, timeout=TIMEOUT)
    assert forged.status_code == 401 and "not valid any more" in forged.text
    served.api.wall_clock = lambda: 1e12  # long after the session's 15 minutes
    expired = requests.get(f"{url}/status", cookies={"tailguard_session": session}, timeout=TIMEOUT)
    assert expired.status_code == 401 and "sign in again" in expired.text
    # The cookie is the page's only: the API still wants the token itself.
    api = requests.get(f"{url}/api/v1/status", cookies={"tailguard_session": session}, timeout=TIMEOUT)
    assert api.status_code == 401


class _ControlsHandover(FakeHandover):
    def __init__(self, controls: Controls) -> None:
        super().__init__()
        self.controls = controls

    def controls_snapshot(self) -> Controls:
        return self.controls

    def inherit_controls(self, controls: Controls) -> None:
        self.controls = self.controls.merged(controls)


def test_the_kill_switch_survives_a_leader_change_in_the_lease() -> None:
    from kubernetes import client as k8s

    from tailguard.controller.adapters.lease.leader import LeaderElector
    from tests.support.fake_kubernetes import FakeKubernetes

    clock = ManualClock()
    with FakeKubernetes() as fake:
        api = k8s.CoordinationV1Api(fake.api_client())
        a = LeaderElector(api, "tailguard", "llm", "pod-a", 15, clock)
        b = LeaderElector(api, "tailguard", "llm", "pod-b", 15, clock)
        killed = Controls({ALL: Control(True, "oncall", "freeze", 1.0)})
        old, new = _ControlsHandover(killed), _ControlsHandover(Controls())
        a.attach_handover(old)
        b.attach_handover(new)
        assert a.run_once() is True
        assert b.run_once() is False  # b follows, and sees the Lease record
        clock.advance(16.0)  # a is gone: its Lease expires
        assert b.run_once() is True
        assert new.controls.killed is not None and new.controls.killed.by == "oncall"
