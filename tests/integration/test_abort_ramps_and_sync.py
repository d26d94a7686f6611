"""`tailguard abort` against the spec-validating fake servers: a traffic ramp on an HTTPRoute or a VirtualService
stops before its next weight step (the exact writes up to the abort, the weights left in the fake), an Argo CD sync
wait stops at its next poll (the rollback request stays), and a restart after an abort mid-ramp does not resume it.

The operator's abort arrives during a hold or a poll: the test's clock calls `Dispatcher.abort` from its sleep (the
moment the real one would be waiting), then the wait ends as an abort cuts it short."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from kubernetes import client as k8s

from tailguard.controller.adapters.argocd.client import ArgoCDClient
from tailguard.controller.adapters.argocd.settings import ArgoCDApp
from tailguard.controller.adapters.rollback.argocd import ArgoCDRollback, BadRevisionRecord
from tailguard.controller.adapters.stores.journal import Journal
from tailguard.controller.adapters.traffic.routes import HttpRouteRouter, Ramp, VirtualServiceRouter
from tailguard.controller.core.actions import ActionStatus
from tailguard.controller.core.controls import AbortRequest, AbortState
from tailguard.controller.kit.clock import ManualClock, ShutdownInterrupt
from tailguard.controller.loop.dispatcher import Actuators, Dispatcher, GlobalLimits
from tailguard.controller.testing import make_decision
from tests.support.fake_argocd import FakeArgoCD, application
from tests.support.fake_kubernetes import FakeKubernetes, http_route, virtual_service

pytestmark = pytest.mark.integration

T0 = 1_700_000_000.0
RAMP = Ramp(steps=(25, 50, 75), hold_seconds=60)


class OperatorClock(ManualClock):
    """A ManualClock on whose `at`-th sleep (a ramp's hold, a sync poll) `operator()` runs first: the abort arrives
    while the dispatcher waits."""

    def __init__(self, at: int, start: float = T0) -> None:
        super().__init__(start)
        self.at = at
        self.sleeps = 0
        self.operator: Callable[[], None] = lambda: None

    def sleep(self, seconds: float) -> None:
        self.sleeps += 1
        if self.sleeps == self.at:
            self.operator()
        super().sleep(seconds)


def abort_of(decision_id: str, at: float = T0) -> AbortRequest:
    return AbortRequest(decision_id, "alice (bearer token)", "INC-7: r2 looks fine after all", at)


def operator_aborts(dispatcher: Dispatcher, decision_id: str) -> None:
    assert dispatcher.abort(abort_of(decision_id)).state is AbortState.IN_FLIGHT


def ramp_up(service: str = "chat") -> Any:
    return make_decision([("shift_traffic", {"service": service, "version": "r2", "weight": 100})], onset=T0)


@pytest.fixture
def fake() -> Iterator[FakeKubernetes]:
    with FakeKubernetes() as server:
        server.put_object(http_route("chat", backends={"chat-r1": 100, "chat-r2": 0}))
        server.put_object(virtual_service("chat", subsets={"r1": 100, "r2": 0}))
        yield server


def http_dispatcher(fake: FakeKubernetes, path: Path, clock: ManualClock) -> Dispatcher:
    router = HttpRouteRouter(k8s.CustomObjectsApi(fake.api_client()), clock=clock, namespace="llm", ramp=RAMP)
    return Dispatcher(Journal(path), Actuators(router=router), clock, GlobalLimits())


def route_writes(fake: FakeKubernetes) -> list[dict[str, int]]:
    return [
        {ref["name"]: ref["weight"] for ref in call.body["spec"]["rules"][0]["backendRefs"]}
        for call in fake.calls("update", "httproutes")
    ]


def route_weights(fake: FakeKubernetes) -> dict[str, int]:
    stored = fake.get_object("httproutes", "llm", "chat")
    assert stored is not None
    return {ref["name"]: ref["weight"] for ref in stored["spec"]["rules"][0]["backendRefs"]}


def test_an_httproute_ramp_stops_before_its_next_step(fake: FakeKubernetes, tmp_path: Path) -> None:
    clock = OperatorClock(at=2)  # during the second hold: steps 25 and 50 are written
    dispatcher = http_dispatcher(fake, tmp_path / "journal.db", clock)
    decision = ramp_up()
    answers: list[Any] = []
    clock.operator = lambda: answers.append(dispatcher.abort(abort_of(decision.id, clock.now())))

    (record,) = dispatcher.dispatch(decision)

    assert [answer.state for answer in answers] == [AbortState.IN_FLIGHT]
    assert route_writes(fake) == [{"chat-r1": 75, "chat-r2": 25}, {"chat-r1": 50, "chat-r2": 50}]
    assert route_weights(fake) == {"chat-r1": 50, "chat-r2": 50}
    assert record.status is ActionStatus.ABORTED and record.attempts == 1
    assert record.result is not None
    detail = record.result["detail"]
    assert detail["weights"] == {"r1": 50, "r2": 50} and detail["reached"] == {"r1": 50, "r2": 50}
    assert (detail["steps_written"], detail["steps_not_written"]) == ([25, 50], [75, 100])
    assert detail["consistent_step"] is True and detail["aborted"]["by"] == "alice (bearer token)"
    assert record.result["after"] == {"traffic": {"r1": 50, "r2": 50}}
    assert record.error == (
        "HTTPRoute llm/chat: ramp to 100% aborted by alice (bearer token): INC-7: r2 looks fine after all; stopped "
        "before step 3 of 4: weights left at {'r1': 50, 'r2': 50}, step 2's, whole"
    )
    events = dispatcher.journal.action_events(record.idempotency_key)  # type: ignore[attr-defined]
    assert [event["event"] for event in events] == ["abort_requested", "aborted"]
    # Nothing more is written later, and a second abort says it is finished.
    assert dispatcher.dispatch(decision)[0].status is ActionStatus.ABORTED
    assert len(route_writes(fake)) == 2
    assert dispatcher.abort(abort_of(decision.id)).state is AbortState.FINISHED


def test_a_virtualservice_ramp_aborted_in_its_first_hold_keeps_its_first_step(
    fake: FakeKubernetes, tmp_path: Path
) -> None:
    clock = OperatorClock(at=1)
    router = VirtualServiceRouter(k8s.CustomObjectsApi(fake.api_client()), clock=clock, namespace="llm", ramp=RAMP)
    dispatcher = Dispatcher(Journal(tmp_path / "journal.db"), Actuators(router=router), clock, GlobalLimits())
    decision = ramp_up()
    clock.operator = lambda: operator_aborts(dispatcher, decision.id)

    (record,) = dispatcher.dispatch(decision)

    writes = [
        {route["destination"]["subset"]: route["weight"] for route in call.body["spec"]["http"][0]["route"]}
        for call in fake.calls("update", "virtualservices")
    ]
    assert writes == [{"r1": 75, "r2": 25}]
    stored = fake.get_object("virtualservices", "llm", "chat")
    assert stored is not None
    assert [(r["destination"]["subset"], r["weight"]) for r in stored["spec"]["http"][0]["route"]] == [
        ("r1", 75),
        ("r2", 25),
    ]
    assert record.status is ActionStatus.ABORTED
    assert record.result is not None and record.result["detail"]["weights"] == {"r1": 75, "r2": 25}
    assert record.error is not None and "before step 2 of 4" in record.error


def test_a_restart_after_an_abort_mid_ramp_does_not_resume_the_ramp(fake: FakeKubernetes, tmp_path: Path) -> None:
    path = tmp_path / "journal.db"
    clock = OperatorClock(at=1)
    dispatcher = http_dispatcher(fake, path, clock)
    decision = ramp_up()

    def abort_then_stop() -> None:
        dispatcher.abort(abort_of(decision.id))
        raise ShutdownInterrupt("SIGTERM during the hold, before the ramp saw the abort")

    clock.operator = abort_then_stop
    with pytest.raises(ShutdownInterrupt):
        dispatcher.dispatch(decision)
    dispatcher.journal.close()  # type: ignore[attr-defined]
    assert route_writes(fake) == [{"chat-r1": 75, "chat-r2": 25}]

    # The next process resumes what was left started: the journaled abort ends it, nothing is written.
    after = http_dispatcher(fake, path, ManualClock(clock.now()))
    (record,) = after.resume()
    assert record.status is ActionStatus.ABORTED
    assert record.error is not None and record.error.endswith("; not resumed after a restart")
    assert record.result is not None and record.result["after"] == {"traffic": {"r1": 75, "r2": 25}}
    assert route_writes(fake) == [{"chat-r1": 75, "chat-r2": 25}]
    assert route_weights(fake) == {"chat-r1": 75, "chat-r2": 25}
    assert after.resume() == []


# ----- Argo CD: the sync wait ---------------------------------------------------------------------------------


@pytest.fixture
def argocd() -> Iterator[FakeArgoCD]:
    with FakeArgoCD() as server:
        server.add_app(application("llm-web", [("r1", T0 - 3000), ("r2", T0 - 2000), ("r3", T0 - 60)]))
        server.state.progress_polls = 100  # the sync stays Running for the whole test
        yield server
    assert server.state.spec_violations == [], server.state.spec_violations


def test_an_argocd_sync_wait_stops_at_its_next_poll_and_the_rollback_stays(argocd: FakeArgoCD, tmp_path: Path) -> None:
    clock = OperatorClock(at=2)  # during the second poll interval
    client = ArgoCDClient(argocd.url, clock=clock, token=lambda: "argocd-test-token", timeout=2.0, retries=3)
    record_file = BadRevisionRecord(tmp_path / "bad.json")
    rollback = ArgoCDRollback(
        client, {"web": ArgoCDApp(name="llm-web")}, clock=clock, wait_timeout=300, poll_interval=5, record=record_file
    )
    dispatcher = Dispatcher(Journal(tmp_path / "journal.db"), Actuators(rollback=rollback), clock, GlobalLimits())
    decision = make_decision([("rollback", {"service": "web"})], onset=T0)
    clock.operator = lambda: operator_aborts(dispatcher, decision.id)

    (record,) = dispatcher.dispatch(decision)

    posts = [call.body for call in argocd.calls("POST", "/rollback") if call.status == 200]
    assert posts == [{"name": "llm-web", "id": 2, "dryRun": False, "prune": False}]  # sent once, never again
    gets = len(argocd.calls("GET"))
    assert record.status is ActionStatus.ABORTED and record.attempts == 1
    assert record.result is not None
    detail = record.result["detail"]
    assert detail["polls"] == 2 and detail["last_seen"] == "operation Running, health Progressing"
    assert detail["rollback_request"].startswith("sent by this attempt; it stays with Argo CD (not undone)")
    assert record.error == (
        "rollback of 'llm-web' to r2: wait for sync and health aborted by alice (bearer token): INC-7: r2 looks fine "
        "after all after 2 poll(s); the rollback request stays with Argo CD; last seen: operation Running, health "
        "Progressing"
    )
    status = argocd.app("llm-web")["status"]
    assert status["operationState"]["phase"] == "Running"  # Argo CD carries on; tailguard stopped waiting
    assert record_file.done(record.idempotency_key) is None  # not recorded as a finished rollback
    assert dispatcher.dispatch(decision)[0].status is ActionStatus.ABORTED
    assert len(argocd.calls("GET")) == gets  # no more polls


def test_an_argocd_rollback_aborted_before_its_post_sends_nothing(argocd: FakeArgoCD, tmp_path: Path) -> None:
    clock = ManualClock(T0)
    client = ArgoCDClient(argocd.url, clock=clock, token=lambda: "argocd-test-token", timeout=2.0, retries=3)
    rollback = ArgoCDRollback(client, {"web": ArgoCDApp(name="llm-web")}, clock=clock, poll_interval=5)
    journal = Journal(tmp_path / "journal.db")
    dispatcher = Dispatcher(journal, Actuators(rollback=rollback), clock, GlobalLimits())
    decision = make_decision([("rollback", {"service": "web"})], onset=T0)
    original = rollback.rollback

    def abort_then_rollback(*args: Any, **kwargs: Any) -> Any:
        dispatcher.abort(abort_of(decision.id))  # the operator, after the start was journaled, before the POST
        return original(*args, **kwargs)

    rollback.rollback = abort_then_rollback  # type: ignore[method-assign]
    (record,) = dispatcher.dispatch(decision)
    assert record.status is ActionStatus.ABORTED
    assert argocd.calls("POST", "/rollback") == []
    assert record.result is not None and record.result["detail"]["rollback_request"] == "not sent"
    assert record.error is not None and record.error.endswith("before it was sent; nothing sent")
