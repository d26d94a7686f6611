"""Issue 23, items 1, 2 and 6: the incident model's rules, its two stores (compare-and-set), the TailguardIncident
RBAC, and the escalation fields of a policy.

The scenarios (tests/scenarios/test_incidents.py) drive all of it through the controller; these pin each rule
where it lives, with an input that breaks it."""

from __future__ import annotations

import os
import shutil
from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path

import pytest
import yaml
from kubernetes import client as k8s
from kubernetes_validate.utils import latest_version

from tailguard.controller.adapters.stores.incident_resources import KubernetesIncidentStore
from tailguard.controller.adapters.stores.incidents import SqliteIncidentStore
from tailguard.controller.adapters.stores.journal import Journal
from tailguard.controller.app import build
from tailguard.controller.app.cluster import build_cluster_actuators
from tailguard.controller.app.settings import load_settings
from tailguard.controller.core import incidents as model
from tailguard.controller.core.controls import AbortRequest, AbortState
from tailguard.controller.core.engine import ConditionState, Phase, PolicyState
from tailguard.controller.core.incidents import Firing, Incident, IncidentConflict, IncidentPhase, Ledger, TakenAction
from tailguard.controller.core.model import target_key
from tailguard.controller.core.policy_files import parse_policy_text
from tailguard.controller.core.ports import IncidentStorePort
from tailguard.controller.kit.clock import ManualClock
from tailguard.controller.loop.dispatcher import Actuators, Dispatcher, GlobalLimits
from tailguard.controller.loop.incident_ports import incident_layer
from tailguard.controller.loop.incidents import IncidentKeeper
from tailguard.controller.loop.ports import DecisionAborterPort
from tailguard.controller.testing import FakeRollback, condition_state, make_decision
from tailguard.controller.tools.cluster_permissions import INCIDENT_PERMISSIONS
from tailguard.serving.tier.manifests import render_kustomization, validate_objects
from tests.support.fake_kubernetes import FakeKubernetes

REPO = Path(__file__).resolve().parents[2]
T0 = 1_700_000_000.0
SCOPE = {"namespace": "llm", "service": "chat"}


def firing(policy: str, at: float = T0, cause: str | None = None) -> Firing:
    return Firing(policy, "p99-above-800ms", f"{policy}-decision", at, 2.0, 0.8, ((at, 2.0),), cause)


def rolled_back(incident: Incident, ledger: Ledger, source: str, target: str) -> tuple[Incident, Ledger]:
    action = TakenAction("k1", "rollback", "p99-rollback", T0 + 30, "succeeded", {"from_revision": source,
                                                                                   "to_revision": target})  # fmt: skip
    return model.action_ended(model.rollback_started(incident, action), ledger, action, 300.0)


# ----- the model ---------------------------------------------------------------------------------------------------


def test_one_incident_per_scope_opened_by_the_first_policy_and_joined_by_the_others() -> None:
    first = model.open_or_join(None, SCOPE, firing("attributed", cause="r3"))
    joined = model.open_or_join(first, SCOPE, firing("p99-rollback", T0 + 15))
    assert joined.id == first.id == "llm-chat-1700000000" and joined.policies == ("attributed", "p99-rollback")
    assert joined.cause == {"rollout": "r3", "policy": "attributed", "undone": False}
    assert model.open_or_join(joined, SCOPE, firing("p99-rollback", T0 + 15)) == joined  # the same decision again
    assert model.scope_of(target_key({"service": "chat", "version": "r2", "namespace": "llm"})) == SCOPE


def test_a_second_rollback_in_one_incident_is_refused_whichever_policy_asks() -> None:
    incident = model.open_or_join(None, SCOPE, firing("attributed", cause="r3"))
    ledger = Ledger("chat")
    assert model.rollback_refusal(incident, ledger, {"from_revision": "r3", "to_revision": "r2"}) is None
    incident, ledger = rolled_back(incident, ledger, "r3", "r2")
    assert ledger.known_bad == ("r3",) and ledger.rolled_back == ("r3",)
    assert incident.cause is not None and incident.cause["undone"] is True
    assert incident.phase is IncidentPhase.VERIFYING
    refusal = model.rollback_refusal(incident, ledger, {"from_revision": "r2", "to_revision": "r1"})
    assert refusal is not None and "already rolled back r3 -> r2" in refusal


def test_a_rollback_never_targets_a_known_bad_revision_nor_goes_past_the_last_known_good() -> None:
    ledger = Ledger("chat", known_bad=("bad2",), last_good="good1")
    fresh = model.open_or_join(None, SCOPE, firing("p99-rollback"))
    onto_bad = model.rollback_refusal(fresh, ledger, {"from_revision": "good1", "to_revision": "bad2"})
    assert onto_bad is not None and "bad2 is known bad" in onto_bad
    past_good = model.rollback_refusal(fresh, ledger, {"from_revision": "good1", "to_revision": "good0"})
    assert past_good is not None and "last revision known good: rolling back past it needs a human" in past_good
    assert model.rollback_refusal(fresh, ledger, {"from_revision": "r5", "to_revision": "good1"}) is None


def test_the_incident_ends_when_every_joined_policy_recovered_and_the_running_revision_is_known_good() -> None:
    incident = model.open_or_join(None, SCOPE, firing("a"))
    incident = model.open_or_join(incident, SCOPE, firing("b"))
    incident, ledger = rolled_back(incident, Ledger("chat"), "r3", "r2")
    incident, ledger = model.recover(incident, "a", T0 + 300, ledger, "r2")
    assert incident.open and ledger.last_good is None  # b still breaches
    incident, ledger = model.recover(incident, "b", T0 + 330, ledger, "r2")
    assert (incident.phase, incident.ended_at, ledger.last_good) == (IncidentPhase.RESOLVED, T0 + 330, "r2")


def test_escalation_is_due_only_after_the_verification_window_with_the_breach_held() -> None:
    incident, _ = rolled_back(model.open_or_join(None, SCOPE, firing("p99-rollback")), Ledger("chat"), "r3", "r2")
    assert model.escalation_due(incident, True, T0 + 30 + 299, 300.0) is None
    assert model.escalation_due(incident, False, T0 + 30 + 300, 300.0) is None
    assert model.escalation_due(incident, True, T0 + 30 + 300, 300.0) is not None
    climbed = model.escalated(incident, "notify-oncall", T0 + 330, "x.escalation-1", "verify, then a human")
    assert (climbed.phase, climbed.stage) == (IncidentPhase.ESCALATED, 1)
    assert model.escalation_due(climbed, True, T0 + 330 + 299, 300.0) is None  # the step is verified in turn


def test_a_revision_is_the_same_whether_a_source_numbers_or_names_it() -> None:
    assert model.same_revision("3", "r3") and model.same_revision("bad2", "bad2")
    assert not model.same_revision("3", "r4") and not model.same_revision("good1", "1")


# ----- the stores: compare-and-set ---------------------------------------------------------------------------------


@pytest.fixture
def kube() -> Iterator[FakeKubernetes]:
    with FakeKubernetes() as server:
        yield server


def exercise(store: IncidentStorePort) -> None:
    """What every store does: create, read back, compare-and-set (a stale version is a conflict), the ledger."""
    opened = model.open_or_join(None, SCOPE, firing("p99-rollback"))
    saved = store.save(opened, Ledger("chat"))
    assert saved.version != ""
    with pytest.raises(IncidentConflict):
        store.save(opened, Ledger("chat"))  # created twice
    current = store.current(model.scope_key(SCOPE))
    assert current is not None and current[0] == saved
    assert store.latest("chat", open_only=True) == saved and store.latest("embed", open_only=False) is None
    acted, ledger = rolled_back(saved, current[1], "r3", "r2")
    written = store.save(acted, ledger)
    with pytest.raises(IncidentConflict):
        store.save(acted, ledger)  # the version read before the last write: stale
    assert store.ledger("chat").known_bad == ("r3",)
    assert store.ledger("embed") == Ledger("embed")
    ended, ledger = model.recover(written, "p99-rollback", T0 + 600, ledger, "r2")
    store.save(ended, ledger)
    assert store.current(model.scope_key(SCOPE)) is None and store.incidents(open_only=True) == []
    (kept,) = store.incidents(open_only=False)
    assert kept.phase is IncidentPhase.RESOLVED and store.ledger("chat").last_good == "r2"
    assert store.latest("chat", open_only=True) is None and store.latest("chat", open_only=False) == kept


def test_the_journal_store_compares_and_sets_and_survives_a_reopen(tmp_path: Path) -> None:
    store = SqliteIncidentStore(tmp_path / "journal.db")
    exercise(store)
    store.close()
    reopened = SqliteIncidentStore(tmp_path / "journal.db")
    assert reopened.ledger("chat").known_bad == ("r3",)
    reopened.close()


def test_the_cluster_store_compares_and_sets_with_resource_version_and_uses_exactly_its_permissions(
    kube: FakeKubernetes,
) -> None:
    store = KubernetesIncidentStore(k8s.CustomObjectsApi(kube.api_client()), "tailguard")
    exercise(store)
    (stored,) = kube.objects("tailguardincidents", "tailguard")
    assert stored["spec"] == {"service": "chat", "scope": SCOPE, "openedAt": T0}
    assert (stored["status"]["phase"], stored["status"]["cause"]) == ("resolved", "rollout r3 (undone)")
    assert stored["status"]["action"] == "rollback r3 -> r2 succeeded"
    assert stored["metadata"]["labels"] == {"tailguard.io/service": "chat"}
    # A concurrent writer (another replica) between the read and the write: 409, nothing written.
    (incident,) = store.incidents(open_only=False)
    kube.touch("tailguardincidents", "tailguard", incident.id)
    with pytest.raises(IncidentConflict):
        store.save(model.note(incident, "late"), store.ledger("chat"))
    assert kube.objects("tailguardincidents", "tailguard")[0]["status"]["incident"]["notes"] == []
    recorded = {(r.api_group, r.resource, r.verb) for r in kube.calls()}
    assert recorded == {(p.api_group, p.resource, v) for p in INCIDENT_PERMISSIONS for v in p.verbs}


def test_the_keeper_re_decides_after_a_conflict(kube: FakeKubernetes) -> None:
    """Two replicas join the same scope at once: the second write conflicts, is read again, and joins the
    incident the first opened (one incident, both policies)."""
    clock = ManualClock(T0)
    store_a = KubernetesIncidentStore(k8s.CustomObjectsApi(kube.api_client()), "tailguard")
    store_b = KubernetesIncidentStore(k8s.CustomObjectsApi(kube.api_client()), "tailguard")
    a, b = IncidentKeeper(store_a, clock), IncidentKeeper(store_b, clock)
    opened = a._update(SCOPE, "chat", lambda current, ledger: (model.open_or_join(current, SCOPE, firing("x")),
                                                                 ledger))  # fmt: skip
    assert opened is not None
    calls: list[int] = []

    def join(current: Incident | None, ledger: Ledger) -> tuple[Incident, Ledger]:
        calls.append(1)
        if len(calls) == 1:
            kube.touch("tailguardincidents", "tailguard", opened.id)  # replica a writes between b's read and write
        return model.open_or_join(current, SCOPE, firing("y")), ledger

    joined = b._update(SCOPE, "chat", join)
    assert len(calls) == 2 and joined is not None and joined.policies == ("x", "y")
    assert [i.id for i in store_a.incidents()] == [opened.id]


# ----- deploy: the CRD and the RBAC component -----------------------------------------------------------------------


def test_incidents_component_grants_exactly_the_incident_permissions(tmp_path: Path) -> None:
    base = REPO / "deploy" / "base"
    component = REPO / "deploy" / "components" / "incidents"
    shutil.copy(base / "namespace-transformer.yaml", tmp_path / "namespace.yaml")
    (tmp_path / "kustomization.yaml").write_text(
        f"resources: [{os.path.relpath(base, tmp_path)}]\ncomponents: [{os.path.relpath(component, tmp_path)}]\n"
        "transformers: [namespace.yaml]\n"
    )
    objects = render_kustomization(tmp_path)
    assert validate_objects(objects, REPO / "tests" / "support" / "specs", latest_version()) == []
    (role,) = [o for o in objects if o["kind"] == "Role" and o["metadata"]["name"] == "tailguard-incidents"]
    assert role["metadata"]["namespace"] == "tailguard"
    triples = {(g, r, v) for rule in role["rules"] for g in rule["apiGroups"] for r in rule["resources"]
               for v in rule["verbs"]}  # fmt: skip
    assert triples == {(p.api_group, p.resource, v) for p in INCIDENT_PERMISSIONS for v in p.verbs}
    (binding,) = [o for o in objects if o["kind"] == "RoleBinding" and o["metadata"]["name"] == "tailguard-incidents"]
    assert binding["subjects"] == [{"kind": "ServiceAccount", "name": "tailguard", "namespace": "tailguard"}]


def test_the_crd_has_the_status_subresource_the_printer_columns_and_the_short_name() -> None:
    crd = yaml.safe_load((REPO / "deploy" / "crds" / "tailguardincident.yaml").read_text(encoding="utf-8"))
    assert crd["spec"]["names"]["shortNames"] == ["tgi"]
    (version,) = crd["spec"]["versions"]
    assert version["subresources"] == {"status": {}}
    columns = [column["name"] for column in version["additionalPrinterColumns"]]
    assert columns == ["Service", "Phase", "Cause", "Action", "Next", "Age"]


# ----- the policy's escalation fields -------------------------------------------------------------------------------

POLICY = """
apiVersion: tailguard.io/v1alpha1
kind: Policy
name: p99
targets: {groupBy: [service]}
signals: [{name: p99, query: 'up'}]
conditions:
  - name: slow
    signal: p99
    when: {op: ">", value: 0.8}
    for: 3
    noData: hold
    actions: [{type: rollback, service: "{{ service }}"}]
escalation:
  verifyAfter: 3m
  steps:
"""


def test_an_escalation_ladder_is_read_and_a_rollback_step_is_refused_with_its_place() -> None:
    ladder = POLICY + "    - {name: page, severity: warning, actions: [{type: notify, receiver: oncall}]}\n"
    (loaded,), errors = parse_policy_text(ladder, "p99.yaml")
    assert errors == []
    assert loaded.policy.escalation.verifyAfter == 180.0
    assert [(s.name, s.severity.value) for s in loaded.policy.escalation.steps] == [("page", "warning")]
    again = POLICY + "    - {name: again, actions: [{type: rollback, service: chat}]}\n"
    _, (error,) = parse_policy_text(again, "p99.yaml")
    assert (error.line, error.field) == (17, "escalation.steps[0].actions[0].type")
    assert "never by a second rollback" in error.message


# ----- the composition root picks the store -------------------------------------------------------------------------


def test_the_composition_root_holds_incidents_in_the_cluster_with_kubernetes_incidents_else_in_the_journal(
    kube: FakeKubernetes, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("KUBERNETES_SERVICE_HOST", raising=False)
    (tmp_path / "kube.yaml").write_text(
        yaml.safe_dump(
            {
                "apiVersion": "v1",
                "kind": "Config",
                "clusters": [{"name": "fake", "cluster": {"server": kube.url}}],
                "users": [{"name": "u", "user": {"token": "t"}}],
                "contexts": [{"name": "c", "context": {"cluster": "fake", "user": "u"}}],
                "current-context": "c",
            }
        )
    )
    base = "prometheus: {url: 'http://127.0.0.1:9'}\npolicies: [rules]\njournal: journal.db\n"
    cluster = "kubernetes: {inCluster: false, kubeconfig: kube.yaml, incidents: {namespace: tailguard}}\n"
    (tmp_path / "local.yaml").write_text(base)
    (tmp_path / "cluster.yaml").write_text(base + cluster)
    local = build._incident_store(load_settings(tmp_path / "local.yaml"), None)
    assert isinstance(local, SqliteIncidentStore) and local.path == tmp_path / "journal.db"
    local.close()
    settings = load_settings(tmp_path / "cluster.yaml")
    assert settings.kubernetes is not None
    built = build_cluster_actuators(settings.kubernetes, ManualClock(), base_dir=tmp_path, state_dir=tmp_path)
    store = build._incident_store(settings, built)
    assert isinstance(store, KubernetesIncidentStore)
    store.save(model.open_or_join(None, SCOPE, firing("p99-rollback")), Ledger("chat"))
    assert [o["metadata"]["name"] for o in kube.objects("tailguardincidents", "tailguard")] == ["llm-chat-1700000000"]
    built.api_client.close()  # type: ignore[no-untyped-call]


def test_an_escalation_of_a_policy_no_longer_loaded_still_says_what_happened(tmp_path: Path) -> None:
    """The ladder's default step when the policy is gone (unbound keeper): the notification carries the sentence,
    not an unfilled template, and a second reconcile in the same stage adds nothing."""
    clock = ManualClock(T0 + 30 + 300)
    store = SqliteIncidentStore(tmp_path / "journal.db")
    incident, ledger = rolled_back(model.open_or_join(None, SCOPE, firing("p99-rollback")), Ledger("chat"), "r3", "r2")
    store.save(incident, ledger)
    keeper = IncidentKeeper(store, clock)
    state = PolicyState(conditions={("p99-above-800ms", target_key(SCOPE)): ConditionState(phase=Phase.FIRING)})
    (decision,) = keeper.reconcile("p99-rollback", state)
    notify, annotate = (action.to_json() for action in decision.actions)
    sentence = (
        "incident llm-chat-1700000000 on chat: rollback r3 -> r2 succeeded did not end the breach within 300s; "
        "escalation step 1 (notify-oncall, severity critical); next: a human"
    )
    assert (notify["type"], notify["params"]["receiver"], notify["params"]["message"]) == ("notify", "oncall", sentence)
    assert annotate["params"]["text"] == sentence
    assert keeper.reconcile("p99-rollback", state) == []  # stage 1 is verified in turn: nothing due yet
    assert keeper.reconcile("p99-rollback", PolicyState()) == []
    store.close()


def test_the_incident_dispatcher_passes_an_abort_through(tmp_path: Path) -> None:
    """`tailguard abort` reaches the dispatcher through the incident layer (the runtime asks isinstance of the
    DecisionAborterPort protocol, which a `__getattr__` pass-through would not satisfy on every Python)."""
    clock = ManualClock(T0)
    journal = Journal(tmp_path / "journal.db")
    keeper = IncidentKeeper(SqliteIncidentStore(tmp_path / "journal.db"), clock)
    dispatcher = Dispatcher(journal, Actuators(), clock, GlobalLimits())
    wrapped = incident_layer(keeper, Actuators(), None).dispatcher(dispatcher)
    assert isinstance(wrapped, DecisionAborterPort)
    answer = wrapped.abort(AbortRequest("nope", "me", "test", T0))
    assert answer.state is AbortState.UNKNOWN and "nope" in answer.message
    journal.close()


def test_retention_deletes_ended_incidents_but_keeps_each_services_latest_and_its_ledger(tmp_path: Path) -> None:
    store = SqliteIncidentStore(tmp_path / "journal.db")
    for index, service in enumerate(["chat", "chat", "chat", "embed"]):
        scope = {"service": service}
        at = T0 + 1000 * index
        opened = store.save(model.open_or_join(None, scope, firing(f"p{index}", at)), store.ledger(service))
        ledger = replace(store.ledger(service), known_bad=(f"bad{index}",))
        ended, ledger = model.recover(opened, f"p{index}", at + 100, ledger, None)
        store.save(ended, ledger)
    store.save(model.open_or_join(None, {"service": "code"}, firing("q", T0)), Ledger("code"))  # open: kept
    assert store.purge(T0 + 2050) == 2  # chat's first two (ended at +100 and +1100); chat's third is its latest
    kept = sorted((i.service, i.opened_at) for i in store.incidents(open_only=False))
    assert kept == [("chat", T0 + 2000), ("code", T0), ("embed", T0 + 3000)]
    assert store.ledger("chat").known_bad == ("bad2",) and store.purge(T0 + 10_000) == 0
    store.close()


def test_a_rollback_that_cannot_read_its_incident_fails_transiently_and_runs_once_it_can(
    kube: FakeKubernetes, tmp_path: Path
) -> None:
    """The API server answers 503 to the incident read of the rollback's plan (made at decision time): nothing is
    written, the action waits (deferred) for a plan, and the next evaluation that finds the condition still firing
    plans it again with the same key: it reads the incident, counts the rollback and makes it."""
    clock = ManualClock(T0)
    store = KubernetesIncidentStore(k8s.CustomObjectsApi(kube.api_client()), "tailguard")
    keeper = IncidentKeeper(store, clock)
    deployed = FakeRollback(revisions={"chat": 3})
    layer = incident_layer(keeper, Actuators(rollback=deployed), None)
    journal = Journal(tmp_path / "journal.db")
    dispatcher = Dispatcher(journal, layer.actuators, clock, GlobalLimits(), backoff=0.0)
    decision = make_decision([("rollback", {"service": "chat"})])
    keeper.on_decision(decision)  # the incident opens (what the wrapped dispatcher does first)
    kube.inject("list", "tailguardincidents", status=503, times=1)
    (waiting,) = dispatcher.dispatch(decision)
    assert waiting.status.value == "deferred" and deployed.performed("rollback") == []
    (record,) = dispatcher.retry_deferred(decision.policy, condition_state(decision))
    assert record.status.value == "succeeded"
    answered = [c.status for c in kube.calls("list", "tailguardincidents")]
    assert answered.count(503) == 1 and answered[-1] == 200
    assert deployed.active_revision == {"chat": 2}
    assert len(deployed.performed("rollback")) == 1
    (incident,) = store.incidents()
    assert [a.describe() for a in incident.actions] == ["rollback 3 -> 2 succeeded"]
    journal.close()
