"""Issue 23: incidents, one per service scope, held in a store every replica reads (items 1, 2, 6, 7).

Each scenario runs the real Controller, Dispatcher and Journal on a ManualClock with the shipped example policies
and the shipped global limits (the simulator of tests/scenarios/test_incident_matrix.py), wired as `tailguard run`
wires it (controller/app/build.py, `incident_layer`): the incident keeper wraps the dispatcher, the rollback and
scale ports and the change tracker. Every external call is recorded in order (`Tape`) and each scenario asserts
that exact sequence, the final world, and the incident as the store holds it.

At 7710821 (no incidents) each of these scenarios made a wrong write or none; the comment of each test says which.
`pytest -p tests.support.without_incidents tests/scenarios/test_incidents.py` runs them with the incident layer
switched off: each of those fails on that write (the last test, a shift counted in its incident, has no such
write: it fails there for want of an incident).
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any, cast

import pytest
from kubernetes import client as k8s

from tailguard.controller.adapters.lease.leader import LeaderElector
from tailguard.controller.adapters.scale.hpa import HpaBounds, HpaScaler
from tailguard.controller.adapters.stores.incident_resources import KubernetesIncidentStore
from tailguard.controller.adapters.stores.incidents import SqliteIncidentStore
from tailguard.controller.adapters.stores.journal import Journal
from tailguard.controller.app.operate import format_status, journal_status
from tailguard.controller.app.status_page import render_status_page
from tailguard.controller.core.attribution import Rollout
from tailguard.controller.core.incidents import Incident, IncidentPhase
from tailguard.controller.core.ports import DispatcherPort
from tailguard.controller.kit.clock import ManualClock
from tailguard.controller.loop.dispatcher import Actuators, Dispatcher
from tailguard.controller.loop.incident_ports import incident_layer
from tailguard.controller.loop.incidents import IncidentKeeper
from tailguard.controller.testing import (
    FakeAnnotator,
    FakeChangeTracker,
    FakeNotifier,
    FakeRollback,
    FakeRouter,
    FakeScaler,
)
from tests.scenarios.test_incident_matrix import (
    ARGOCD_TOKEN,
    CHAT,
    CHAT_R1,
    CHAT_R2,
    P99,
    QUEUE,
    ROLLBACK_TO_GOOD1,
    T0,
    Pod,
    PodClock,
    Replica,
    Tape,
    World,
    argocd_finishes,
    argocd_rollback,
    argocd_writes,
    example,
    run_for,
    tick,
)
from tests.support.fake_argocd import FakeArgoCD, application
from tests.support.fake_kubernetes import FakeKubernetes, hpa

ATTRIBUTED = "attributed-rollback-or-scale"
R3 = Rollout(labels={"service": "chat"}, revision="3", previous_revision="2", at=T0 - 60, source="argocd")


class IncidentReplica:
    """A Replica wired with the incident layer over a store (SQLite in the journal's file by default)."""

    def __init__(
        self,
        tmp: Path,
        policies: Mapping[str, str],
        actuators: Actuators,
        clock: Any,
        world: World,
        *,
        change_tracker: FakeChangeTracker | None = None,
        name: str = "pod",
    ) -> None:
        self.store = SqliteIncidentStore(tmp / f"{name}.db")
        self.keeper = IncidentKeeper(self.store, clock)
        layer = incident_layer(self.keeper, actuators, change_tracker)

        def wrap(dispatcher: Dispatcher, journal: Journal) -> DispatcherPort:
            return layer.dispatcher(dispatcher)

        self.replica = Replica(
            tmp, name, policies, layer.actuators, clock, world=world, change_tracker=cast(Any, layer.change_tracker),
            wrap_dispatcher=wrap,
        )  # fmt: skip
        self.keeper.bind(self.replica.controller.policies)

    def incidents(self) -> list[Incident]:
        return list(reversed(self.store.incidents(open_only=False)))

    def stop(self) -> None:
        self.replica.stop()  # the store stays open: the test reads the incidents after


@pytest.fixture
def kube() -> Iterator[FakeKubernetes]:
    with FakeKubernetes() as server:
        yield server


# ----- both shipped P99 policies, a recovery slower than the global cooldown ----------------------------------------


def test_both_p99_policies_with_a_slow_recovery_roll_back_exactly_once(tmp_path: Path) -> None:
    # 7710821: the second policy's rollback, deferred by the global cooldown (2m), ran once the cooldown ended
    # while P99 was still high: 3 -> 2, then 2 -> 1 (a revision no one chose).
    tape, clock, world = Tape(), ManualClock(T0), World()
    deployed = FakeRollback(revisions={"chat": 3})
    actuators = Actuators(rollback=tape.wrap(deployed), annotator=tape.wrap(FakeAnnotator()),
                          notifier=tape.wrap(FakeNotifier()))  # fmt: skip
    policies = {"p99-rollback": example("p99-rollback"), ATTRIBUTED: example(ATTRIBUTED)}
    pod = IncidentReplica(tmp_path, policies, actuators, clock, world, change_tracker=FakeChangeTracker([R3]))
    rolled_back_at: list[float] = []

    def script(elapsed: float) -> None:
        if deployed.active_revision["chat"] < 3 and not rolled_back_at:
            rolled_back_at.append(elapsed)
        # vLLM's rolling update with model loading: P99 stays high for 4 minutes after the rollback.
        slow = not rolled_back_at or elapsed < rolled_back_at[0] + 240
        world.set(P99, CHAT, 2.0 if slow else 0.3)
        world.set("queue-per-replica", CHAT, 3.0)

    try:
        run_for(pod.replica, 10 * 60, script)
    finally:
        pod.stop()
    rollbacks = [call for call in tape.calls if call[0] == "rollback"]
    assert rollbacks == [("rollback", "chat")]
    assert deployed.active_revision == {"chat": 2}
    assert [c for c in tape.calls if c[0] == "notify"] == []  # recovered within verifyAfter (5m): no escalation
    actions = [(policy, kind, status) for policy, kind, status in pod.replica.actions() if kind == "rollback"]
    assert actions == [(ATTRIBUTED, "rollback", "succeeded"), ("p99-rollback", "rollback", "skipped")]
    (incident,) = pod.incidents()
    assert incident.policies == (ATTRIBUTED, "p99-rollback")  # opened by the first, joined by the second
    assert incident.phase is IncidentPhase.RESOLVED
    assert incident.cause == {"rollout": "3", "policy": ATTRIBUTED, "undone": True}
    assert [a.describe() for a in incident.actions] == ["rollback 3 -> 2 succeeded"]
    (refused,) = incident.notes
    assert refused.startswith("rollback 2 -> 1 refused: incident chat-1700000030 already rolled back 3 -> 2 (policy "
                              f"{ATTRIBUTED!r})")  # fmt: skip
    ledger = pod.store.ledger("chat")
    assert ledger.known_bad == ("3",) and ledger.last_good == "2"


# ----- two bad rollouts in a row -------------------------------------------------------------------------------


def test_two_bad_rollouts_in_a_row_one_rollback_then_escalation_never_a_second_rollback(tmp_path: Path) -> None:
    # 7710821: the rollback landed on r2 (bad too), P99 stayed at 2 s, and tailguard neither acted nor told anyone.
    tape, clock, world = Tape(), ManualClock(T0), World()
    deployed = FakeRollback(revisions={"chat": 3})
    notifier = FakeNotifier()
    actuators = Actuators(rollback=tape.wrap(deployed), annotator=tape.wrap(FakeAnnotator()),
                          notifier=tape.wrap(notifier))  # fmt: skip
    pod = IncidentReplica(tmp_path, {"p99-rollback": example("p99-rollback")}, actuators, clock, world)
    world.set(P99, CHAT, 2.0)  # r3 bad, and r2, the revision before it, bad as well
    try:
        run_for(pod.replica, 20 * 60)
    finally:
        pod.stop()
    escalation = (
        "incident chat-1700000030 on chat: rollback 3 -> 2 succeeded did not end the breach within 300s; "
        "escalation step 1 (notify-oncall, severity critical); next: a human"
    )
    assert tape.calls == [
        ("annotate", "P99 e2e latency 2s > 0.8s on chat: rolling back"),
        ("rollback", "chat"),
        ("notify", "oncall"),
        ("annotate", escalation),
    ]
    assert deployed.active_revision == {"chat": 2}
    ((receiver, payload),) = notifier.sent
    assert receiver == "oncall" and payload["message"] == escalation
    assert payload["decision"]["escalation"] == {"step": "notify-oncall", "severity": "critical"}
    assert payload["decision"]["incident"] == "chat-1700000030"
    (incident,) = pod.incidents()
    assert (incident.phase, incident.stage) == (IncidentPhase.ESCALATED, 1)
    assert incident.next_step == "a human: the ladder is exhausted"
    assert pod.store.ledger("chat").known_bad == ("3",)
    # Visible (item 8): `tailguard status --journal`, its table and the status page show it, stage and next step.
    document = journal_status(tmp_path / "pod.db")
    shown = {k: v for k, v in document["incidents"][0].items() if k in ("id", "phase", "cause", "action", "stage",
                                                                         "next")}  # fmt: skip
    assert shown == {
        "id": "chat-1700000030",
        "phase": "escalated",
        "cause": "rollout 3 (undone)",
        "action": "escalation escalated (notify-oncall)",
        "stage": 1,
        "next": "a human: the ladder is exhausted",
    }
    table = format_status(document).split("OPEN INCIDENTS\n", 1)[1].splitlines()
    assert table[0].split() == ["INCIDENT", "SERVICE", "PHASE", "CAUSE", "ACTION", "STAGE", "NEXT"]
    assert table[1].split()[:3] == ["chat-1700000030", "chat", "escalated"] and "ladder is exhausted" in table[1]
    page = render_status_page(document)
    assert '<tr data-incident="chat-1700000030">' in page and "a human: the ladder is exhausted" in page


# ----- a load incident within 30 minutes of a rollback ------------------------------------------------------------


def test_a_load_incident_after_a_rollback_scales_instead_of_blaming_the_undone_rollout(tmp_path: Path) -> None:
    # 7710821: for 30 minutes after the rollback, a load incident was attributed to rollout r3 (already undone): a
    # "rollback" journaled succeeded, and no scale-out.
    tape, clock, world = Tape(), ManualClock(T0), World()
    deployed = FakeRollback(revisions={"chat": 3})
    scaler = FakeScaler(replicas={"chat": 2})
    actuators = Actuators(rollback=tape.wrap(deployed), scale=tape.wrap(scaler), annotator=tape.wrap(FakeAnnotator()),
                          notifier=tape.wrap(FakeNotifier()))  # fmt: skip
    pod = IncidentReplica(
        tmp_path, {ATTRIBUTED: example(ATTRIBUTED)}, actuators, clock, world, change_tracker=FakeChangeTracker([R3])
    )

    def script(elapsed: float) -> None:
        load = 600 <= elapsed < 900  # ten minutes later, a traffic surge saturates the (good) revision 2
        bad = deployed.active_revision["chat"] == 3
        world.set(P99, CHAT, 2.0 if bad or load else 0.3)
        world.set("queue-per-replica", CHAT, 45.0 if load else 3.0)

    try:
        run_for(pod.replica, 16 * 60, script)
    finally:
        pod.stop()
    assert [call for call in tape.calls if call[0] != "annotate"] == [("rollback", "chat"), ("set_replicas", "chat", 4)]
    load_note = [call[1] for call in tape.calls if call[0] == "annotate"][-1]
    assert "not attributed (no rollout of service=chat within 30m before onset)" in load_note
    assert load_note.endswith("-> scale-out; scaling out")
    assert deployed.active_revision == {"chat": 2} and scaler.replica_counts == {"chat": 4}
    first, second = pod.incidents()
    assert first.phase is IncidentPhase.RESOLVED and first.cause is not None and first.cause["undone"] is True
    assert second.cause is None and [a.type for a in second.actions] == ["scale"]


# ----- a human edits the HPA mid-incident -------------------------------------------------------------------------


def test_a_human_raising_max_replicas_mid_incident_gets_a_truthful_annotation_and_status(
    tmp_path: Path, kube: FakeKubernetes
) -> None:
    # 7710821: the restore was skipped (right), and the annotation read "back to the pre-incident floor".
    kube.put_object(hpa("chat", min_replicas=2, max_replicas=10))
    tape, clock, world = Tape(), ManualClock(T0), World()
    scaler = HpaScaler(
        k8s.AutoscalingV2Api(kube.api_client()), clock=clock, bounds=HpaBounds(max_replicas=8), namespace="llm"
    )
    actuators = Actuators(scale=tape.wrap(scaler), annotator=tape.wrap(FakeAnnotator()))
    pod = IncidentReplica(tmp_path, {"queue-scale": example("queue-scale")}, actuators, clock, world)

    def script(elapsed: float) -> None:
        if elapsed == 120:  # the on-call engineer raises only the ceiling, by hand
            body = kube.get_object("horizontalpodautoscalers", "llm", "chat")
            assert body is not None
            body["spec"]["maxReplicas"] = 20
            kube.put_object(body)
        world.set(QUEUE, CHAT, 45.0 if elapsed < 180 else 3.0)

    try:
        run_for(pod.replica, 16 * 60, script)
    finally:
        pod.stop()
    updates = [call.body["spec"] for call in kube.calls("update", "horizontalpodautoscalers")]
    assert [(spec["minReplicas"], spec["maxReplicas"]) for spec in updates] == [(5, 10)]  # the surge; no restore
    final = (kube.get_object("horizontalpodautoscalers", "llm", "chat") or {})["spec"]
    assert (final["minReplicas"], final["maxReplicas"]) == (5, 20)
    texts = [call[1] for call in tape.calls if call[0] == "annotate"]
    assert texts[0] == "45 requests waiting per replica on chat (target 20): scaling out"
    recovery = texts[-1]
    assert "pre-incident floor" not in recovery
    assert recovery.startswith("3 requests waiting per replica on chat for 10m: restore of chat skipped, nothing put "
                               "back: scale: changed by someone else")  # fmt: skip
    assert "maxReplicas': 20" in recovery or "maxReplicas 20" in recovery
    (incident,) = pod.incidents()
    assert incident.phase is IncidentPhase.RESOLVED
    (found,) = incident.notes
    assert found == (
        "restore of chat skipped: changed by someone else since tailguard set {'minReplicas': 5, 'maxReplicas': 10, "
        "'metrics': {'vllm:num_requests_waiting': '5'}}: found {'minReplicas': 5, 'maxReplicas': 20, 'metrics': "
        "{'vllm:num_requests_waiting': '5'}}; not overwritten"
    )


# ----- failover after a rollback, P99 still high past the policy cooldown -------------------------------------------


def test_failover_after_a_rollback_with_p99_high_past_the_cooldown_never_redeploys_the_bad_revision(
    tmp_path: Path, kube: FakeKubernetes
) -> None:
    # 7710821: which revisions were bad lived in pod-a's emptyDir; pod-b, leading after pod-a left with P99 still
    # high past the policy cooldown (10m), "rolled back" good1 to bad2.
    shared, world, tape = ManualClock(T0), World(), Tape()
    with FakeArgoCD() as argocd:
        argocd.state.token = ARGOCD_TOKEN
        argocd.add_app(application("chat", [("good1", T0 - 7200), ("bad2", T0 - 120)]))
        recovered_at = T0 + 20 * 60  # the model loads slowly: P99 stays high for 20 minutes after the rollback

        def latency() -> None:
            fixed = argocd.app("chat")["status"]["sync"]["revision"] == "good1" and shared.now() >= recovered_at
            world.set(P99, CHAT, 0.3 if fixed else 2.0)

        def pod(name: str) -> tuple[Pod, IncidentKeeper]:
            clock = PodClock(shared)
            elector = LeaderElector(k8s.CoordinationV1Api(kube.api_client()), "tailguard", "tailguard", name, 15, clock)
            elector.run_once()
            store = KubernetesIncidentStore(k8s.CustomObjectsApi(kube.api_client()), "tailguard")
            keeper = IncidentKeeper(store, clock)
            rollback = argocd_rollback(argocd, clock, tmp_path / f"{name}-argocd-rollbacks.json")
            actuators = Actuators(rollback=tape.wrap(rollback), annotator=tape.wrap(FakeAnnotator()),
                                  notifier=tape.wrap(FakeNotifier()))  # fmt: skip
            layer = incident_layer(keeper, actuators, None)
            replica = Replica(
                tmp_path, name, {"p99-rollback": example("p99-rollback")}, layer.actuators, clock, world=world,
                leader=elector, wrap_dispatcher=lambda dispatcher, journal: layer.dispatcher(dispatcher),
            )  # fmt: skip
            keeper.bind(replica.controller.policies)
            return Pod(replica, elector, clock), keeper

        (a, _), (b, keeper_b) = pod("pod-a"), pod("pod-b")
        assert a.elector.is_leader() and not b.elector.is_leader()
        try:
            for _ in range(4 * 4):  # four minutes: pod-a fires (T0+30), rolls back bad2 -> good1
                latency()
                tick([a, b], shared)
            argocd_finishes(argocd)
            for _ in range(7 * 4):  # seven more minutes: P99 still high (the model loads)
                latency()
                tick([a, b], shared)
            a.elector.release()  # pod-a is drained (a rolling update of tailguard itself)
            a.replica.stop()
            for _ in range(15 * 4):  # pod-b leads, P99 high past the policy cooldown (10m), then it recovers
                latency()
                tick([b], shared)
            assert b.elector.run_once(), "pod-b leads"
        finally:
            a.replica.stop()
            b.replica.stop()
        writes = argocd_writes(argocd)
        final = argocd.app("chat")["status"]["sync"]["revision"]
    assert writes == [ROLLBACK_TO_GOOD1]  # one rollback, by pod-a; bad2 never deployed again
    assert final == "good1"
    assert [call for call in tape.calls if call[0] == "rollback"] == [("rollback", "chat")]
    # pod-b read the incident pod-a opened: the rollback made, bad2 known bad, the escalation due after 5m.
    (incident,) = keeper_b.incidents(open_only=False)
    assert incident.phase is IncidentPhase.RESOLVED and incident.stage == 1
    assert keeper_b.ledger("chat").known_bad == ("bad2",) and keeper_b.ledger("chat").last_good == "good1"
    assert [call[:2] for call in tape.calls if call[0] == "notify"] == [("notify", "oncall")]
    (stored,) = kube.objects("tailguardincidents", "tailguard")
    assert stored["status"]["phase"] == "resolved" and stored["spec"]["service"] == "chat"
    assert [c.resource for c in kube.calls("update") if c.resource.startswith("tailguardincidents")] != []


# ----- a later breach on the last known good revision --------------------------------------------------------------


def test_a_later_breach_on_the_last_known_good_revision_asks_a_human_instead_of_rolling_back_past_it(
    tmp_path: Path,
) -> None:
    # 7710821: the second breach rolled revision 2 (seen healthy for the recovery window) back to 1, a revision no
    # one chose.
    tape, clock, world = Tape(), ManualClock(T0), World()
    deployed = FakeRollback(revisions={"chat": 3})
    notifier = FakeNotifier()
    actuators = Actuators(rollback=tape.wrap(deployed), annotator=tape.wrap(FakeAnnotator()),
                          notifier=tape.wrap(notifier))  # fmt: skip
    pod = IncidentReplica(tmp_path, {"p99-rollback": example("p99-rollback")}, actuators, clock, world)

    def script(elapsed: float) -> None:
        bad = deployed.active_revision["chat"] == 3 or elapsed >= 900  # 15 minutes later: a breach on revision 2
        world.set(P99, CHAT, 2.0 if bad else 0.3)

    try:
        run_for(pod.replica, 18 * 60, script)
    finally:
        pod.stop()
    assert [call for call in tape.calls if call[0] in ("rollback", "notify")] == [
        ("rollback", "chat"),
        ("notify", "oncall"),
    ]
    assert deployed.active_revision == {"chat": 2}
    first, second = pod.incidents()
    assert first.phase is IncidentPhase.RESOLVED and pod.store.ledger("chat").last_good == "2"
    assert (second.phase, second.stage) == (IncidentPhase.ESCALATED, 1)
    ((_, payload),) = notifier.sent
    assert payload["message"] == (
        f"incident {second.id} on chat: rollback 2 -> 1 refused (chat runs 2, the last revision known good: "
        "rolling back past it needs a human), the breach holds; escalation step 1 (notify-oncall, severity "
        "critical); next: a human"
    )


# ----- a traffic shift is an action of the incident ------------------------------------------------------------------


def test_a_canary_shift_is_counted_and_verified_in_its_incident_and_the_route_ends_as_before(tmp_path: Path) -> None:
    tape, clock, world = Tape(), ManualClock(T0), World()
    router = FakeRouter(routes={"chat": {"r1": 90, "r2": 10}})
    actuators = Actuators(router=tape.wrap(router), annotator=tape.wrap(FakeAnnotator()))
    pod = IncidentReplica(tmp_path, {"error-rate-shift": example("error-rate-shift")}, actuators, clock, world)

    def script(elapsed: float) -> None:
        world.set("error-ratio", CHAT_R1, 0.01)
        world.set("error-ratio", CHAT_R2, 0.40 if elapsed < 180 else 0.01)

    try:
        run_for(pod.replica, 6 * 60, script)
    finally:
        pod.stop()
    assert [call for call in tape.calls if call[0] != "annotate"] == [
        ("set_weight", "chat", "r2", 10),
        ("set_weights", "chat", {"r1": 90, "r2": 10}),
    ]
    assert router.routes == {"chat": {"r1": 90, "r2": 10}}
    (incident,) = pod.incidents()
    assert incident.scope == {"service": "chat"}  # the version-level target's incident is the service's
    assert [a.describe() for a in incident.actions] == ["shift_traffic succeeded"]
    assert incident.phase is IncidentPhase.RESOLVED and incident.stage == 0 and incident.notes == ()
