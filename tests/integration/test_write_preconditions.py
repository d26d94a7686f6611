"""Issue 23 (3, 4) and issue 24 (5): every write checks the world it was decided on, actions expire, and a
Deployment rollback retries through conflicts and 5xx within its deadline; against the spec-validating fakes
(tests/support/fake_argocd.py, fake_kubernetes.py), which record every request.

The crash between a decision and its plan: process A commits the decision and dispatches it with its action
queued on a worker that never runs it (its `may_act` says no: the process died, or lost the Lease, while the
action was queued); a human deploys a fix; process B resumes from A's journal. At 7710821 the worker planned at
resume time from the world it found and "rolled back" the fix to the bad revision; now the plan is the decision's
(from the bad revision) and B's precondition check finds the fix: `world-changed`, nothing written.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from kubernetes import client as k8s

from tailguard.controller.adapters.argocd.client import ArgoCDClient
from tailguard.controller.adapters.argocd.settings import ArgoCDApp
from tailguard.controller.adapters.rollback.argocd import ArgoCDRollback, BadRevisionRecord
from tailguard.controller.adapters.rollback.deployment import CHANGE_CAUSE, DeploymentRollback, RollbackRecord
from tailguard.controller.adapters.stores.journal import ActionStatus, Journal
from tailguard.controller.core.engine import PolicyState
from tailguard.controller.core.model import Decision
from tailguard.controller.kit.clock import ManualClock
from tailguard.controller.kit.http import RetryPolicy
from tailguard.controller.loop.dispatcher import Actuators, Dispatcher, GlobalLimits
from tailguard.controller.testing import condition_state, make_decision
from tests.support.fake_argocd import FakeArgoCD, application
from tests.support.fake_kubernetes import FakeKubernetes, deployment

T0 = 1_767_225_600.0
GOOD1, GOOD2, BAD3, FIX4 = "1111aaaa", "2222bbbb", "3333cccc", "4444dddd"
TOKEN = "argocd-test-token"
NS = "llm"
DAY = 86_400.0


# ----- Argo CD -------------------------------------------------------------------------------------------


@pytest.fixture
def argocd() -> Iterator[FakeArgoCD]:
    with FakeArgoCD() as fake:
        fake.state.progress_polls = 0
        fake.add_app(application("chat", [(GOOD1, T0 - 7200), (GOOD2, T0 - 3600), (BAD3, T0 - 600)]))
        yield fake


def argocd_rollback(fake: FakeArgoCD, tmp: Path, clock: ManualClock) -> ArgoCDRollback:
    client = ArgoCDClient(fake.url, clock=clock, token=lambda: TOKEN, timeout=5.0, retries=2, backoff=0.1)
    return ArgoCDRollback(
        client,
        {"chat": ArgoCDApp(name="chat")},
        clock=clock,
        wait_timeout=300.0,
        poll_interval=5.0,
        record=BadRevisionRecord(tmp / "argocd-bad-revisions.json"),
    )


def queued_then_died(journal: Journal, actuators: Actuators, clock: ManualClock, decision: Decision) -> None:
    """Process A: decides (the evaluation's commit, then dispatch) and dies while the action is queued."""
    journal.commit_evaluation(decision.policy, PolicyState(), [decision], clock.now())
    dispatcher = Dispatcher(journal, actuators, clock, GlobalLimits(), workers=True, may_act=lambda: False)
    dispatcher.dispatch(decision)
    assert dispatcher.wait_idle(10.0)
    dispatcher.close()
    journal.close()


def test_argocd_a_human_fix_before_the_restart_stays(argocd: FakeArgoCD, tmp_path: Path) -> None:
    clock = ManualClock(T0)
    decision = make_decision([("rollback", {"service": "chat"})], onset=T0 - 60, at=T0)
    queued_then_died(Journal(tmp_path / "journal.db"), Actuators(rollback=argocd_rollback(argocd, tmp_path, clock)),
                     clock, decision)  # fmt: skip
    # The on-call engineer deploys a fix before the controller restarts.
    argocd.add_app(application("chat", [(GOOD1, T0 - 7200), (GOOD2, T0 - 3600), (BAD3, T0 - 600), (FIX4, T0 + 20)]))
    clock.advance(30)
    with Journal(tmp_path / "journal.db") as journal:
        restarted = Dispatcher(journal, Actuators(rollback=argocd_rollback(argocd, tmp_path, clock)), clock,
                               GlobalLimits())  # fmt: skip
        [record] = restarted.resume()
        assert restarted.resume() == []
    assert argocd.calls("POST", "/rollback") == [], "the resume rolled the fix back"
    assert argocd.app("chat")["status"]["sync"]["revision"] == FIX4
    assert record.status is ActionStatus.WORLD_CHANGED, record
    assert record.plan is not None and (record.plan["from_revision"], record.plan["to_revision"]) == (BAD3, GOOD2)
    assert record.plan["decided_at"] == T0  # planned by the decision, before the process died
    assert f"the application runs {FIX4}" in (record.error or "")
    assert argocd.state.spec_violations == []


def test_a_forty_day_old_planned_rollback_does_not_run_at_start(argocd: FakeArgoCD, tmp_path: Path) -> None:
    """A journal left with a `planned` rollback (its decision 40 days old) and a healthy service: the start
    ends it `expired`; nothing is read or written."""
    old = T0 - 40 * DAY
    decision = make_decision([("rollback", {"service": "chat"})], onset=old - 60, at=old)
    with Journal(tmp_path / "journal.db") as journal:
        journal.commit_evaluation(decision.policy, PolicyState(), [decision], old)
    clock = ManualClock(T0)
    with Journal(tmp_path / "journal.db") as journal:
        dispatcher = Dispatcher(journal, Actuators(rollback=argocd_rollback(argocd, tmp_path, clock)), clock,
                                GlobalLimits())  # fmt: skip
        [record] = dispatcher.resume()
        assert dispatcher.resume() == []
        events = [event["event"] for event in journal.action_events(record.idempotency_key)]
    assert argocd.state.requests == [], "the 40-day-old rollback ran"
    assert record.status is ActionStatus.EXPIRED and "past its deadline" in (record.error or ""), record
    assert argocd.app("chat")["status"]["sync"]["revision"] == BAD3
    assert events == []  # never planned, never started


# ----- Deployment ------------------------------------------------------------------------------------------


@pytest.fixture
def kube() -> Iterator[FakeKubernetes]:
    now = {"t": T0 - 7200}
    with FakeKubernetes(deployment_controller=True, now=lambda: now["t"]) as server:
        server.clock_now = now  # type: ignore[attr-defined]
        body = deployment("chat", image="vllm:0.30")
        body["metadata"]["namespace"] = NS
        body["metadata"]["annotations"] = {CHANGE_CAUSE: "install 0.30"}
        server.put_object(body)  # revision 1
        roll_out(server, "vllm:0.31", at=T0 - 3600)  # revision 2
        roll_out(server, "vllm:0.32", at=T0 - 600)  # revision 3: v3-bad
        yield server


def roll_out(fake: FakeKubernetes, image: str, *, at: float) -> None:
    """A human rollout (`kubectl set image`): the fake deployment controller makes the next revision."""
    fake.clock_now["t"] = at  # type: ignore[attr-defined]
    found = fake.get_object("deployments", NS, "chat")
    assert found is not None
    found["spec"]["template"]["spec"]["containers"][0]["image"] = image
    found["metadata"].setdefault("annotations", {})[CHANGE_CAUSE] = f"human: {image}"
    k8s.AppsV1Api(fake.api_client()).replace_namespaced_deployment("chat", NS, found)


def image(fake: FakeKubernetes) -> str:
    found = fake.get_object("deployments", NS, "chat")
    assert found is not None
    return str(found["spec"]["template"]["spec"]["containers"][0]["image"])


def deployment_rollback(fake: FakeKubernetes, tmp: Path, clock: ManualClock) -> DeploymentRollback:
    api = fake.api_client()
    return DeploymentRollback(
        k8s.AppsV1Api(api),
        k8s.CoreV1Api(api),
        clock=clock,
        namespace=NS,
        record=RollbackRecord(tmp / "deployment-bad.json"),
        retry=RetryPolicy(attempts=1),
    )


def test_deployment_a_human_fix_before_the_restart_stays(kube: FakeKubernetes, tmp_path: Path) -> None:
    clock = ManualClock(T0)
    decision = make_decision([("rollback", {"service": "chat"})], onset=T0 - 60, at=T0)
    queued_then_died(Journal(tmp_path / "journal.db"), Actuators(rollback=deployment_rollback(kube, tmp_path, clock)),
                     clock, decision)  # fmt: skip
    roll_out(kube, "vllm:0.33", at=T0 + 20)  # v4-fix
    clock.advance(30)
    with Journal(tmp_path / "journal.db") as journal:
        restarted = Dispatcher(journal, Actuators(rollback=deployment_rollback(kube, tmp_path, clock)), clock,
                               GlobalLimits())  # fmt: skip
        [record] = restarted.resume()
    assert kube.calls("patch", "deployments") == [], "the resume rolled the fix back"
    assert image(kube) == "vllm:0.33"
    assert record.status is ActionStatus.WORLD_CHANGED, record
    assert record.plan is not None and (record.plan["from_revision"], record.plan["to_revision"]) == (3, 2)
    assert "changed by someone else since the plan" in (record.error or "")


def test_deployment_rollback_through_a_conflict_and_a_burst_of_5xx(kube: FakeKubernetes, tmp_path: Path) -> None:
    """Issue 24 (5): the first patch meets a concurrent writer (its resourceVersion `test` fails: read again,
    precondition checked again, patched again), the next four get 503s (backed off and tried again within the
    action's deadline): exactly one rollback lands, 0.32 -> 0.31, and the journal shows each attempt."""
    clock = ManualClock(T0)
    kube.inject("patch", "deployments", hook=lambda: kube.touch("deployments", NS, "chat"))
    kube.inject("patch", "deployments", status=503, times=4)
    decision = make_decision([("rollback", {"service": "chat"})], onset=T0 - 60, at=T0)
    with Journal(tmp_path / "journal.db") as journal:
        journal.commit_evaluation(decision.policy, PolicyState(), [decision], T0)
        dispatcher = Dispatcher(
            journal,
            Actuators(rollback=deployment_rollback(kube, tmp_path, clock)),
            clock,
            GlobalLimits(),
            attempts=3,
            backoff=1.0,
        )
        [record] = dispatcher.dispatch(decision)
        attempts = [e["detail"] for e in journal.action_events(record.idempotency_key) if e["event"] == "attempt"]
    assert record.status is ActionStatus.SUCCEEDED, record
    assert image(kube) == "vllm:0.31"
    patches = kube.calls("patch", "deployments")
    statuses: list[Any] = [call.status for call in patches]
    assert statuses == [422, 503, 503, 503, 503, 200]
    assert all(call.body[0] == {"op": "test", "path": "/metadata/resourceVersion", "value": call.body[0]["value"]}
               for call in patches)  # fmt: skip
    assert len(attempts) == 4 and all("503" in detail for detail in attempts), attempts
    assert record.attempts == 5
    assert record.plan is not None and clock.now() <= record.plan["deadline"]  # within the deadline, by far


@pytest.mark.parametrize("blamed", [BAD3, None], ids=["attributed", "unattributed"])
def test_a_late_plan_never_rolls_back_a_revision_deployed_after_the_decision(
    blamed: str | None, argocd: FakeArgoCD, tmp_path: Path
) -> None:
    """The decision's plan never reached the journal (the process died between the commit and the plan); a human
    deploys fix4; after the restart the breach still holds, and the evaluation plans the waiting rollback from the
    world it sees: fix4 was not what the decision blamed (attributed), and was deployed after the decision
    (either way): `world-changed`, nothing written."""
    clock = ManualClock(T0)
    params = {"service": "chat", **({"rollout_revision": blamed} if blamed else {})}
    decision = make_decision([("rollback", params)], onset=T0 - 60, at=T0)
    with Journal(tmp_path / "journal.db") as journal:
        journal.commit_evaluation(decision.policy, PolicyState(), [decision], T0)
    argocd.add_app(application("chat", [(GOOD1, T0 - 7200), (GOOD2, T0 - 3600), (BAD3, T0 - 600), (FIX4, T0 + 20)]))
    clock.advance(30)
    with Journal(tmp_path / "journal.db") as journal:
        dispatcher = Dispatcher(journal, Actuators(rollback=argocd_rollback(argocd, tmp_path, clock)), clock,
                                GlobalLimits())  # fmt: skip
        [waiting] = dispatcher.resume()
        assert waiting.status is ActionStatus.DEFERRED and waiting.plan is None
        [record] = dispatcher.retry_deferred(decision.policy, condition_state(decision))
    assert argocd.calls("POST", "/rollback") == []
    assert argocd.app("chat")["status"]["sync"]["revision"] == FIX4
    assert record.status is ActionStatus.WORLD_CHANGED, record
    reason = "the decision blamed revision" if blamed else "was deployed after the decision"
    assert reason in (record.error or "")


def test_deployment_a_late_plan_never_rolls_back_a_rollout_after_the_decision(
    kube: FakeKubernetes, tmp_path: Path
) -> None:
    """As above for a Deployment: the decision's plan was lost, v4-fix rolled out (its ReplicaSet created after the
    decision), the breach still holds: the waiting rollback's late plan is `world-changed`, no patch."""
    clock = ManualClock(T0)
    decision = make_decision([("rollback", {"service": "chat"})], onset=T0 - 60, at=T0)
    with Journal(tmp_path / "journal.db") as journal:
        journal.commit_evaluation(decision.policy, PolicyState(), [decision], T0)
    roll_out(kube, "vllm:0.33", at=T0 + 20)
    clock.advance(30)
    with Journal(tmp_path / "journal.db") as journal:
        dispatcher = Dispatcher(journal, Actuators(rollback=deployment_rollback(kube, tmp_path, clock)), clock,
                                GlobalLimits())  # fmt: skip
        [waiting] = dispatcher.resume()
        assert waiting.status is ActionStatus.DEFERRED and waiting.plan is None
        [record] = dispatcher.retry_deferred(decision.policy, condition_state(decision))
    assert kube.calls("patch", "deployments") == []
    assert image(kube) == "vllm:0.33"
    assert record.status is ActionStatus.WORLD_CHANGED and "deployed after the decision" in (record.error or "")
