"""deploy/components/sharding: the base plus the component renders valid; its Role grants get/update on exactly
the shard and member-slot Lease names the sharded elector uses for `leaderElection.shards: 4` (create is the
base's), and a sharded elector's recorded calls against the fake API are only the LEASE_PERMISSIONS verbs on
those names."""

from __future__ import annotations

import os
import shutil
from pathlib import Path
from typing import Any

import yaml
from kubernetes import client as k8s
from kubernetes_validate.utils import latest_version

from tailguard.controller.adapters.lease.shards import ShardedElector
from tailguard.controller.kit.clock import ManualClock
from tailguard.controller.tools.cluster_permissions import permission_triples
from tailguard.serving.tier.manifests import render_kustomization, validate_objects
from tests.support.fake_kubernetes import FakeKubernetes

REPO = Path(__file__).resolve().parents[2]
SPECS = REPO / "tests" / "support" / "specs"
BASE = REPO / "deploy" / "base"
COMPONENT = REPO / "deploy" / "components" / "sharding"
SHARDS = 4


def named(objects: list[dict[str, Any]], kind: str, name: str) -> dict[str, Any]:
    (found,) = [o for o in objects if o["kind"] == kind and o["metadata"]["name"] == name]
    return found


def test_sharding_component_grants_the_shard_and_member_leases(tmp_path: Path) -> None:
    shutil.copy(BASE / "namespace-transformer.yaml", tmp_path / "namespace.yaml")
    (tmp_path / "kustomization.yaml").write_text(
        f"resources: [{os.path.relpath(BASE, tmp_path)}]\ncomponents: [{os.path.relpath(COMPONENT, tmp_path)}]\n"
        "transformers: [namespace.yaml]\n"
    )
    objects = render_kustomization(tmp_path)
    assert validate_objects(objects, SPECS, latest_version()) == []
    role = named(objects, "Role", "tailguard-shard-leases")
    assert role["metadata"]["namespace"] == "tailguard"
    base_config = yaml.safe_load((BASE / "controller.yaml").read_text(encoding="utf-8"))
    lease = base_config["leaderElection"]["leaseName"]
    elector = ShardedElector(k8s.CoordinationV1Api(), lease, "tailguard", "pod-a", SHARDS, 15, ManualClock())
    names = sorted(e.name for e in [*elector.electors, *elector.members])
    (rule,) = role["rules"]
    assert (rule["apiGroups"], rule["resources"], sorted(rule["verbs"])) == (
        ["coordination.k8s.io"],
        ["leases"],
        ["get", "update"],
    )
    assert sorted(rule["resourceNames"]) == names
    binding = named(objects, "RoleBinding", "tailguard-shard-leases")
    assert binding["roleRef"]["name"] == "tailguard-shard-leases"
    assert binding["subjects"] == [{"kind": "ServiceAccount", "name": "tailguard", "namespace": "tailguard"}]


def test_a_sharded_elector_calls_only_the_lease_permissions() -> None:
    clock = ManualClock()
    with FakeKubernetes() as fake:
        api = k8s.CoordinationV1Api(fake.api_client())
        a = ShardedElector(api, "tailguard-leader", "tailguard", "pod-a", SHARDS, 15, clock)
        b = ShardedElector(api, "tailguard-leader", "tailguard", "pod-b", SHARDS, 15, clock)
        for _ in range(3):
            a.run_once()
            b.run_once()
            clock.advance(5)
        a.stop()
        b.run_once()
        recorded = {(r.api_group, r.resource, r.verb) for r in fake.requests}
        names = {r.name for r in fake.requests}
    assert recorded == permission_triples("controller")
    assert names == {f"tailguard-leader-{kind}-{i}" for kind in ("shard", "member") for i in range(SHARDS)} | {None}
