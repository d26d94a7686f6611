"""deploy/base's NetworkPolicy: the controller pod admits Prometheus and Alertmanager on its API port only, and
reaches DNS, the Kubernetes API and the systems its controller.yaml names, nothing else (issue 16 item 6)."""

from __future__ import annotations

from typing import Any
from urllib.parse import urlsplit

import pytest
import yaml

from tailguard.serving.tier.manifests import render_kustomization
from tests.unit.test_deploy import BASE, OVERLAY, one


@pytest.fixture(scope="module", params=[BASE, OVERLAY], ids=["base", "overlay"])
def rendered(request: pytest.FixtureRequest) -> list[dict[str, Any]]:
    # The overlay's own `tailguard-from-apiserver` (the service proxy's way in) is tested in test_first_hour.py.
    return [o for o in render_kustomization(request.param) if o["metadata"]["name"] != "tailguard-from-apiserver"]


def namespaces(peers: list[dict[str, Any]]) -> set[str]:
    return {peer["namespaceSelector"]["matchLabels"]["kubernetes.io/metadata.name"] for peer in peers}


def test_the_policy_selects_the_controller_pod_in_its_namespace(rendered: list[dict[str, Any]]) -> None:
    policy = one(rendered, "NetworkPolicy")
    deployment = one(rendered, "Deployment")
    assert policy["metadata"]["namespace"] == deployment["metadata"]["namespace"]
    pod_labels = deployment["spec"]["template"]["metadata"]["labels"]
    assert policy["spec"]["podSelector"]["matchLabels"].items() <= pod_labels.items()
    assert sorted(policy["spec"]["policyTypes"]) == ["Egress", "Ingress"]


def test_ingress_is_prometheus_and_alertmanager_on_the_api_port_only(rendered: list[dict[str, Any]]) -> None:
    policy = one(rendered, "NetworkPolicy")
    (rule,) = policy["spec"]["ingress"]
    assert rule["ports"] == [{"port": "http", "protocol": "TCP"}]
    container_ports = one(rendered, "Deployment")["spec"]["template"]["spec"]["containers"][0]["ports"]
    assert "http" in {port["name"] for port in container_ports}
    monitoring = [peer for peer in rule["from"] if "namespaceSelector" in peer]
    apps = {peer["podSelector"]["matchLabels"]["app.kubernetes.io/name"] for peer in monitoring}
    assert apps == {"prometheus", "alertmanager"}
    assert all("ipBlock" not in peer for peer in rule["from"])
    # The only other peer: the controller's own pods (the standby forwards to the leader), in its namespace.
    (replica,) = [peer for peer in rule["from"] if "namespaceSelector" not in peer]
    pod_labels = one(rendered, "Deployment")["spec"]["template"]["metadata"]["labels"]
    assert (
        replica == {"podSelector": policy["spec"]["podSelector"]}
        and replica["podSelector"]["matchLabels"].items() <= pod_labels.items()
    )


def test_egress_is_dns_the_api_server_and_the_configured_systems_only(rendered: list[dict[str, Any]]) -> None:
    policy = one(rendered, "NetworkPolicy")
    rules = policy["spec"]["egress"]
    # Issue 24 item 9: no rule goes to any host (at 7710821 the API server's rule allowed any host on 443/6443).
    assert [rule for rule in rules if "to" not in rule] == [], "every egress rule names where it goes"
    assert all(rule.get("ports") for rule in rules), "every egress rule names its ports"
    # The API server (not a pod): an ipBlock of its endpoints, a placeholder the user fills, on 443/6443 only.
    blocks = [rule for rule in rules if any("ipBlock" in peer for peer in rule["to"])]
    assert blocks == [
        {
            "to": [{"ipBlock": {"cidr": "192.0.2.10/32"}}],
            "ports": [{"port": 443, "protocol": "TCP"}, {"port": 6443, "protocol": "TCP"}],
        }
    ]
    assert all("ipBlock" not in peer for rule in rules if rule not in blocks for peer in rule["to"])
    dns = [rule for rule in rules if {"port": 53, "protocol": "UDP"} in rule.get("ports", [])]
    assert len(dns) == 1 and namespaces(dns[0]["to"]) == {"kube-system"}
    # Every system controller.yaml talks to is reachable: a rule to the namespace of its in-cluster host.
    (config_map,) = [
        o for o in rendered if o["kind"] == "ConfigMap" and o["metadata"]["name"].startswith("tailguard-config")
    ]
    config = yaml.safe_load(config_map["data"]["controller.yaml"])
    urls = [config["prometheus"]["url"], config["argocd"]["url"], config["annotations"]["grafana"]["url"]]
    urls += [receiver["url"] for receiver in config["receivers"].values()]
    # The other replica's API port, in the controller's own namespace (a podSelector alone).
    replica = [rule for rule in rules if any("podSelector" in peer and "namespaceSelector" not in peer
                                             for peer in rule["to"])]  # fmt: skip
    assert replica == [
        {"to": [{"podSelector": policy["spec"]["podSelector"]}], "ports": [{"port": 9464, "protocol": "TCP"}]}
    ]
    allowed = set().union(*(namespaces(rule["to"]) for rule in rules if rule not in replica and rule not in blocks))
    for url in urls:
        host = urlsplit(url).hostname or ""
        assert host.endswith(".svc") or ".svc." in host, f"{url}: an in-cluster Service"
        assert host.split(".")[1] in allowed, f"{url}: no egress rule to its namespace"
