"""deploy/components/predictive: the shipped deploy can predict.

`kubectl kustomize` renders the base with the component; the model volume is mounted read-only at exactly the
path the rendered controller.yaml names (predictors.sla.path). The controller's prediction path is then built from
the rendered configuration and the rendered policies ConfigMap, only the model's mount point moved into tmp:
with a small trained artifact there it loads the model (integrity checked as always) and the predictive policy
scales out after its two evaluations; without it the signal is no-data and nothing acts.
"""

from __future__ import annotations

import os
import shutil
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import sklearn
import yaml
from kubernetes_validate.utils import latest_version
from prometheus_client import CollectorRegistry
from sklearn.ensemble import HistGradientBoostingClassifier

from tailguard.controller.adapters.stores.journal import Journal
from tailguard.controller.app.settings import parse_settings_text
from tailguard.controller.core.engine import PolicyState
from tailguard.controller.core.model import DecisionKind, SignalResult, target_key
from tailguard.controller.core.policy_files import load_policies
from tailguard.controller.kit.clock import ManualClock
from tailguard.controller.loop.dispatcher import Actuators, Dispatcher, GlobalLimits
from tailguard.controller.loop.evaluation import EvaluationPorts, evaluate
from tailguard.controller.loop.metrics import ControllerMetrics
from tailguard.controller.testing import FakeAnnotator, FakeScaler, FakeSource
from tailguard.predictors.artifact import DIMENSIONS, ModelArtifact, save_artifact
from tailguard.predictors.features import feature_hash, feature_names, feature_queries
from tailguard.predictors.serving import PredictionProvider, single_threaded
from tailguard.serving.tier.manifests import render_kustomization, validate_objects

REPO = Path(__file__).resolve().parents[2]
BASE = REPO / "deploy" / "base"
COMPONENT = REPO / "deploy" / "components" / "predictive"
SPECS = REPO / "tests" / "support" / "specs"
POLICY = "predicted-queue-breach-scale"
CHAT = target_key({"service": "chat"})
T0 = 1_767_225_600.0


def render(tmp_path: Path, *, component: bool) -> list[dict[str, Any]]:
    """An overlay like deploy/overlays/example (kustomize takes only relative roots)."""
    root = tmp_path / ("with-component" if component else "base-only")
    root.mkdir()
    shutil.copy(BASE / "namespace-transformer.yaml", root / "namespace.yaml")
    components = f"components: [{os.path.relpath(COMPONENT, root)}]\n" if component else ""
    (root / "kustomization.yaml").write_text(
        f"resources: [{os.path.relpath(BASE, root)}]\n{components}transformers: [namespace.yaml]\n"
    )
    return render_kustomization(root)


def one(objects: list[dict[str, Any]], kind: str, prefix: str) -> dict[str, Any]:
    (found,) = [o for o in objects if o["kind"] == kind and o["metadata"]["name"].startswith(prefix)]
    return found


@pytest.fixture(scope="module")
def rendered(tmp_path_factory: pytest.TempPathFactory) -> list[dict[str, Any]]:
    return render(tmp_path_factory.mktemp("predictive"), component=True)


def test_the_component_mounts_the_model_read_only_where_the_config_names_it(
    rendered: list[dict[str, Any]], tmp_path: Path
) -> None:
    assert validate_objects(rendered, SPECS, latest_version()) == []
    config = yaml.safe_load(one(rendered, "ConfigMap", "tailguard-config-")["data"]["controller.yaml"])
    model_path = config["predictors"]["sla"]["path"]
    pod = one(rendered, "Deployment", "tailguard")["spec"]["template"]["spec"]
    (container,) = pod["containers"]
    mounts = {m["name"]: m for m in container["volumeMounts"]}
    assert mounts["sla-model"] == {"name": "sla-model", "mountPath": model_path, "readOnly": True}
    volumes = {v["name"]: v for v in pod["volumes"]}
    assert volumes["sla-model"]["persistentVolumeClaim"] == {"claimName": "tailguard-sla-model", "readOnly": True}
    claim = one(rendered, "PersistentVolumeClaim", "tailguard-sla-model")
    assert claim["metadata"]["namespace"] == "tailguard"
    assert claim["spec"]["accessModes"] == ["ReadOnlyMany"]  # leader and standby on different nodes
    # Both predictive example policies are in the policies ConfigMap the base ships.
    policies = one(rendered, "ConfigMap", "tailguard-policies-")["data"]
    assert {f"{POLICY}.yaml", "predicted-gpu-breach-scale.yaml"} <= set(policies)
    # The base alone mounts no model (its predictive policies are then no-data).
    base = render(tmp_path, component=False)
    base_pod = one(base, "Deployment", "tailguard")["spec"]["template"]["spec"]
    assert "sla-model" not in {v["name"] for v in base_pod["volumes"]}


def train_artifact(directory: Path) -> Path:
    """A small model: a queue-time breach when queue_time_p99 > 1 s (every dimension, the shipped kind)."""
    rng = np.random.default_rng(5)
    names = feature_names()
    x = rng.lognormal(0.0, 1.0, size=(400, len(names)))
    column = names.index("queue_time_p99")
    x[:, column] = rng.uniform(0.0, 4.0, size=len(x))
    y = (x[:, column] > 1.0).astype(np.int64)
    model = single_threaded(HistGradientBoostingClassifier(max_iter=20, random_state=0).fit, x, y)
    artifact = ModelArtifact(
        models=dict.fromkeys(DIMENSIONS, model),
        feature_names=names,
        feature_hash=feature_hash(),
        horizon_s=60.0,
        thresholds={"cpu": 1.0, "gpu": 20.0, "network": 0.5},
        decision_thresholds=dict.fromkeys(DIMENSIONS, 0.5),
        sklearn_version=sklearn.__version__,
        trained_window=(T0 - 86400, T0 - 3600),
        created_at=T0 - 3600,
    )
    return save_artifact(artifact, directory)


def controller_from_rendered(rendered: list[dict[str, Any]], tmp_path: Path) -> tuple[Any, ...]:
    """The rendered controller.yaml with the model's mount point (and the policies' ConfigMap mount) in tmp; the
    controller's PredictionProvider from its settings, its engine, journal and dispatcher; a scripted source."""
    config = yaml.safe_load(one(rendered, "ConfigMap", "tailguard-config-")["data"]["controller.yaml"])
    mount = tmp_path / "var-lib-tailguard-models-sla"
    config["predictors"]["sla"]["path"] = str(mount)
    settings = parse_settings_text(yaml.safe_dump(config), "controller.yaml", tmp_path)
    policies_dir = tmp_path / "policies"
    policies_dir.mkdir()
    text = one(rendered, "ConfigMap", "tailguard-policies-")["data"][f"{POLICY}.yaml"]
    (policies_dir / f"{POLICY}.yaml").write_text(text)
    loaded, errors = load_policies([policies_dir])
    assert errors == []
    (policy,) = [entry.policy for entry in loaded]
    clock = ManualClock(T0)
    provider = PredictionProvider(settings.predictor_specs(), clock)
    # Every feature present for `chat`; its queue-time P99 is 3 s: a breach to this model.
    queries = feature_queries(policy.targets.match, policy.targets.groupBy)
    source = FakeSource(
        instant_answers={queries["queue_time_p99"]: SignalResult({CHAT: 3.0})}, default=SignalResult({CHAT: 0.5})
    )
    journal = Journal(tmp_path / "journal.db")
    scaler, annotator = FakeScaler({"chat": 1}), FakeAnnotator()
    dispatcher = Dispatcher(journal, Actuators(scale=scaler, annotator=annotator), clock, GlobalLimits())
    ports = EvaluationPorts(
        source=source,
        journal=journal,
        dispatcher=dispatcher,
        clock=clock,
        metrics=ControllerMetrics(CollectorRegistry()),
        predictions=provider,
    )
    return policy, provider, ports, clock, scaler, journal, mount, settings


def run_evaluations(policy: Any, ports: EvaluationPorts, clock: ManualClock, count: int) -> list[Any]:
    state, decisions = PolicyState(), []
    for _ in range(count):
        outcome = evaluate(policy, state, clock.now(), ports)
        state = outcome.state
        decisions.extend(outcome.decisions)
        clock.advance(policy.interval)
    return decisions


def test_with_the_model_mounted_the_rendered_controller_loads_it_and_scales_out(
    rendered: list[dict[str, Any]], tmp_path: Path
) -> None:
    policy, provider, ports, clock, scaler, journal, mount, settings = controller_from_rendered(rendered, tmp_path)
    train_artifact(mount)
    try:
        assert settings.predictor_specs()["sla"].directory == mount
        states = provider.refresh()
        assert states["sla"].usable, states["sla"].describe()
        assert provider.warnings() == []
        probabilities = provider.predict(ports.source, policy, clock.now())
        (result,) = probabilities.values()
        assert result.error is None and result.values[CHAT] > 0.5
        decisions = run_evaluations(policy, ports, clock, 3)
        assert [d.kind for d in decisions] == [DecisionKind.FIRE]  # `for: 2`: on the second evaluation
        assert [(c.args["service"], c.args["replicas"]) for c in scaler.performed("set_replicas")] == [("chat", 2)]
        assert scaler.replica_counts == {"chat": 2}
    finally:
        journal.close()


def test_without_the_model_the_same_controller_is_no_data_and_never_acts(
    rendered: list[dict[str, Any]], tmp_path: Path
) -> None:
    policy, provider, ports, clock, scaler, journal, mount, _ = controller_from_rendered(rendered, tmp_path)
    try:
        assert not mount.exists()
        assert not provider.refresh()["sla"].usable
        assert any("sla" in warning for warning in provider.warnings())
        (result,) = provider.predict(ports.source, policy, clock.now()).values()
        assert result.values == {} and result.error is None  # no-data, not an error and not a breach
        assert run_evaluations(policy, ports, clock, 4) == []
        assert scaler.performed() == [] and scaler.replica_counts == {"chat": 1}
        # A tampered artifact is refused the same way: integrity checked as anywhere else.
        train_artifact(mount)
        victim = next(p for p in sorted(mount.iterdir()) if p.suffix == ".skops")
        victim.write_bytes(victim.read_bytes() + b"tampered")
        assert not provider.refresh()["sla"].usable
        assert run_evaluations(policy, ports, clock, 3) == []
        assert scaler.performed() == []
    finally:
        journal.close()
