"""deploy/: the controller's kustomize base and example overlay render offline and every object is valid.

Rendered with the real `kubectl kustomize`; core kinds validated strictly with kubernetes-validate, the
prometheus-operator and Gateway API objects against their JSON Schemas (tests/support/specs/); the rule groups
with the real `promtool check rules` and the Alertmanager example with the real `amtool check-config`.
"""

from __future__ import annotations

import copy
import importlib
import os
import shutil
import subprocess
from collections.abc import Iterable
from pathlib import Path
from typing import Any

import pytest
import yaml
from kubernetes_validate.utils import latest_version

from tailguard.controller.app.settings import load_settings, parse_settings_text
from tailguard.controller.core.policy_files import load_policies
from tailguard.controller.tools.cluster_permissions import PEER_PERMISSIONS
from tailguard.serving.tier.manifests import (
    EXAMPLE_POLICIES_DIR,
    KustomizeError,
    kubectl_binary,
    render_kustomization,
    validate_objects,
)

REPO = Path(__file__).resolve().parents[2]
SPECS = REPO / "tests" / "support" / "specs"
BASE = REPO / "deploy" / "base"
OVERLAY = REPO / "deploy" / "overlays" / "example"
SERVING_NAMESPACE = "llm"
LEASE_NAME = "tailguard-leader"
SECRETS = {"tailguard-grafana", "tailguard-argocd", "tailguard-webhook", "tailguard-alertmanager"}

# What the actuators and the change tracker call (the kubernetes client methods in controller/actuators/
# kubernetes_hpa.py, traffic.py and controller/adapters/changes/tracker.py), until
# controller/tools/cluster_permissions.py provides
# ACTUATOR_PERMISSIONS (then that is the reference): (apiGroup, resource) -> verbs.
ISSUE_ACTUATOR_PERMISSIONS: dict[tuple[str, str], set[str]] = {
    ("autoscaling", "horizontalpodautoscalers"): {"get", "update"},
    ("apps", "replicasets"): {"list"},
    ("gateway.networking.k8s.io", "httproutes"): {"get", "update"},
    ("networking.istio.io", "virtualservices"): {"get", "update"},
}
LEASE_PERMISSIONS = {("coordination.k8s.io", "leases"): {"get", "create", "update"}}
EVENT_PERMISSIONS = {("", "events"): {"create"}}


def _triples(rules: Iterable[Any]) -> set[tuple[str, str, str]]:
    """RBAC-rule-shaped entries (dicts or objects with apiGroups/resources/verbs, or api_group/resource/verbs)."""
    found = set()
    for rule in rules:
        fields = rule if isinstance(rule, dict) else vars(rule) if hasattr(rule, "__dict__") else rule._asdict()
        get = fields.get
        groups = get("apiGroups") or [get("api_group", get("apiGroup", ""))]
        resources = get("resources") or [get("resource")]
        for group in groups:
            for resource in resources:
                for verb in get("verbs"):
                    found.add((str(group), str(resource), str(verb)))
    return found


def expected_actuator_permissions() -> set[tuple[str, str, str]]:
    try:
        module = importlib.import_module("tailguard.controller.tools.cluster_permissions")
    except ModuleNotFoundError:
        return {(g, r, v) for (g, r), verbs in ISSUE_ACTUATOR_PERMISSIONS.items() for v in verbs}
    permissions = module.ACTUATOR_PERMISSIONS
    return _triples(permissions.values() if isinstance(permissions, dict) else permissions)


def by_kind(objects: list[dict[str, Any]], kind: str) -> list[dict[str, Any]]:
    return [document for document in objects if document["kind"] == kind]


def one(objects: list[dict[str, Any]], kind: str, name_prefix: str = "") -> dict[str, Any]:
    matches = [doc for doc in by_kind(objects, kind) if doc["metadata"]["name"].startswith(name_prefix)]
    assert len(matches) == 1, f"expected one {kind} {name_prefix!r}, got {[m['metadata']['name'] for m in matches]}"
    return matches[0]


@pytest.fixture(scope="module")
def base() -> list[dict[str, Any]]:
    return render_kustomization(BASE)


@pytest.fixture(scope="module")
def overlay() -> list[dict[str, Any]]:
    return render_kustomization(OVERLAY)


def test_kubectl_is_installed_and_renders_offline() -> None:
    version = subprocess.run(
        [kubectl_binary(), "version", "--client"], check=False, capture_output=True, text=True, timeout=30
    )
    assert version.returncode == 0 and "Kustomize Version" in version.stdout


def test_a_broken_kustomization_is_a_clear_error(tmp_path: Path) -> None:
    (tmp_path / "kustomization.yaml").write_text("resources: [missing.yaml]\n")
    with pytest.raises(KustomizeError, match="missing.yaml"):
        render_kustomization(tmp_path)


@pytest.mark.parametrize("directory", [BASE, OVERLAY], ids=["base", "overlay"])
def test_every_rendered_object_is_valid(directory: Path) -> None:
    objects = render_kustomization(directory)
    assert validate_objects(objects, SPECS, latest_version()) == []
    kinds = {document["kind"] for document in objects}
    assert {"Deployment", "ServiceAccount", "Role", "RoleBinding", "ConfigMap", "Service"} <= kinds
    assert {"ServiceMonitor", "PrometheusRule"} <= kinds
    assert "Secret" not in kinds, "Secrets are referenced, never shipped"


def test_validation_rejects_a_misspelt_field_in_core_and_custom_kinds(base: list[dict[str, Any]]) -> None:
    broken = copy.deepcopy(base)
    one(broken, "Deployment")["spec"]["template"]["spec"]["containers"][0]["readinesProbe"] = {}
    one(broken, "ServiceMonitor")["spec"]["endpoints"][0]["intervall"] = "15s"
    problems = validate_objects(broken, SPECS, latest_version())
    assert any("readinesProbe" in problem for problem in problems)
    assert any("intervall" in problem for problem in problems)


def test_controller_pod_is_locked_down(base: list[dict[str, Any]]) -> None:
    deployment = one(base, "Deployment")
    pod = deployment["spec"]["template"]["spec"]
    assert pod["securityContext"]["runAsNonRoot"] is True
    assert pod["securityContext"]["runAsUser"] != 0
    assert pod["securityContext"]["seccompProfile"] == {"type": "RuntimeDefault"}
    (container,) = pod["containers"]
    context = container["securityContext"]
    assert context["readOnlyRootFilesystem"] is True
    assert context["allowPrivilegeEscalation"] is False
    assert context["capabilities"] == {"drop": ["ALL"]}
    assert context["seccompProfile"] == {"type": "RuntimeDefault"}
    resources = container["resources"]
    assert {"cpu", "memory"} <= set(resources["requests"]) and "memory" in resources["limits"]
    # Everything the controller writes lives on an emptyDir (the root filesystem is read-only).
    mounts = {mount["mountPath"]: mount["name"] for mount in container["volumeMounts"]}
    volumes = {volume["name"]: volume for volume in pod["volumes"]}
    assert "emptyDir" in volumes[mounts["/var/lib/tailguard"]]
    assert "emptyDir" in volumes[mounts["/tmp"]]


def test_probes_and_leader_election(base: list[dict[str, Any]], overlay: list[dict[str, Any]]) -> None:
    deployment = one(base, "Deployment")
    (container,) = deployment["spec"]["template"]["spec"]["containers"]
    assert container["livenessProbe"]["httpGet"] == {"path": "/healthz", "port": "http"}
    assert container["readinessProbe"]["httpGet"] == {"path": "/readyz", "port": "http"}
    assert {"name": "http", "containerPort": 9464, "protocol": "TCP"} in container["ports"]
    assert deployment["spec"]["replicas"] == 2
    env = {item["name"]: item for item in container["env"]}
    assert env["POD_NAMESPACE"]["valueFrom"]["fieldRef"]["fieldPath"] == "metadata.namespace"
    assert env["POD_NAME"]["valueFrom"]["fieldRef"]["fieldPath"] == "metadata.name"
    assert env["TAILGUARD_LEASE_NAME"]["value"] == LEASE_NAME
    # The leader publishes http://POD_IP:<listen port> in its Lease (one view across replicas).
    assert env["POD_IP"]["valueFrom"]["fieldRef"]["fieldPath"] == "status.podIP"
    # The Lease the replicas compete for is the one the Role lets them update.
    role = one(base, "Role", "tailguard-leader-election")
    named = [rule for rule in role["rules"] if rule.get("resourceNames")]
    assert named and all(rule["resourceNames"] == [LEASE_NAME] for rule in named)
    assert container["args"] == ["run", "--config", "/etc/tailguard/config/controller.yaml"]
    assert one(overlay, "Deployment")["spec"]["replicas"] == 1


def test_rbac_is_exactly_what_the_actuators_call(base: list[dict[str, Any]]) -> None:
    granted: dict[str, set[tuple[str, str, str]]] = {}
    for role in by_kind(base, "Role"):
        for rule in role["rules"]:
            for field in ("apiGroups", "resources", "verbs", "resourceNames"):
                assert "*" not in rule.get(field, []), f"wildcard in {role['metadata']['name']}: {rule}"
            assert "secrets" not in rule["resources"], "tailguard reads its secrets from mounted files only"
        granted[role["metadata"]["namespace"]] = _triples(role["rules"])
    assert not by_kind(base, "ClusterRole") and not by_kind(base, "ClusterRoleBinding"), "nothing cluster-wide"
    lease_and_events = _triples(
        {"apiGroups": [g], "resources": [r], "verbs": sorted(v)}
        for (g, r), v in {**LEASE_PERMISSIONS, **EVENT_PERMISSIONS}.items()
    )
    events = _triples(
        {"apiGroups": [g], "resources": [r], "verbs": sorted(v)} for (g, r), v in EVENT_PERMISSIONS.items()
    )
    peers = _triples(PEER_PERMISSIONS)  # replica-to-replica trust: the standby reads the Lease holder's pod
    assert granted["tailguard"] == lease_and_events | peers
    assert granted[SERVING_NAMESPACE] == expected_actuator_permissions() | events


def test_role_bindings_bind_the_controller_account(base: list[dict[str, Any]], overlay: list[dict[str, Any]]) -> None:
    for objects, namespace in ((base, "tailguard"), (overlay, "tailguard-example")):
        roles = {(role["metadata"]["namespace"], role["metadata"]["name"]) for role in by_kind(objects, "Role")}
        bindings = by_kind(objects, "RoleBinding")
        assert len(bindings) == len(roles) == 2
        for binding in bindings:
            assert (binding["metadata"]["namespace"], binding["roleRef"]["name"]) in roles
            assert binding["subjects"] == [{"kind": "ServiceAccount", "name": "tailguard", "namespace": namespace}]
        serving = [b for b in bindings if b["metadata"]["name"] == "tailguard-actuators"]
        assert serving[0]["metadata"]["namespace"] == SERVING_NAMESPACE
        assert one(objects, "Deployment")["spec"]["template"]["spec"]["serviceAccountName"] == "tailguard"


def test_overlay_moves_the_controller_pins_the_image_and_forces_dry_run(overlay: list[dict[str, Any]]) -> None:
    assert one(overlay, "Namespace")["metadata"]["name"] == "tailguard-example"
    for document in overlay:
        namespace = document["metadata"].get("namespace")
        if document["kind"] in ("Role", "RoleBinding") and document["metadata"]["name"] == "tailguard-actuators":
            assert namespace == SERVING_NAMESPACE
        elif document["kind"] != "Namespace":
            assert namespace == "tailguard-example", f"{document['kind']} {document['metadata']['name']}"
    (container,) = one(overlay, "Deployment")["spec"]["template"]["spec"]["containers"]
    assert container["image"] == "registry.example.com/sre/tailguard:0.1.0"
    config = config_text(overlay)
    assert parse_settings_text(config, "overlay", Path("/")).dryRun is True


def config_text(objects: list[dict[str, Any]]) -> str:
    return str(one(objects, "ConfigMap", "tailguard-config-")["data"]["controller.yaml"])


def test_controller_config_is_valid_and_in_cluster(base: list[dict[str, Any]], overlay: list[dict[str, Any]]) -> None:
    settings = parse_settings_text(config_text(base), "deploy/base/controller.yaml", Path("/"))
    assert settings.listen.host == "0.0.0.0" and settings.listen.port == 9464
    assert ".svc" in settings.prometheus.url
    assert settings.dryRun is None
    # Every path the controller writes is on the state emptyDir; every secret is a file under a Secret mount.
    for path in (settings.journal_path(), settings.state_path(), settings.annotations_path()):
        assert str(path).startswith("/var/lib/tailguard/")
    (container,) = one(base, "Deployment")["spec"]["template"]["spec"]["containers"]
    pod_volumes = {v["name"]: v for v in one(base, "Deployment")["spec"]["template"]["spec"]["volumes"]}
    secret_mounts = {
        mount["mountPath"]: pod_volumes[mount["name"]]["secret"]["secretName"]
        for mount in container["volumeMounts"]
        if "secret" in pod_volumes[mount["name"]]
    }
    assert set(secret_mounts.values()) == SECRETS
    secret_files = [receiver.secretFile for receiver in settings.receivers.values()]
    assert settings.annotations is not None and settings.annotations.grafana is not None
    secret_files.append(settings.annotations.grafana.tokenFile)
    assert settings.webhook is not None and settings.webhook.bearerTokenFile is not None
    secret_files.append(Path(settings.webhook.bearerTokenFile))
    assert settings.argocd is not None and settings.argocd.tokenFile is not None
    secret_files.append(Path(settings.argocd.tokenFile))
    for secret_file in secret_files:
        assert secret_file is not None and str(secret_file.parent) in secret_mounts, secret_file
    # The overlay's configuration is the base's plus dryRun: true, and its Lease in the overlay's namespace.
    base_data = yaml.safe_load(config_text(base))
    overlay_election = {**base_data["leaderElection"], "namespace": "tailguard-example"}
    assert yaml.safe_load(config_text(overlay)) == {**base_data, "dryRun": True, "leaderElection": overlay_election}
    # And the committed file is what the ConfigMap carries.
    assert load_settings(BASE / "controller.yaml") == settings.model_copy(update={"base_dir": BASE})


def test_policies_configmap_carries_every_example_policy(base: list[dict[str, Any]]) -> None:
    data = one(base, "ConfigMap", "tailguard-policies-")["data"]
    examples = {path.name: path.read_text(encoding="utf-8") for path in EXAMPLE_POLICIES_DIR.glob("*.yaml")}
    assert examples and data == examples
    volumes = one(base, "Deployment")["spec"]["template"]["spec"]["volumes"]
    policies_volume = next(v for v in volumes if v["name"] == "policies")
    assert policies_volume["configMap"]["name"] == one(base, "ConfigMap", "tailguard-policies-")["metadata"]["name"]


def _kubelet_configmap_volume(root: Path, data: dict[str, str], stamp: str) -> None:
    """Lay out `data` as the kubelet's atomic writer does: ..<stamp>/files, ..data -> ..<stamp>, key -> ..data/key."""
    version = root / f"..{stamp}"
    version.mkdir()
    for key, text in data.items():
        (version / key).write_text(text, encoding="utf-8")
    swap = root / "..data_tmp"
    swap.symlink_to(version.name)
    swap.replace(root / "..data")
    for key in data:
        link = root / key
        if not link.is_symlink():
            link.symlink_to(Path("..data") / key)


def test_policies_load_once_each_from_the_mounted_configmap_and_reload_after_an_update(
    base: list[dict[str, Any]], tmp_path: Path
) -> None:
    data = dict(one(base, "ConfigMap", "tailguard-policies-")["data"])
    mount = tmp_path / "etc" / "tailguard" / "policies"
    mount.mkdir(parents=True)
    _kubelet_configmap_volume(mount, data, "2026_01_01_00_00_00.1")
    settings = parse_settings_text(config_text(base), "controller.yaml", Path("/"))
    (configured,) = settings.policies
    in_tmp = [tmp_path / configured.lstrip("/")]
    loaded, errors = load_policies(in_tmp)
    assert errors == []
    assert sorted(item.policy.name for item in loaded) == sorted(yaml.safe_load(t)["name"] for t in data.values())
    # An update swaps ..data: the same configured path now reads the new content.
    name = "queue-scale.yaml"
    data[name] = data[name].replace("value: 20}", "value: 25}")
    _kubelet_configmap_volume(mount, data, "2026_01_01_00_05_00.2")
    loaded, errors = load_policies(in_tmp)
    assert errors == []
    queue = next(item.policy for item in loaded if item.policy.name == "queue-scale")
    assert queue.conditions[0].when.value == 25


def test_service_and_servicemonitor_scrape_the_controller(base: list[dict[str, Any]]) -> None:
    service = one(base, "Service")
    monitor = one(base, "ServiceMonitor")
    deployment = one(base, "Deployment")
    pod_labels = deployment["spec"]["template"]["metadata"]["labels"]
    assert all(pod_labels.get(key) == value for key, value in service["spec"]["selector"].items())
    assert all(service["metadata"]["labels"].get(k) == v for k, v in monitor["spec"]["selector"]["matchLabels"].items())
    (endpoint,) = monitor["spec"]["endpoints"]
    assert endpoint["path"] == "/metrics"
    assert endpoint["port"] in {port["name"] for port in service["spec"]["ports"]}


def test_prometheus_rules_pass_promtool_and_name_example_policies(base: list[dict[str, Any]], tmp_path: Path) -> None:
    rule = one(base, "PrometheusRule")
    rules_file = tmp_path / "rules.yaml"
    rules_file.write_text(yaml.safe_dump({"groups": rule["spec"]["groups"]}))
    promtool = shutil.which("promtool")
    assert promtool is not None, "promtool is installed by scripts/ensure-system-deps.sh"
    checked = subprocess.run(
        [promtool, "check", "rules", str(rules_file)], check=False, capture_output=True, text=True, timeout=60
    )
    assert checked.returncode == 0, checked.stdout + checked.stderr
    policies = {
        yaml.safe_load(path.read_text())["name"]: yaml.safe_load(path.read_text())
        for path in EXAMPLE_POLICIES_DIR.glob("*.yaml")
    }
    alerts = [r for group in rule["spec"]["groups"] for r in group["rules"] if "alert" in r]
    assert alerts
    for alert in alerts:
        policy = policies[alert["labels"]["tailguard_policy"]]
        # The controller matches an alert to a policy by the policy's groupBy and match labels (controller/app/api.py).
        for label in policy["targets"]["groupBy"]:
            assert label in alert["expr"], f"{alert['alert']} must keep the {label} label"
        for label, value in policy["targets"]["match"].items():
            assert f'{label}="{value}"' in alert["expr"]


def test_alertmanager_example_is_valid_and_posts_to_the_controller(
    base: list[dict[str, Any]], overlay: list[dict[str, Any]], tmp_path: Path
) -> None:
    amtool = shutil.which("amtool")
    assert amtool is not None, "amtool ships with prometheus-alertmanager (scripts/ensure-system-deps.sh)"
    for objects, namespace in ((base, "tailguard"), (overlay, "tailguard-example")):
        text = one(objects, "ConfigMap", "tailguard-alertmanager-example-")["data"]["alertmanager-receiver.yaml"]
        config_file = tmp_path / f"{namespace}.yml"
        config_file.write_text(text)
        checked = subprocess.run(
            [amtool, "check-config", str(config_file)], check=False, capture_output=True, text=True, timeout=60
        )
        assert checked.returncode == 0, checked.stdout + checked.stderr
        config = yaml.safe_load(text)
        (receiver,) = [r for r in config["receivers"] if r["name"] == "tailguard"]
        service = one(objects, "Service")
        port = service["spec"]["ports"][0]["port"]
        expected = f"http://{service['metadata']['name']}.{namespace}.svc:{port}/api/v1/alerts"
        # The controller requires the bearer token of the Secret tailguard-alertmanager on its webhook.
        authorization = {"type": "Bearer", "credentials_file": "/etc/alertmanager/secrets/tailguard-alertmanager/token"}
        assert receiver["webhook_configs"] == [
            {"url": expected, "send_resolved": True, "max_alerts": 0, "http_config": {"authorization": authorization}}
        ]
        assert any(route["receiver"] == "tailguard" for route in config["route"]["routes"])


def test_dockerfile_runs_the_controller_as_the_deployments_non_root_user(base: list[dict[str, Any]]) -> None:
    lines = [line.strip() for line in (REPO / "Dockerfile").read_text().splitlines()]
    users = [line.split()[1] for line in lines if line.startswith("USER ")]
    assert users, "the image must set a USER"
    uid = users[-1].split(":")[0]
    assert uid.isdigit() and int(uid) != 0, "numeric, so runAsNonRoot can verify it"
    pod = one(base, "Deployment")["spec"]["template"]["spec"]
    assert pod["securityContext"]["runAsUser"] == int(uid)
    assert 'ENTRYPOINT ["tailguard"]' in lines


def test_crd_policies_component_grants_exactly_the_policy_permissions(tmp_path: Path) -> None:
    """deploy/components/crd-policies (for a `kubernetes.policies` section): the base plus the component renders
    valid, its Role in the controller's namespace is exactly POLICY_PERMISSIONS, bound to the controller's
    account; the base alone reads no custom resource."""
    from tailguard.controller.tools.cluster_permissions import POLICY_PERMISSIONS

    component = REPO / "deploy" / "components" / "crd-policies"
    # An overlay like deploy/overlays/example: the base's namespace transformer puts the component's objects
    # (which name no namespace) in the controller's namespace. kustomize takes only relative roots.
    shutil.copy(BASE / "namespace-transformer.yaml", tmp_path / "namespace.yaml")
    (tmp_path / "kustomization.yaml").write_text(
        f"resources: [{os.path.relpath(BASE, tmp_path)}]\ncomponents: [{os.path.relpath(component, tmp_path)}]\n"
        "transformers: [namespace.yaml]\n"
    )
    objects = render_kustomization(tmp_path)
    assert validate_objects(objects, SPECS, latest_version()) == []
    role = one(objects, "Role", "tailguard-policies")
    assert role["metadata"]["namespace"] == "tailguard"
    for rule in role["rules"]:
        assert "*" not in [*rule["apiGroups"], *rule["resources"], *rule["verbs"]]
    assert _triples(role["rules"]) == {(p.api_group, p.resource, v) for p in POLICY_PERMISSIONS for v in p.verbs}
    assert {p.namespace_scope for p in POLICY_PERMISSIONS} == {"controller"}
    binding = one(objects, "RoleBinding", "tailguard-policies")
    assert binding["metadata"]["namespace"] == "tailguard" and binding["roleRef"]["name"] == "tailguard-policies"
    assert binding["subjects"] == [{"kind": "ServiceAccount", "name": "tailguard", "namespace": "tailguard"}]
    base_rules = [rule for r in by_kind(render_kustomization(BASE), "Role") for rule in r["rules"]]
    assert not any("tailguard.io" in rule["apiGroups"] for rule in base_rules)


def test_the_image_ships_promtool() -> None:
    """Issue 24 item 9: `tailguard rules validate` in the image needs a PromQL parser (it fails without one)."""
    lines = [line.strip() for line in (REPO / "Dockerfile").read_text().splitlines()]
    stages = [line.split() for line in lines if line.startswith("FROM ")]
    promtool_stage = [stage for stage in stages if stage[-1] == "promtool"]
    assert promtool_stage and promtool_stage[0][1].startswith("prom/prometheus:v"), "a pinned Prometheus release"
    final = lines[max(i for i, line in enumerate(lines) if line.startswith("FROM ")) :]
    assert "COPY --from=promtool /bin/promtool /usr/local/bin/promtool" in final, "copied into the runtime image"
