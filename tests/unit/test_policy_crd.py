"""TailguardPolicy custom resources: the generated CRD, the source (list+watch into policy files), the status."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import kubernetes_validate
import pytest
import yaml
from kubernetes.client.exceptions import ApiException

from tailguard.controller.adapters.policies.crd import CrdPolicySource
from tailguard.controller.adapters.policies.crd_schema import crd_manifest, render_crd
from tailguard.controller.core.engine import ConditionState, Phase, PolicyState
from tailguard.controller.core.policy_files import load_policies
from tests.support.fake_kubernetes import FakeKubernetes

ROOT = Path(__file__).resolve().parent.parent.parent
CRD_FILE = ROOT / "deploy" / "crds" / "tailguardpolicy.yaml"
EXAMPLE = ROOT / "rules" / "examples" / "p99-rollback.yaml"


class _Clock:
    def __init__(self) -> None:
        self.t = time.time()

    def now(self) -> float:
        return self.t


class _Journal:
    def __init__(self) -> None:
        self.states: dict[str, PolicyState] = {}
        self.decisions: list[dict[str, Any]] = []

    def load_state(self, policy: str) -> PolicyState | None:
        return self.states.get(policy)

    def recent_decisions(self, limit: int = 100) -> list[dict[str, Any]]:
        return self.decisions[:limit]

    def commit_evaluation(self, policy: str, state: PolicyState, decisions: Any, now: float) -> None:
        self.states[policy] = state

    def close(self) -> None:
        pass


def _cr(cr_name: str, **changes: Any) -> dict[str, Any]:
    spec = yaml.safe_load(EXAMPLE.read_text(encoding="utf-8"))
    for key in ("apiVersion", "kind", "name"):
        spec.pop(key)
    spec.update(changes)
    return {
        "apiVersion": "tailguard.io/v1alpha1",
        "kind": "TailguardPolicy",
        "metadata": {"name": cr_name, "namespace": "llm"},
        "spec": spec,
    }


def _walk(node: Any, path: str = ""):  # type: ignore[no-untyped-def]
    if isinstance(node, dict):
        yield path, node
        for key, value in node.items():
            yield from _walk(value, f"{path}/{key}")
    elif isinstance(node, list):
        for index, value in enumerate(node):
            yield from _walk(value, f"{path}/{index}")


def test_crd_file_is_up_to_date() -> None:
    assert CRD_FILE.read_text(encoding="utf-8") == render_crd(), "run: python scripts/generate_crd.py"


def test_crd_is_valid_and_structural() -> None:
    crd = yaml.safe_load(CRD_FILE.read_text(encoding="utf-8"))
    kubernetes_validate.validate(crd, kubernetes_validate.utils.latest_version(), strict=True)
    schema = crd["spec"]["versions"][0]["schema"]["openAPIV3Schema"]
    for path, node in _walk(schema):
        if path.endswith(("/properties", "/enum")):
            continue
        assert "$ref" not in node and "x-kubernetes-preserve-unknown-fields" not in node, path
        assert "oneOf" not in node and "anyOf" not in node and "const" not in node, path
        if "properties" in node or "items" in node or "pattern" in node:
            assert "type" in node or node.get("x-kubernetes-int-or-string"), path
        assert node.get("additionalProperties") is not False, path
    assert crd_manifest()["spec"]["versions"][0]["subresources"] == {"status": {}}


def test_a_custom_resource_is_loaded_as_a_policy(tmp_path: Path) -> None:
    with FakeKubernetes() as fake:
        fake.put_object(_cr("p99"))
        source = CrdPolicySource(fake.api_client(), "llm", tmp_path, _Clock())
        source.relist()
        loaded, errors = load_policies([tmp_path])
        assert errors == []
        assert [entry.policy.name for entry in loaded] == ["p99"]
        # spec.name wins over metadata.name
        fake.put_object(_cr("other", name="named-in-spec"))
        source.relist()
        assert sorted(e.policy.name for e in load_policies([tmp_path])[0]) == ["named-in-spec", "p99"]


def test_the_schema_refuses_an_invalid_custom_resource() -> None:
    with FakeKubernetes() as fake:
        with pytest.raises(ValueError, match="spec"):
            fake.put_object(_cr("bad", interval=["15s"]))
        client = fake.api_client()
        from kubernetes import client as k8s

        api = k8s.CustomObjectsApi(client)
        with pytest.raises(ApiException) as refused:
            api.create_namespaced_custom_object(
                "tailguard.io", "v1alpha1", "llm", "tailguardpolicies", _cr("bad", unknownField=1)
            )
        assert refused.value.status == 422


def test_an_invalid_update_keeps_the_last_good_version_and_is_reported(tmp_path: Path) -> None:
    with FakeKubernetes() as fake:
        fake.put_object(_cr("p99"))
        source = CrdPolicySource(fake.api_client(), "llm", tmp_path, _Clock(), journal=_Journal())
        source.relist()
        good = (tmp_path / "llm.p99.yaml").read_text(encoding="utf-8")
        stored = fake.get_object("tailguardpolicies", "llm", "p99")
        assert stored is not None
        stored["spec"]["conditions"][0]["signal"] = "no-such-signal"  # the schema cannot say this
        from kubernetes import client as k8s

        k8s.CustomObjectsApi(fake.api_client()).replace_namespaced_custom_object(
            "tailguard.io", "v1alpha1", "llm", "tailguardpolicies", "p99", stored
        )
        source.relist()
        assert (tmp_path / "llm.p99.yaml").read_text(encoding="utf-8") == good
        assert source.write_statuses() == 1
        status = fake.get_object("tailguardpolicies", "llm", "p99")["status"]  # type: ignore[index]
        assert status["observedGeneration"] == 1
        assert any("signal" in reason for reason in status["invalid"])
        degraded = next(c for c in status["conditions"] if c["type"] == "Degraded")
        assert (degraded["status"], degraded["reason"]) == ("True", "InvalidSpec")


def test_status_is_written_on_change_only_and_a_conflict_is_re_read(tmp_path: Path) -> None:
    journal = _Journal()
    clock = _Clock()
    with FakeKubernetes() as fake:
        fake.put_object(_cr("p99"))
        source = CrdPolicySource(fake.api_client(), "llm", tmp_path, clock, journal=journal)
        source.relist()
        assert source.write_statuses() == 1
        assert source.write_statuses() == 0  # nothing changed: no write
        assert fake.calls("update", "tailguardpolicies/status").__len__() == 1
        target = (("service", "llama"),)
        journal.states["p99"] = PolicyState(
            conditions={
                ("p99-above-800ms", target): ConditionState(
                    phase=Phase.FIRING, breach_count=3, last_value=1.2, last_data_at=clock.t
                )
            },
            actions_at={target: (clock.t - 10,)},
        )
        # a concurrent writer between our read and our write: 409, re-read, retried
        fake.inject("update", "tailguardpolicies", status=409)
        assert source.write_statuses() == 1
        status = fake.get_object("tailguardpolicies", "llm", "p99")["status"]  # type: ignore[index]
        assert status["targetsFiring"] == 1
        row = status["targets"][0]
        assert (row["phase"], row["streak"], row["lastValue"], row["budgetUsed"]) == ("firing", 3, 1.2, 1)
        assert 0 < row["cooldownRemainingSeconds"] < 600  # the example's cooldown: 10m, decided 10 s ago
        assert len(fake.calls("update", "tailguardpolicies/status")) == 3  # first, the refused one, the retry


def test_the_watch_applies_changes_and_re_lists_on_410(tmp_path: Path) -> None:
    with FakeKubernetes() as fake:
        fake.put_object(_cr("p99"))
        source = CrdPolicySource(
            fake.api_client(), "llm", tmp_path, _Clock(), status_interval=3600, backoff_max=0.2, watch_timeout=2
        )
        fake.compact()  # the watch's resourceVersion is older than the history: 410, re-list
        source.start()
        try:
            fake.put_object(_cr("second"))
            deadline = time.monotonic() + 10
            while not (tmp_path / "llm.second.yaml").exists() and time.monotonic() < deadline:
                time.sleep(0.05)
            assert (tmp_path / "llm.second.yaml").exists()
            fake.delete_object("tailguardpolicies", "llm", "second")
            while (tmp_path / "llm.second.yaml").exists() and time.monotonic() < deadline:
                time.sleep(0.05)
            assert not (tmp_path / "llm.second.yaml").exists()
            fake.compact()
            fake.put_object(_cr("third"))
            while not (tmp_path / "llm.third.yaml").exists() and time.monotonic() < deadline:
                time.sleep(0.05)
            assert (tmp_path / "llm.third.yaml").exists()
        finally:
            source.stop()
        assert source.relists >= 1
        assert any(r.verb == "watch" for r in fake.requests)


def test_the_source_calls_exactly_the_policy_permissions(tmp_path: Path) -> None:
    journal = _Journal()
    clock = _Clock()
    with FakeKubernetes() as fake:
        fake.put_object(_cr("p99"))
        fake.requests.clear()
        source = CrdPolicySource(
            fake.api_client(), "llm", tmp_path, clock, journal=journal, status_interval=3600, watch_timeout=1
        )
        source.start()
        try:
            assert source.write_statuses() == 1
            journal.decisions = [
                {
                    "id": "d1",
                    "kind": "fire",
                    "policy": "p99",
                    "condition": "p99-above-800ms",
                    "target": {"service": "llama"},
                    "at": clock.t,
                    "recorded_at": clock.t + 1,
                    "action_records": [  # the annotation comes first; the status headlines the rollback
                        {"idempotency_key": "d1:annotate:0", "type": "annotate", "resource": "g", "status": "failed"},
                        {
                            "idempotency_key": "d1:rollback:0",
                            "type": "rollback",
                            "resource": "llama",
                            "status": "succeeded",
                        }
                    ],
                }
            ]
            source.write_statuses()
            deadline = time.monotonic() + 5
            while not any(r.verb == "watch" for r in fake.requests) and time.monotonic() < deadline:
                time.sleep(0.05)
        finally:
            source.stop()
        recorded = {(r.api_group, r.resource, r.verb) for r in fake.requests}
        reasons = sorted(e["reason"] for e in fake.objects("events", "llm"))
        status = fake.get_object("tailguardpolicies", "llm", "p99")["status"]  # type: ignore[index]
    assert reasons == ["ActionDone", "ActionFailed", "Fired"]
    assert status["lastAction"] == "rollback succeeded"
    from tailguard.controller.tools.cluster_permissions import POLICY_PERMISSIONS

    declared = {(p.api_group, p.resource, verb) for p in POLICY_PERMISSIONS for verb in p.verbs}
    assert recorded == declared
