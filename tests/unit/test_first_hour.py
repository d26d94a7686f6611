"""The first hour of a new user, as README.md and docs/deploy.md "Install" tell it: from a clone to a rendered,
validated overlay (made from the template deploy/overlays/example by the documented commands, with and without each
optional component) and to `kubectl tailguard status` against the spec-validating fake Kubernetes API.

The shell blocks of steps 5 (the overlay) are run literally, in a copy of the repository's deploy/ directory; every
rendered object is validated against the Kubernetes OpenAPI schema (kubernetes-validate, strict) and the CRDs' JSON
Schemas, and no namespaced object may render without a namespace. The status goes through the Kubernetes API's
service proxy of the rendered Service, with the token the user put in the Secret of step 3.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import yaml
from kubernetes_validate.utils import latest_version

from tailguard.controller.app import cli
from tailguard.serving.tier.manifests import render_kustomization, validate_objects
from tests.support.fake_kubernetes import FakeKubernetes
from tests.support.operated import operated_controller

REPO = Path(__file__).resolve().parents[2]
SPECS = REPO / "tests" / "support" / "specs"
DOCS = REPO / "docs" / "deploy.md"
NS = "sre-tailguard"
IMAGE, TAG = "registry.acme.test/platform/tailguard", "0.1.0-rc1"
COMPONENTS = ("crd-policies", "helm-rollback", "predictive", "sharding")
CLUSTER_SCOPED = {"Namespace", "CustomResourceDefinition", "ClusterRole", "ClusterRoleBinding"}
SERVING_NAMESPACE = "llm"


def install_section() -> str:
    text = DOCS.read_text(encoding="utf-8")
    start = text.index("## Install\n")
    return text[start : text.index("\n## ", start + 1)]


def shell_blocks(section: str) -> list[str]:
    return [re.sub(r"(?m)^   ", "", block) for block in re.findall(r"```sh\n(.*?)```", section, flags=re.DOTALL)]


def step(section: str, number: int) -> str:
    """The text of numbered step `number` (up to the next one)."""
    match = re.search(rf"(?ms)^{number}\. (.*?)(?=^\d+\. |\Z)", section)
    assert match is not None, f"docs/deploy.md Install has no step {number}"
    return match.group(1)


@pytest.fixture(scope="module")
def clone(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A new user's checkout after steps 4 and 5: deploy/ as in the repository, the overlay made from the template
    by the documented commands, and the `# CHANGE ME` lines filled in."""
    root = tmp_path_factory.mktemp("clone")
    shutil.copytree(REPO / "deploy", root / "deploy")
    section = install_section()
    blocks = shell_blocks(section)
    variables = next(b for b in blocks if b.startswith("NS="))
    overlay_commands = shell_blocks(step(section, 5))[0]
    assert "cp -r deploy/overlays/example" in overlay_commands
    script = (
        variables.replace("NS=tailguard", f"NS={NS}")
        + f"IMAGE={IMAGE} TAG={TAG}\n"
        + overlay_commands
    )
    done = subprocess.run(["bash", "-euo", "pipefail", "-c", script], cwd=root, capture_output=True, text=True,
                          timeout=60, check=False)  # fmt: skip
    assert done.returncode == 0, done.stderr
    overlay = root / "deploy" / "overlays" / NS
    # What grep printed is what the user edits: each line marked CHANGE ME, filled in here.
    marked = [line for line in done.stdout.splitlines() if "CHANGE ME" in line]
    assert {Path(line.split(":", 1)[0]).name for line in marked} >= {
        "controller.yaml", "kustomization.yaml", "serving-namespace.yaml", "networkpolicy-apiserver.yaml",
    }  # fmt: skip
    fills = {
        "http://prometheus-operated.monitoring.svc:9090": "http://prometheus.obs.svc:9090",
        "https://argocd-server.argocd.svc": "https://argocd.gitops.svc",
        "http://grafana.monitoring.svc:3000": "http://grafana.obs.svc:3000",
        "https://grafana.example.com": "https://grafana.acme.test",
        "https://argocd.example.com": "https://argocd.acme.test",
        "http://oncall-webhook.monitoring.svc:8080/hook": "http://pager.obs.svc:8080/hook",
        "cidr: 192.0.2.0/24": "cidr: 10.0.0.0/28",
    }
    for path in overlay.iterdir():
        text = path.read_text(encoding="utf-8")
        for old, new in fills.items():
            text = text.replace(old, new)
        path.write_text(text, encoding="utf-8")
    return root


def with_components(clone: Path, components: tuple[str, ...]) -> Path:
    """The overlay with `components` uncommented (docs: "uncomment them under components:")."""
    overlay = clone / "deploy" / "overlays" / NS
    text = (overlay / "kustomization.yaml").read_text(encoding="utf-8")
    if components:
        text = text.replace("# components:", "components:")
        for name in components:
            text = text.replace(f"#   - ../../components/{name}", f"  - ../../components/{name}")
    variant = overlay.parent / f"{NS}-{'-'.join(components) or 'plain'}"
    if variant.exists():
        shutil.rmtree(variant)
    shutil.copytree(overlay, variant)
    (variant / "kustomization.yaml").write_text(text, encoding="utf-8")
    return variant


@pytest.mark.parametrize("components", [(), *((c,) for c in COMPONENTS), COMPONENTS], ids=["plain", *COMPONENTS, "all"])
def test_the_documented_overlay_renders_valid_and_every_object_in_its_namespace(
    clone: Path, components: tuple[str, ...]
) -> None:
    objects = render_kustomization(with_components(clone, components))
    assert validate_objects(objects, SPECS, latest_version()) == []
    names = {(o["kind"], o["metadata"]["name"]) for o in objects}
    for component in components:  # each component's own objects are there
        folder = REPO / "deploy" / "components" / component
        for resource in yaml.safe_load((folder / "kustomization.yaml").read_text())["resources"]:
            for document in filter(None, yaml.safe_load_all((folder / resource).read_text())):
                assert (document["kind"], document["metadata"]["name"]) in names
    for document in objects:
        metadata = document["metadata"]
        what = f"{document['kind']} {metadata['name']}"
        if document["kind"] in CLUSTER_SCOPED:
            assert "namespace" not in metadata, what
            continue
        expected = SERVING_NAMESPACE if metadata.get("labels", {}).get("tailguard.io/rbac-scope") == "serving" else NS
        assert metadata.get("namespace") == expected, f"{what} renders in {metadata.get('namespace')!r}"
        for subject in document.get("subjects", []):
            assert subject == {"kind": "ServiceAccount", "name": "tailguard", "namespace": NS}, what
    (deployment,) = [o for o in objects if o["kind"] == "Deployment"]
    assert deployment["spec"]["template"]["spec"]["containers"][0]["image"] == f"{IMAGE}:{TAG}"
    (config,) = [o for o in objects if o["metadata"]["name"].startswith("tailguard-config-")]
    settings = yaml.safe_load(config["data"]["controller.yaml"])
    assert settings["leaderElection"]["namespace"] == NS
    assert settings["prometheus"]["url"] == "http://prometheus.obs.svc:9090"
    (receiver,) = [o for o in objects if o["metadata"]["name"].startswith("tailguard-alertmanager-example")]
    assert f"http://tailguard.{NS}.svc:9464/api/v1/alerts" in receiver["data"]["alertmanager-receiver.yaml"]


def test_a_component_renders_in_the_controllers_namespace_in_any_overlay(tmp_path: Path) -> None:
    """A user overlay with nothing but the base and a component (no namespace transformer of its own)."""
    root = tmp_path / "deploy"
    shutil.copytree(REPO / "deploy", root)
    overlay = root / "overlays" / "minimal"
    overlay.mkdir()
    components = "".join(f"  - ../../components/{c}\n" for c in COMPONENTS)
    (overlay / "kustomization.yaml").write_text(f"resources: [../../base]\ncomponents:\n{components}")
    objects = render_kustomization(overlay)
    assert validate_objects(objects, SPECS, latest_version()) == []
    for document in objects:
        if document["kind"] not in CLUSTER_SCOPED:
            assert document["metadata"].get("namespace") in ("tailguard", SERVING_NAMESPACE), document["metadata"]
        for subject in document.get("subjects", []):
            assert subject.get("namespace") == "tailguard", document["metadata"]["name"]


def test_the_crds_are_valid_and_the_example_policies_pass_their_schema(capsys: pytest.CaptureFixture[str]) -> None:
    files = sorted((REPO / "deploy" / "crds").glob("*.yaml"))
    crds = [d for path in files for d in yaml.safe_load_all(path.read_text()) if d]
    assert crds and validate_objects(crds, SPECS, latest_version()) == []
    assert cli.main(["rules", "to-cr", str(REPO / "rules" / "examples"), "-n", NS]) == 0
    manifests = capsys.readouterr().out
    with FakeKubernetes() as kube:  # validates each against the CRD's openAPIV3Schema, as `kubectl apply` would
        for manifest in yaml.safe_load_all(manifests):
            kube.put_object(manifest)
        listed = {o["metadata"]["name"] for o in kube.objects("tailguardpolicies", NS)}  # `kubectl get tgp`
    assert listed == {yaml.safe_load(p.read_text())["name"] for p in (REPO / "rules" / "examples").glob("*.yaml")}


def test_from_the_rendered_overlay_to_kubectl_tailguard_status(clone: Path, tmp_path: Path) -> None:
    """Step 8: `kubectl tailguard status -n "$NS"`, with the user's kubeconfig, through the service proxy of the
    rendered Service, answered by a controller running the rendered policies."""
    section = install_section()
    verify = step(section, 8)
    assert 'kubectl tailguard status -n "$NS"' in verify
    objects = render_kustomization(clone / "deploy" / "overlays" / NS)
    (service,) = [o for o in objects if o["kind"] == "Service"]
    (policies,) = [o for o in objects if o["metadata"]["name"].startswith("tailguard-policies")]
    assert "create secret generic tailguard-alertmanager" in step(section, 3)
    with operated_controller(tmp_path, policies["data"], namespace=NS, service_doc=service) as operated:
        for name in policies["data"]:
            operated.controller.evaluate(yaml.safe_load(policies["data"][name])["name"])
        env = {**os.environ, "PYTHONPATH": str(REPO), "KUBECONFIG": str(operated.kubeconfig)}
        env.pop("TAILGUARD_URL", None)
        done = subprocess.run(
            [sys.executable, "-m", "tailguard.controller.app.kubectl_plugin", "status", "-n", NS],
            cwd=REPO, capture_output=True, text=True, timeout=120, check=False, env=env,
        )  # fmt: skip
        proxied = [r for r in operated.kube.requests if r.resource == "services/proxy"]
    assert done.returncode == 0, done.stderr
    shown = {line.split()[0] for line in done.stdout.splitlines()[1:] if line.strip()}
    expected = {yaml.safe_load(text)["name"] for text in policies["data"].values()}
    assert expected <= shown, done.stdout
    assert [(r.verb, r.namespace, r.name) for r in proxied] == [("get", NS, "tailguard")]


def test_readme_sends_a_new_user_to_the_install_steps() -> None:
    readme = (REPO / "README.md").read_text(encoding="utf-8")
    assert 'docs/deploy.md, "Install"' in readme
    assert "kubectl apply -k deploy/base" not in readme and "kubectl apply -k deploy/base" not in install_section()


def test_every_change_me_of_the_template_is_in_the_fill_in_table() -> None:
    docs = DOCS.read_text(encoding="utf-8")
    table = docs[docs.index("## What to fill in") :]
    table = table[: table.index("\n## ")]
    template = REPO / "deploy" / "overlays" / "example"
    for path in sorted(template.iterdir()):
        for line in path.read_text(encoding="utf-8").splitlines():
            if "# CHANGE ME" not in line or line.lstrip().startswith("#"):
                continue
            assert f"`{path.name}`" in table, f"{path.name} is not in docs/deploy.md's fill-in table"


def test_the_overlay_admits_the_api_server_to_the_controller_port_only(clone: Path) -> None:
    """The service proxy connects from the API server: NetworkPolicies add up, so the overlay's own policy admits the
    addresses the user named, on the API port, and selects nothing but the controller pod."""
    objects = render_kustomization(clone / "deploy" / "overlays" / NS)
    (policy,) = [o for o in objects if o["metadata"]["name"] == "tailguard-from-apiserver"]
    (deployment,) = [o for o in objects if o["kind"] == "Deployment"]
    pod_labels = deployment["spec"]["template"]["metadata"]["labels"]
    assert policy["spec"]["podSelector"]["matchLabels"].items() <= pod_labels.items()
    assert policy["spec"]["policyTypes"] == ["Ingress"]
    admitted = {"from": [{"ipBlock": {"cidr": "10.0.0.0/28"}}], "ports": [{"port": "http", "protocol": "TCP"}]}
    assert policy["spec"]["ingress"] == [admitted]
