"""controller/app/cluster.py, cluster_settings.py and controller/core/unconfigured.py: the `kubernetes` settings,
the builder of the cluster actuators (exercised through the real client against the spec-validating fake API
server), the leader elector builder, one port per action type (a missing one answers "not configured"), and
`tailguard run`'s one-line errors when the cluster cannot be reached."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tailguard.controller.adapters.kube.action_keys import ANNOTATION_KEYS
from tailguard.controller.adapters.lease.settings import LeaderElectionSettings
from tailguard.controller.adapters.scale.hpa import HpaScaler
from tailguard.controller.adapters.stores.journal import ActionStatus, Journal
from tailguard.controller.adapters.traffic.routes import HttpRouteRouter, VirtualServiceRouter
from tailguard.controller.app import cli
from tailguard.controller.app.cluster import (
    ClusterConfigError,
    build_cluster_actuators,
    build_leader_elector,
    cluster_client,
)
from tailguard.controller.app.cluster_settings import KubernetesSettings
from tailguard.controller.app.settings import SettingsError, load_settings
from tailguard.controller.core.ports import OutcomeStatus, RollbackRequest, ScaleRequest, TrafficRequest
from tailguard.controller.core.unconfigured import (
    ROLLBACK_MISSING,
    SCALE_MISSING,
    NoActuatorError,
    UnconfiguredRollback,
    UnconfiguredScale,
)
from tailguard.controller.kit.clock import ManualClock
from tailguard.controller.loop.dispatcher import Actuators, Dispatcher, GlobalLimits
from tailguard.controller.testing import FakeDeployer, make_decision
from tests.support.fake_kubernetes import FakeKubernetes, hpa, http_route, virtual_service


@pytest.fixture
def fake() -> Iterator[FakeKubernetes]:
    with FakeKubernetes() as server:
        yield server


@pytest.fixture(autouse=True)
def not_in_a_cluster(monkeypatch: pytest.MonkeyPatch) -> None:
    # The in-cluster loader looks at these; a CI runner inside a pod must not change what these tests see.
    monkeypatch.delenv("KUBERNETES_SERVICE_HOST", raising=False)
    monkeypatch.delenv("KUBERNETES_SERVICE_PORT", raising=False)


def write_kubeconfig(path: Path, server: str) -> Path:
    """A kubeconfig naming the fake API server (plain http on loopback; a token user, never logged)."""
    config = {
        "apiVersion": "v1",
        "kind": "Config",
        "clusters": [{"name": "fake", "cluster": {"server": server}}],
        "users": [{"name": "tailguard", "user": {"token": "unit-test-token"}}],
        "contexts": [{"name": "fake", "context": {"cluster": "fake", "user": "tailguard"}}],
        "current-context": "fake",
    }
    path.write_text(json.dumps(config), encoding="utf-8")
    return path


def settings(**fields: Any) -> KubernetesSettings:
    return KubernetesSettings.model_validate(fields)


# ----- settings ------------------------------------------------------------------------------------------


def test_defaults_and_full_section() -> None:
    default = settings()
    assert (default.inCluster, default.kubeconfig, default.namespace, default.events) == (True, None, "llm", True)
    assert default.hpa is None and default.traffic is None
    full = settings(
        inCluster=False,
        kubeconfig="kube.yaml",
        hpa={"maxReplicas": 8, "targets": {"chat": {"name": "chat-stable"}}},
        traffic={"kind": "virtualservice", "routes": {"chat": {"namespace": "mesh", "name": "chat-vs"}}, "ramp": {}},
    )
    assert full.hpa is not None and full.hpa.minReplicas == 1 and full.hpa.allowBelowHumanFloor is False
    assert full.traffic is not None and full.traffic.ramp is not None
    assert (full.traffic.ramp.steps, full.traffic.ramp.hold) == ([50], 60.0)


def config_with(tmp_path: Path, section: str) -> Path:
    path = tmp_path / "controller.yaml"
    path.write_text(f"prometheus:\n  url: http://127.0.0.1:9090\npolicies: [rules]\n{section}", encoding="utf-8")
    return path


@pytest.mark.parametrize(
    ("section", "expected"),
    [
        (
            "kubernetes:\n  hpa:\n    maxReplicas: 2\n    minReplicas: 3\n",
            ":6: kubernetes.hpa: expected minReplicas <= maxReplicas, got 3 > 2",
        ),
        (
            "kubernetes:\n  traffic:\n    kind: ingress\n",
            ":6: kubernetes.traffic.kind: expected 'httproute' or 'virtualservice'",
        ),
        ("kubernetes:\n  traffic:\n    ramp: {steps: [50, 100]}\n", "expected 1..99, got [100]"),
        ("kubernetes:\n  kubeconfig: /k\n", "kubeconfig is only read when inCluster is false"),
        ("kubernetes:\n  hpa: {maxReplicas: 4, targets: {chat: {nam: x}}}\n", "kubernetes.hpa.targets.chat"),
        ("kubernetes:\n  namespaces: llm\n", ":5: kubernetes.namespaces: unknown field"),
    ],
)
def test_bad_settings_are_located(tmp_path: Path, section: str, expected: str) -> None:
    with pytest.raises(SettingsError) as raised:
        load_settings(config_with(tmp_path, section))
    text = "\n".join(str(error) for error in raised.value.errors)
    assert expected in text
    assert str(tmp_path / "controller.yaml") in text


def test_ramp_hold_takes_a_duration(tmp_path: Path) -> None:
    loaded = load_settings(config_with(tmp_path, "kubernetes:\n  traffic:\n    ramp: {steps: [25, 50], hold: 2m}\n"))
    assert loaded.kubernetes is not None and loaded.kubernetes.traffic is not None
    assert loaded.kubernetes.traffic.ramp is not None and loaded.kubernetes.traffic.ramp.hold == 120.0


# ----- the builder, through the real client against the fake API server --------------------------------------


def test_builder_scales_the_configured_hpa_and_records_an_event(fake: FakeKubernetes) -> None:
    fake.put_object(hpa("chat-stable", "llm", min_replicas=2, max_replicas=6))
    clock = ManualClock()
    built = build_cluster_actuators(
        settings(hpa={"maxReplicas": 8, "targets": {"chat": {"name": "chat-stable"}}}),
        clock,
        api_client=fake.api_client(),
    )
    assert isinstance(built.scaler, HpaScaler) and built.router is None and built.events is not None
    assert built.scaler.replicas("chat") == 2
    outcome = built.scaler.set_replicas(ScaleRequest("chat", 5, idempotency_key="d1:fire:0"))
    assert outcome.status is OutcomeStatus.SUCCEEDED, outcome
    stored = fake.get_object("horizontalpodautoscalers", "llm", "chat-stable")
    assert stored is not None
    assert stored["spec"]["minReplicas"] == 5 and stored["spec"]["maxReplicas"] == 6
    assert "d1:fire:0" in json.loads(stored["metadata"]["annotations"][ANNOTATION_KEYS])
    # Clamped to the configured maximum, never past it.
    clamped = built.scaler.set_replicas(ScaleRequest("chat", 50, idempotency_key="d2:fire:0"))
    assert clamped.detail["to"] == {"minReplicas": 8, "maxReplicas": 8}
    (event, _second) = fake.objects("events", "llm")
    assert event["involvedObject"]["name"] == "chat-stable" and event["reason"] == "TailguardScale"


def test_builder_without_events_writes_none(fake: FakeKubernetes) -> None:
    fake.put_object(hpa("chat", "serving"))
    built = build_cluster_actuators(
        settings(namespace="serving", events=False, hpa={"maxReplicas": 4}), ManualClock(), api_client=fake.api_client()
    )
    assert built.events is None and built.scaler is not None
    # No target mapping: the HPA named like the service in kubernetes.namespace.
    assert built.scaler.set_replicas(ScaleRequest("chat", 3, idempotency_key="k")).status is OutcomeStatus.SUCCEEDED
    assert fake.objects("events") == []
    assert fake.calls("create", "events") == []


def test_builder_httproute_router_with_ramp(fake: FakeKubernetes) -> None:
    fake.put_object(http_route("chat", "llm", {"chat-stable": 100, "chat-canary": 0}))
    clock = ManualClock()
    built = build_cluster_actuators(
        settings(traffic={"routes": {"chat": {"name": "chat"}}, "ramp": {"steps": [50], "hold": "30s"}}),
        clock,
        api_client=fake.api_client(),
    )
    assert isinstance(built.router, HttpRouteRouter) and built.scaler is None
    start = clock.now()
    outcome = built.router.set_weight(TrafficRequest("chat", "canary", 100, idempotency_key="d3:fire:0"))
    assert outcome.status is OutcomeStatus.SUCCEEDED, outcome
    assert outcome.detail["steps"] == [50, 100]
    assert clock.now() - start == 30.0  # one hold, on the injected clock
    stored = fake.get_object("httproutes", "llm", "chat")
    assert stored is not None
    assert [b["weight"] for b in stored["spec"]["rules"][0]["backendRefs"]] == [0, 100]


def test_builder_virtualservice_router_in_another_namespace(fake: FakeKubernetes) -> None:
    fake.put_object(virtual_service("chat-vs", "mesh", {"stable": 90, "canary": 10}))
    built = build_cluster_actuators(
        settings(traffic={"kind": "virtualservice", "routes": {"chat": {"namespace": "mesh", "name": "chat-vs"}}}),
        ManualClock(),
        api_client=fake.api_client(),
    )
    assert isinstance(built.router, VirtualServiceRouter)
    outcome = built.router.set_weight(TrafficRequest("chat", "canary", 0, idempotency_key="d4:fire:0"))
    assert outcome.status is OutcomeStatus.SUCCEEDED, outcome
    stored = fake.get_object("virtualservices", "mesh", "chat-vs")
    assert stored is not None
    assert [r["weight"] for r in stored["spec"]["http"][0]["route"]] == [100, 0]


def test_builder_reads_a_kubeconfig_relative_to_the_config(fake: FakeKubernetes, tmp_path: Path) -> None:
    fake.put_object(hpa("chat"))
    write_kubeconfig(tmp_path / "kube.yaml", fake.url)
    built = build_cluster_actuators(
        settings(inCluster=False, kubeconfig="kube.yaml", hpa={"maxReplicas": 4}), ManualClock(), base_dir=tmp_path
    )
    assert built.api_client.configuration.host == fake.url
    assert built.api_client.configuration.retries == 0  # the actuators retry, urllib3 must not as well
    assert built.scaler is not None and built.scaler.replicas("chat") == 2
    built.api_client.close()  # type: ignore[no-untyped-call]


# ----- one-line configuration errors ------------------------------------------------------------------------


def test_not_in_a_cluster_is_one_clear_line() -> None:
    with pytest.raises(ClusterConfigError) as raised:
        cluster_client(settings())
    message = str(raised.value)
    assert message.startswith("kubernetes: cannot use the in-cluster service account")
    assert "kubernetes.inCluster: false" in message and "\n" not in message


def test_unreadable_or_broken_kubeconfig_is_one_clear_line(tmp_path: Path) -> None:
    with pytest.raises(ClusterConfigError, match=r"^kubernetes.kubeconfig: cannot read .*missing.yaml: No such file"):
        cluster_client(settings(inCluster=False, kubeconfig="missing.yaml"), base_dir=tmp_path)
    (tmp_path / "broken.yaml").write_text("clusters: [\n", encoding="utf-8")
    with pytest.raises(ClusterConfigError, match=r"broken.yaml is not usable: invalid YAML at line 2"):
        cluster_client(settings(inCluster=False, kubeconfig=str(tmp_path / "broken.yaml")))
    (tmp_path / "empty.yaml").write_text("apiVersion: v1\nkind: Config\n", encoding="utf-8")
    with pytest.raises(ClusterConfigError, match=r"empty.yaml is not usable: .*current-context"):
        cluster_client(settings(inCluster=False, kubeconfig=str(tmp_path / "empty.yaml")))


def test_leader_elector_builder(fake: FakeKubernetes, tmp_path: Path) -> None:
    election = LeaderElectionSettings(namespace="tailguard", leaseName="tailguard-leader", identity="pod-a")
    with pytest.raises(ClusterConfigError, match="in-cluster"):  # no `kubernetes:` section: in-cluster
        build_leader_elector(election, None, ManualClock())
    kube = settings(inCluster=False, kubeconfig=str(write_kubeconfig(tmp_path / "kube.yaml", fake.url)))
    elector = build_leader_elector(election, kube, ManualClock())
    assert elector.run_once() is True
    lease = fake.get_object("leases", "tailguard", "tailguard-leader")
    assert lease is not None and lease["spec"]["holderIdentity"] == "pod-a"


# ----- one port per action type ------------------------------------------------------------------------------


def test_each_port_goes_to_its_own_actuator() -> None:
    rollbacks = FakeDeployer(replicas={"chat": 9}, revisions={"chat": 3})
    scaling = FakeDeployer(replicas={"chat": 2})
    ports = Actuators(rollback=rollbacks, scale=scaling)
    assert ports.rollback.rollback(RollbackRequest("chat", idempotency_key="r")).detail["to_revision"] == 2
    assert ports.scale.replicas("chat") == 2
    assert ports.scale.set_replicas(ScaleRequest("chat", 4, idempotency_key="s")).status is OutcomeStatus.SUCCEEDED
    assert [c.method for c in rollbacks.calls] == ["rollback"]
    assert [c.method for c in scaling.calls] == ["set_replicas"]
    assert scaling.replica_counts == {"chat": 4} and rollbacks.replica_counts == {"chat": 9}


def test_unconfigured_ports_answer_clear_failures() -> None:
    outcome = UnconfiguredRollback(ROLLBACK_MISSING).rollback(RollbackRequest("chat", idempotency_key="r"))
    assert outcome.status is OutcomeStatus.FAILED and not outcome.transient
    assert outcome.error == "no actuator configured for rollback: add argocd (or tier)"
    only_rollbacks = UnconfiguredScale(SCALE_MISSING)
    outcome = only_rollbacks.set_replicas(ScaleRequest("chat", 3, idempotency_key="s"))
    assert outcome.status is OutcomeStatus.FAILED and outcome.error == SCALE_MISSING and not outcome.transient
    assert SCALE_MISSING.startswith("no actuator configured for scale: add kubernetes.hpa")
    with pytest.raises(NoActuatorError, match="add kubernetes.hpa"):
        only_rollbacks.replicas("chat")


def test_dispatcher_records_a_scale_without_a_scaler_as_failed_once(tmp_path: Path) -> None:
    rollbacks = FakeDeployer(revisions={"chat": 3})
    clock = ManualClock()
    with Journal(tmp_path / "journal.db") as journal:
        actuators = Actuators(rollback=rollbacks, scale=UnconfiguredScale(SCALE_MISSING))
        dispatcher = Dispatcher(journal, actuators, clock, GlobalLimits(), attempts=3)
        decision = make_decision(
            [("scale", {"service": "chat", "delta": 2, "max": 8}), ("rollback", {"service": "chat"})]
        )
        start = clock.now()
        scale, rollback = dispatcher.dispatch(decision)
    assert scale.status is ActionStatus.FAILED and scale.attempts == 0  # failed planning: no actuator call, no retry
    assert scale.error is not None and SCALE_MISSING in scale.error
    assert clock.now() == start
    assert rollback.status is ActionStatus.SUCCEEDED
    assert [c.method for c in rollbacks.calls] == ["rollback"]


# ----- tailguard run --------------------------------------------------------------------------------------


RUN_CONFIG = """\
prometheus:
  url: http://127.0.0.1:9
policies: [rules]
listen: 127.0.0.1:0
"""

POLICY = """\
apiVersion: tailguard.io/v1alpha1
kind: Policy
name: queue
interval: 15s
targets: {groupBy: [service]}
signals:
  - name: waiting
    query: sum by ({{ by }}) (vllm:num_requests_waiting)
conditions:
  - name: queue-high
    signal: waiting
    when: {op: ">", value: 20}
    for: 1
    noData: hold
    actions:
      - {type: scale, service: "{{ service }}", delta: 1, max: 4}
"""


@pytest.mark.parametrize(
    ("section", "expected"),
    [
        ("kubernetes:\n  hpa: {maxReplicas: 4}\n", ": kubernetes: cannot use the in-cluster service account ("),
        (
            "kubernetes: {inCluster: false, kubeconfig: nowhere.yaml, hpa: {maxReplicas: 4}}\n",
            ": kubernetes.kubeconfig: cannot read {tmp}/nowhere.yaml: No such file or directory",
        ),
        (
            # The tier scales (a scale action needs an actuator), the Lease needs the cluster.
            "tier: {url: http://127.0.0.1:9}\nleaderElection: {namespace: tailguard}\n",
            ": kubernetes: cannot use the in-cluster service account (",
        ),
    ],
    ids=["not-in-a-cluster", "kubeconfig-unreadable", "leader-election-not-in-a-cluster"],
)
def test_run_with_an_unreachable_cluster_exits_2_with_one_line(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch, section: str, expected: str
) -> None:
    # A webhook token, so the only line on stderr is the cluster error (no "webhook is open" warning).
    monkeypatch.setenv("TAILGUARD_TEST_WEBHOOK_TOKEN", "not-a-real-token")
    section = "webhook: {bearerTokenEnv: TAILGUARD_TEST_WEBHOOK_TOKEN}\n" + section
    (tmp_path / "rules").mkdir()
    (tmp_path / "rules" / "queue.yaml").write_text(POLICY, encoding="utf-8")
    config = tmp_path / "controller.yaml"
    config.write_text(RUN_CONFIG + section, encoding="utf-8")
    assert cli.main(["run", "--config", str(config)]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "Traceback" not in err
    assert err.startswith(f"{config}{expected.format(tmp=tmp_path)}"), err
