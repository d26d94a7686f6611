"""Issue 23 (5): failover adopts, never suppresses. Two replicas, one Lease on the spec-validating fake Kubernetes
API, one Argo CD application on the spec-validating fake Argo CD; each replica its own journal and dispatcher.

The leader A decides a rollback (its journal commits it, the Lease is written before acting) and dies while the
action is queued (its plan journaled and published) or while it plans (no plan yet). At 7710821 its successor B
saw only "a mutating action 6 s ago" and held back for the cooldown: the rollback was lost. Now B adopts the
unfinished action from the Lease and runs it after its precondition check (or, unplanned, once an evaluation of B
finds the breach still there): exactly one rollback, by B. A, back later, never runs its stale copy.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from kubernetes import client as k8s

from tailguard.controller.adapters.argocd.client import ArgoCDClient
from tailguard.controller.adapters.argocd.settings import ArgoCDApp
from tailguard.controller.adapters.lease.leader import LeaderElector
from tailguard.controller.adapters.rollback.argocd import ArgoCDRollback, BadRevisionRecord
from tailguard.controller.adapters.stores.journal import ActionStatus, Journal
from tailguard.controller.core.engine import PolicyState
from tailguard.controller.core.handover import PENDING_ANNOTATION
from tailguard.controller.kit.clock import ManualClock
from tailguard.controller.loop.adoption import Adoption
from tailguard.controller.loop.dispatcher import Actuators, Dispatcher, GlobalLimits
from tailguard.controller.testing import condition_state, make_decision
from tests.chaos.kills import Chaos, CrashingSession, SimulatedCrash
from tests.support.fake_argocd import FakeArgoCD, application
from tests.support.fake_kubernetes import FakeKubernetes

T0 = 1_767_225_600.0
GOOD1, GOOD2, BAD3 = "1111aaaa", "2222bbbb", "3333cccc"
TOKEN = "argocd-test-token"
LEASE = 15.0
DEADLINE = 45.0  # 3 intervals of 15 s


@dataclass
class Replica:
    name: str
    journal: Journal
    dispatcher: Dispatcher
    elector: LeaderElector


@pytest.fixture
def world() -> Iterator[tuple[FakeKubernetes, FakeArgoCD]]:
    with FakeKubernetes() as kube, FakeArgoCD() as argocd:
        argocd.state.progress_polls = 0
        argocd.add_app(application("chat", [(GOOD1, T0 - 7200), (GOOD2, T0 - 3600), (BAD3, T0 - 600)]))
        yield kube, argocd


def replica(name: str, tmp: Path, kube: FakeKubernetes, argocd: FakeArgoCD, clock: ManualClock, **kw: Any) -> Replica:
    session = kw.pop("session", None)
    client = ArgoCDClient(argocd.url, clock=clock, token=lambda: TOKEN, timeout=5.0, retries=1, backoff=0.1,
                          **({"session": session} if session is not None else {}))  # fmt: skip
    rollback = ArgoCDRollback(
        client,
        {"chat": ArgoCDApp(name="chat")},
        clock=clock,
        wait_timeout=300.0,
        poll_interval=5.0,
        record=BadRevisionRecord(tmp / f"{name}-bad-revisions.json"),
    )
    journal = Journal(tmp / f"{name}.db")
    elector = LeaderElector(k8s.CoordinationV1Api(kube.api_client()), "tailguard", "llm", name, LEASE, clock)
    dispatcher = Dispatcher(
        journal,
        Actuators(rollback=rollback),
        clock,
        GlobalLimits(),
        deadline_for=lambda _policy: DEADLINE,
        on_planned=lambda _policy: elector.publish(),
        **kw,
    )
    elector.attach_pending(Adoption(journal, dispatcher.planner, clock))
    return Replica(name, journal, dispatcher, elector)


def take_over(successor: Replica, clock: ManualClock) -> None:
    """The successor sees the dead leader's Lease, waits it out (expiry by its own observation) and acquires it."""
    assert successor.elector.run_once() is False
    clock.advance(LEASE + 1)
    assert successor.elector.run_once() is True


def rollback_posts(argocd: FakeArgoCD) -> list[Any]:
    return argocd.calls("POST", "/rollback")


def test_leader_killed_while_the_rollback_is_queued(world: tuple[FakeKubernetes, FakeArgoCD], tmp_path: Path) -> None:
    kube, argocd = world
    clock = ManualClock(T0)
    a = replica("a", tmp_path, kube, argocd, clock, workers=True, may_act=lambda: False)
    b = replica("b", tmp_path, kube, argocd, clock)
    assert a.elector.run_once() is True
    decision = make_decision([("rollback", {"service": "chat"})], onset=T0 - 30, at=T0)
    a.journal.commit_evaluation(decision.policy, PolicyState(), [decision], T0)
    assert a.elector.publish()  # before acting, as the controller does
    a.dispatcher.dispatch(decision)  # planned (and published), queued; A dies before its worker runs it
    assert a.dispatcher.wait_idle(10.0) and a.dispatcher.close()
    assert PENDING_ANNOTATION in (kube.get_object("leases", "llm", "tailguard") or {})["metadata"]["annotations"]
    assert rollback_posts(argocd) == []

    take_over(b, clock)
    [record] = b.dispatcher.resume()
    assert [post.body["id"] for post in rollback_posts(argocd)] == [2], "not exactly one rollback, to good2"
    assert argocd.app("chat")["status"]["sync"]["revision"] == GOOD2
    assert record.status is ActionStatus.SUCCEEDED, record
    assert record.plan is not None and record.plan["decided_at"] == T0  # A's decision's plan, checked by B
    gets = [index for index, r in enumerate(argocd.state.requests) if r.method == "GET"]
    post = next(index for index, r in enumerate(argocd.state.requests) if r.method == "POST")
    assert any(index < post for index in gets)  # the precondition read came before the write
    assert next(e["event"] for e in b.journal.action_events(record.idempotency_key)) == "adopted"

    # A comes back and leads again later: its stale copy never runs.
    b.elector.release()
    clock.advance(DEADLINE + 60)
    a_again = replica("a", tmp_path, kube, argocd, clock)
    assert a_again.elector.run_once() is True
    [stale] = a_again.dispatcher.resume()
    assert stale.status is ActionStatus.EXPIRED, stale
    assert len(rollback_posts(argocd)) == 1
    assert argocd.state.spec_violations == []


def test_leader_killed_while_it_plans(world: tuple[FakeKubernetes, FakeArgoCD], tmp_path: Path) -> None:
    kube, argocd = world
    clock = ManualClock(T0)

    class DiesOnTheFirstRead(Chaos):
        def point(self, where: str) -> None:
            if "GET" in where and self.died_at is None:
                self.died_at = where
                raise SimulatedCrash(where)

    a = replica("a", tmp_path, kube, argocd, clock, session=CrashingSession(DiesOnTheFirstRead(None)))
    b = replica("b", tmp_path, kube, argocd, clock)
    assert a.elector.run_once() is True
    decision = make_decision([("rollback", {"service": "chat"})], onset=T0 - 30, at=T0)
    a.journal.commit_evaluation(decision.policy, PolicyState(), [decision], T0)
    assert a.elector.publish()
    with pytest.raises(SimulatedCrash):
        a.dispatcher.dispatch(decision)  # dies reading Argo CD for the plan

    take_over(b, clock)
    [waiting] = b.dispatcher.resume()
    assert waiting.status is ActionStatus.DEFERRED and waiting.plan is None  # no plan: never planned by a resume
    assert rollback_posts(argocd) == []
    # B's next evaluation finds the breach still there (its own streak, so its own decision id): planned from the
    # world it sees, then run.
    ours = make_decision([("rollback", {"service": "chat"})], onset=T0 + 5, at=T0 + 20)
    [record] = b.dispatcher.retry_deferred(decision.policy, condition_state(ours))
    assert record.status is ActionStatus.SUCCEEDED, record
    assert [post.body["id"] for post in rollback_posts(argocd)] == [2]
    assert argocd.app("chat")["status"]["sync"]["revision"] == GOOD2
    assert argocd.state.spec_violations == []
