"""A registry per port (controller/app/registry.py, registrations.py): adding an actuator is one adapter, one
settings model and one registry line. Here a toy KEDA-like scaler (a ScaledObject's `minReplicaCount` is the
floor it moves) is registered from this test only, through the public registry API: its `kubernetes.keda`
section is validated with the configuration's located errors, `build()` selects it by that section, and a
decision of a real evaluation (a loopback Prometheus answering a breach) ends in exactly one write to its fake
ScaledObject API. No product file knows it."""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Iterator, Mapping
from contextlib import ExitStack
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest
from pydantic import BaseModel, ConfigDict, Field

from tailguard.controller.app.build import build, missing_actuators
from tailguard.controller.app.registrations import REGISTRIES, ROLLBACK, SCALE, TRAFFIC
from tailguard.controller.app.registry import Adapter, BuildContext, RegistryError, Section, assemble, sections
from tailguard.controller.app.settings import ControllerSettings, SettingsError, parse_settings_text, settings_model
from tailguard.controller.core.policy_files import load_policies
from tailguard.controller.core.ports import ActionOutcome, OutcomeStatus, ScaleRequest, ScaleState
from tailguard.controller.kit.clock import SystemClock
from tailguard.controller.kit.errors import ConfigError
from tests.support.fake_kubernetes import FakeKubernetes

NAMESPACE = "llm"


# ----- the toy actuator: what an adapter folder would hold ----------------------------------------------------


class KedaSettings(BaseModel):
    """`kubernetes.keda`: scale actions move a KEDA ScaledObject's minReplicaCount."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    maxReplicaCount: int = Field(ge=1)
    scaledObjects: dict[str, str] = Field(default_factory=dict, description="service -> its ScaledObject")


class FakeScaledObjects:
    """The ScaledObject API: objects by (namespace, name), every write recorded as (namespace, name, patch)."""

    def __init__(self, objects: Mapping[tuple[str, str], dict[str, Any]]) -> None:
        self.objects = {key: json.loads(json.dumps(value)) for key, value in objects.items()}
        self.writes: list[tuple[str, str, dict[str, Any]]] = []

    def get(self, namespace: str, name: str) -> dict[str, Any]:
        return json.loads(json.dumps(self.objects[(namespace, name)]))

    def patch(self, namespace: str, name: str, patch: dict[str, Any]) -> None:
        self.writes.append((namespace, name, patch))
        stored = self.objects[(namespace, name)]
        stored["spec"].update(patch.get("spec", {}))
        stored["metadata"].setdefault("annotations", {}).update(patch.get("metadata", {}).get("annotations", {}))


class ScaledObjectScaler:
    """ScalePort over ScaledObjects: the floor is `minReplicaCount`, never above `maxReplicaCount`; a key already
    written (the object's annotation) is answered without writing again."""

    KEY = "tailguard.io/action-key"

    def __init__(self, api: FakeScaledObjects, namespace: str, settings: KedaSettings) -> None:
        self.api, self.namespace, self.settings = api, namespace, settings

    def _name(self, service: str) -> str:
        return self.settings.scaledObjects.get(service, service)

    def replicas(self, service: str) -> int:
        return int(self.api.get(self.namespace, self._name(service))["spec"]["minReplicaCount"])

    def set_replicas(self, request: ScaleRequest) -> ActionOutcome:
        name = self._name(request.service)
        current = self.api.get(self.namespace, name)
        if current["metadata"].get("annotations", {}).get(self.KEY) == request.idempotency_key:
            return ActionOutcome(OutcomeStatus.SUCCEEDED, {"replayed": True})
        floor = min(request.replicas, self.settings.maxReplicaCount)
        patch = {"metadata": {"annotations": {self.KEY: request.idempotency_key}}, "spec": {"minReplicaCount": floor}}
        self.api.patch(self.namespace, name, patch)
        return ActionOutcome(OutcomeStatus.SUCCEEDED, {"from": current["spec"]["minReplicaCount"], "to": floor})

    def scale_target(self, replicas: int) -> dict[str, int]:
        # A ScaledObject's minReplicaCount is a floor, as an HPA's minReplicas is: the port's name for it.
        return {"minReplicas": replicas}

    def scale_state(self, service: str) -> ScaleState:
        spec = self.api.get(self.namespace, self._name(service))["spec"]
        return ScaleState(minReplicas=spec["minReplicaCount"], maxReplicas=spec["maxReplicaCount"])

    def restore_scale(
        self, service: str, state: ScaleState, *, expected: ScaleState | None, idempotency_key: str
    ) -> ActionOutcome:
        assert state.minReplicas is not None
        return self.set_replicas(ScaleRequest(service, state.minReplicas, idempotency_key))


KEDA = Section[KedaSettings]("kubernetes.keda", KedaSettings, "scale actions through KEDA ScaledObjects")


def keda_adapter(api: FakeScaledObjects) -> Adapter[KedaSettings, ScaledObjectScaler]:
    """The registry line's adapter: its factory reads the section and the cluster connection's namespace."""

    def factory(keda: KedaSettings, context: BuildContext) -> ScaledObjectScaler:
        return ScaledObjectScaler(api, context.require_cluster(KEDA.path).namespace, keda)

    return Adapter("keda", KEDA, factory)


# ----- a loopback Prometheus answering one vector ---------------------------------------------------------------


class LoopbackPrometheus:
    def __init__(self, values: Mapping[str, float]) -> None:
        answer = [{"metric": {"service": s}, "value": [0, repr(v)]} for s, v in sorted(values.items())]

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, format: str, *args: Any) -> None:
                pass

            def _answer(self) -> None:
                result = [{**row, "value": [time.time(), row["value"][1]]} for row in answer]
                body = json.dumps({"status": "success", "data": {"resultType": "vector", "result": result}}).encode()
                self.send_response(200)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def do_GET(self) -> None:
                self._answer()

            def do_POST(self) -> None:
                self.rfile.read(int(self.headers.get("Content-Length") or 0))
                self._answer()

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.server.daemon_threads = True
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        threading.Thread(target=self.server.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True).start()

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


@pytest.fixture
def prometheus() -> Iterator[LoopbackPrometheus]:
    server = LoopbackPrometheus({"chat": 120.0})
    yield server
    server.close()


@pytest.fixture
def kube() -> Iterator[FakeKubernetes]:
    with FakeKubernetes() as fake:  # the cluster connection's server (the toy writes its own fake)
        yield fake


QUEUE_SCALE = """\
apiVersion: tailguard.io/v1alpha1
kind: Policy
name: queue-scale
interval: 1h
targets: {groupBy: [service]}
signals:
  - {name: queue, query: vllm_num_requests_waiting}
conditions:
  - name: queue-long
    signal: queue
    when: {op: ">", value: 50}
    for: 1
    noData: hold
    actions:
      - {type: scale, service: "{{ service }}", delta: 2, min: 1, max: 8}
"""


def write_config(tmp_path: Path, prometheus_url: str, kube_url: str, keda: str) -> str:
    (tmp_path / "rules").mkdir(exist_ok=True)
    (tmp_path / "rules" / "queue.yaml").write_text(QUEUE_SCALE, encoding="utf-8")
    kubeconfig = {
        "apiVersion": "v1",
        "kind": "Config",
        "clusters": [{"name": "fake", "cluster": {"server": kube_url}}],
        "users": [{"name": "tailguard", "user": {"token": "fake-cluster-token"}}],
        "contexts": [{"name": "fake", "context": {"cluster": "fake", "user": "tailguard"}}],
        "current-context": "fake",
    }
    (tmp_path / "kubeconfig.yaml").write_text(json.dumps(kubeconfig), encoding="utf-8")
    return (
        f"prometheus: {{url: {prometheus_url}, timeout: 2, retries: 1}}\n"
        "policies: [rules]\n"
        "journal: journal.db\n"
        "stateDir: state\n"
        "listen: 127.0.0.1:0\n"
        "reloadInterval: 1h\n"
        "kubernetes:\n"
        "  inCluster: false\n"
        "  kubeconfig: kubeconfig.yaml\n"
        f"  namespace: {NAMESPACE}\n"
        f"{keda}"
    )


KEDA_SECTION = "  keda:\n    maxReplicaCount: 6\n    scaledObjects: {chat: chat-so}\n"


def scaled_objects() -> FakeScaledObjects:
    spec = {"minReplicaCount": 2, "maxReplicaCount": 10, "scaleTargetRef": {"name": "chat-vllm"}}
    return FakeScaledObjects({(NAMESPACE, "chat-so"): {"metadata": {"name": "chat-so"}, "spec": spec}})


# ----- the tests -----------------------------------------------------------------------------------------------


def test_a_registered_actuator_is_selected_by_its_section_built_by_build_and_driven_by_a_decision(
    tmp_path: Path, prometheus: LoopbackPrometheus, kube: FakeKubernetes
) -> None:
    api = scaled_objects()
    text = write_config(tmp_path, prometheus.url, kube.url, KEDA_SECTION)
    with SCALE.registered(keda_adapter(api)), ExitStack() as stack:
        settings = parse_settings_text(text, "controller.yaml", tmp_path)
        loaded, errors = load_policies(settings.policy_paths())
        assert errors == [] and missing_actuators(settings, loaded) == [], "the ScaledObject scaler provides scale"
        application = build(settings, stack, webhook_token=None)
        controller = application.controller
        controller.reload()
        outcome = controller.evaluate("queue-scale")
        assert outcome is not None
        assert controller.wait_for_actions(timeout=20.0)
        key = next(iter(api.objects[(NAMESPACE, "chat-so")]["metadata"]["annotations"].values()))
        # Exactly one write: 2 + 2 replicas as the ScaledObject's floor, with the action's key.
        assert api.writes == [
            (
                NAMESPACE,
                "chat-so",
                {"metadata": {"annotations": {"tailguard.io/action-key": key}}, "spec": {"minReplicaCount": 4}},
            )
        ]
        assert key.endswith(":fire:0")
        assert api.objects[(NAMESPACE, "chat-so")]["spec"] == {
            "minReplicaCount": 4,
            "maxReplicaCount": 10,
            "scaleTargetRef": {"name": "chat-vllm"},
        }
        assert kube.calls("update") == [] and kube.calls("patch") == [], "nothing else was written"
    assert settings_model() is ControllerSettings, "unregistered: the schema is the built-ins' again"


def test_the_registered_section_is_validated_with_located_errors(tmp_path: Path) -> None:
    api = scaled_objects()
    wrong = "  keda:\n    maxReplicaCount: 0\n    minReplicaCount: 2\n"
    text = write_config(tmp_path, "http://127.0.0.1:9", "http://127.0.0.1:9", wrong)
    with pytest.raises(SettingsError) as unknown:  # not registered: an unknown field of `kubernetes`
        parse_settings_text(text, "controller.yaml", tmp_path)
    assert [str(error) for error in unknown.value.errors] == [
        "controller.yaml:12: kubernetes.keda: unknown field (not part of the controller configuration)"
    ]
    with SCALE.registered(keda_adapter(api)), pytest.raises(SettingsError) as invalid:
        parse_settings_text(text, "controller.yaml", tmp_path)
    assert [str(error) for error in invalid.value.errors] == [
        "controller.yaml:12: kubernetes.keda.maxReplicaCount: Input should be greater than or equal to 1, got 0",
        "controller.yaml:13: kubernetes.keda.minReplicaCount: unknown field (not part of the controller configuration)",
    ]


def test_without_the_section_the_registered_actuator_is_not_chosen_and_the_check_names_it(tmp_path: Path) -> None:
    api = scaled_objects()
    text = write_config(tmp_path, "http://127.0.0.1:9", "http://127.0.0.1:9", "")
    with SCALE.registered(keda_adapter(api)):
        settings = parse_settings_text(text, "controller.yaml", tmp_path)
        loaded, _ = load_policies(settings.policy_paths())
        [problem] = missing_actuators(settings, loaded)
        assert problem.message.endswith(
            "add a `kubernetes.hpa` or `kubernetes.keda` section (or `tier`) to the controller configuration"
        )
    assert SCALE.hint() == "a `kubernetes.hpa` section (or `tier`)"


def test_the_built_in_sections_are_declared_with_their_registered_models() -> None:
    # The schema assembled from the built-in registrations is the declared one: nothing added, nothing differing.
    assert assemble(ControllerSettings, sections(REGISTRIES)) is ControllerSettings
    assert [entry.name for entry in ROLLBACK.entries] == ["deployment", "argocd", "tier"]
    assert [entry.name for entry in TRAFFIC.entries] == ["routes", "tier"]
    assert ROLLBACK.hint() == "an `argocd` or `kubernetes.rollback` section (or `tier`)"


def test_a_registration_that_cannot_stand_is_refused() -> None:
    class Other(BaseModel):
        model_config = ConfigDict(extra="forbid")

    with pytest.raises(RegistryError, match="already registered"):
        SCALE.register(Adapter("hpa", Section("kubernetes.hpa2", Other), lambda s, c: None))
    with pytest.raises(RegistryError, match="declared as"):
        assemble(ControllerSettings, [Section("argocd", Other)])
    with pytest.raises(RegistryError, match="'journal' is not a section that holds others"):
        assemble(ControllerSettings, [Section("journal.extra", Other)])


def test_two_exclusive_rollbacks_configured_is_one_clear_error(tmp_path: Path) -> None:
    settings = ControllerSettings.model_validate(
        {
            "prometheus": {"url": "http://127.0.0.1:9"},
            "policies": ["rules"],
            "argocd": {"url": "https://argocd.example", "tokenEnv": "ARGOCD_TOKEN", "apps": {"chat": "chat"}},
            "kubernetes": {"rollback": {}},
        }
    )
    assert [entry.name for entry, _ in ROLLBACK.configured(settings)] == ["deployment", "argocd"]
    with ExitStack() as stack:
        context = BuildContext(settings, SystemClock(), tmp_path, None, stack)
        with pytest.raises(
            ConfigError, match=r"^kubernetes.rollback and argocd both roll back: configure one of them$"
        ):
            context.port(ROLLBACK)


def test_a_registered_scaler_beside_the_hpa_is_one_clear_error(tmp_path: Path) -> None:
    both = KEDA_SECTION + "  hpa: {maxReplicas: 8}\n"
    text = write_config(tmp_path, "http://127.0.0.1:9", "http://127.0.0.1:9", both)
    with SCALE.registered(keda_adapter(scaled_objects())), ExitStack() as stack:
        settings = parse_settings_text(text, "controller.yaml", tmp_path)
        context = BuildContext(settings, SystemClock(), tmp_path, None, stack)
        with pytest.raises(
            ConfigError, match=r"^kubernetes.hpa and kubernetes.keda both scale: configure one of them$"
        ):
            context.port(SCALE)
