"""The change tracker and its sources: Argo CD history (fake Argo CD), tier revisions, Deployment ReplicaSets."""

from __future__ import annotations

from collections.abc import Iterator
from datetime import UTC, datetime
from typing import Any

import pytest
from kubernetes import client as k8s

from tailguard.controller.adapters.argocd.client import ArgoCDClient
from tailguard.controller.adapters.argocd.settings import ArgoCDApp
from tailguard.controller.adapters.changes.tracker import (
    ArgoCDHistorySource,
    ChangeSourceError,
    ChangeTracker,
    KubernetesDeploymentSource,
    TierRevisionSource,
    args_diff,
    parse_time,
    parse_vllm_args,
)
from tailguard.controller.core.attribution import Rollout
from tailguard.controller.kit.clock import ManualClock
from tailguard.serving.tier.profiles import resolve_profile
from tailguard.serving.tier.server import revisions_answer
from tests.support.fake_argocd import FakeArgoCD, application

T0 = 1_700_000_000.0


@pytest.fixture
def fake() -> Iterator[FakeArgoCD]:
    with FakeArgoCD() as server:
        server.add_app(
            application(
                "llm-web",
                [("a1", T0 - 7200), ("b2", T0 - 600), ("c3", T0 - 60)],
                helm_parameters={
                    "a1": [("maxNumSeqs", "64")],
                    "b2": [("maxNumSeqs", "64"), ("kvCacheDtype", "fp8")],
                    "c3": [("maxNumSeqs", "2"), ("kvCacheDtype", "fp8")],
                },
            )
        )
        yield server
    assert server.state.spec_violations == []


def argocd_source(fake: FakeArgoCD, token: str = "argocd-test-token") -> ArgoCDHistorySource:
    client = ArgoCDClient(fake.url, clock=ManualClock(T0), token=lambda: token, timeout=2, retries=1)
    return ArgoCDHistorySource(client, {"web": ArgoCDApp(name="llm-web")})


def test_argocd_history_becomes_rollouts_with_the_engine_argument_diff(fake: FakeArgoCD) -> None:
    rollouts = argocd_source(fake).rollouts(T0 - 3600)
    assert [(r.revision, r.previous_revision, r.at) for r in rollouts] == [
        ("b2", "a1", T0 - 600),
        ("c3", "b2", T0 - 60),
    ]
    assert rollouts[1].labels == {"service": "web", "application": "llm-web"}
    assert rollouts[1].diff == {"maxNumSeqs": {"from": "64", "to": "2"}}
    assert rollouts[0].diff == {"kvCacheDtype": {"from": None, "to": "fp8"}}


def test_argocd_unreadable_is_a_source_error(fake: FakeArgoCD) -> None:
    with pytest.raises(ChangeSourceError, match="unauthorized"):
        argocd_source(fake, token="wrong").rollouts(T0 - 3600)


class StubTier:
    def __init__(self, revisions: list[dict[str, Any]], fail: bool = False) -> None:
        self._revisions = revisions
        self.fail = fail

    def services(self) -> list[dict[str, Any]]:
        return [{"name": "web"}]

    def revisions(self, service: str) -> list[dict[str, Any]]:
        if self.fail:
            raise ConnectionError("GET http://127.0.0.1:1/api/v1/services/web/revisions: connection refused")
        return revisions_answer(self._revisions)  # as the tier answers: with each revision's profile diff


def tier_revision(number: int, profile: str, at: float) -> dict[str, Any]:
    return {
        "revision": number,
        "version": f"r{number}",
        "profile": resolve_profile(profile).model_dump(mode="json"),
        "created_at": at,
        "bad": False,
        "reason": None,
    }


def test_tier_revisions_diff_the_engine_profiles() -> None:
    tier = StubTier([tier_revision(2, "bad-max-num-seqs", T0 - 30), tier_revision(1, "stable", T0 - 5000)])
    (rollout,) = TierRevisionSource(tier).rollouts(T0 - 3600)
    assert (rollout.revision, rollout.previous_revision, rollout.source) == ("r2", "r1", "tier")
    assert rollout.labels == {"service": "web", "version": "r2"}
    assert rollout.diff["max_num_seqs"] == {"from": 64, "to": 2}
    assert TierRevisionSource(tier).rollouts(T0) == []


def replica_set(deployment: str, revision: int, at: float, args: list[str]) -> k8s.V1ReplicaSet:
    return k8s.V1ReplicaSet(
        metadata=k8s.V1ObjectMeta(
            name=f"{deployment}-{revision}",
            labels={"app.kubernetes.io/name": "web"},
            annotations={"deployment.kubernetes.io/revision": str(revision)},
            owner_references=[k8s.V1OwnerReference(api_version="apps/v1", kind="Deployment", name=deployment, uid="u")],
            creation_timestamp=datetime.fromtimestamp(at, tz=UTC),
        ),
        spec=k8s.V1ReplicaSetSpec(
            selector=k8s.V1LabelSelector(match_labels={"app": deployment}),
            template=k8s.V1PodTemplateSpec(
                spec=k8s.V1PodSpec(containers=[k8s.V1Container(name="vllm", image="vllm", args=args)])
            ),
        ),
    )


class StubAppsApi:
    """The one AppsV1Api call the source makes, answering with real kubernetes client models."""

    def __init__(self, items: list[k8s.V1ReplicaSet], error: Exception | None = None) -> None:
        self.items = items
        self.error = error
        self.calls: list[tuple[str, dict[str, Any]]] = []

    def list_namespaced_replica_set(self, namespace: str, **kwargs: Any) -> k8s.V1ReplicaSetList:
        self.calls.append((namespace, kwargs))
        if self.error is not None:
            raise self.error
        return k8s.V1ReplicaSetList(items=self.items)


def test_deployment_revisions_from_replica_sets() -> None:
    api = StubAppsApi(
        [
            replica_set("vllm-web", 4, T0 - 40, ["--max-num-seqs", "2", "--enable-prefix-caching"]),
            replica_set("vllm-web", 3, T0 - 9000, ["--max-num-seqs", "64", "--enable-prefix-caching"]),
        ]
    )
    source = KubernetesDeploymentSource(api, "llm", label_selector="app.kubernetes.io/part-of=llm")
    (rollout,) = source.rollouts(T0 - 3600)
    assert (rollout.revision, rollout.previous_revision, rollout.at) == ("4", "3", T0 - 40)
    assert rollout.labels == {"service": "web", "deployment": "vllm-web", "namespace": "llm"}
    assert rollout.diff == {"max_num_seqs": {"from": "64", "to": "2"}}
    assert api.calls == [("llm", {"label_selector": "app.kubernetes.io/part-of=llm", "_request_timeout": 10.0})]


def test_kubernetes_api_error_is_a_source_error() -> None:
    api = StubAppsApi([], error=k8s.ApiException(status=403, reason="Forbidden"))
    with pytest.raises(ChangeSourceError, match="HTTP 403: Forbidden"):
        KubernetesDeploymentSource(api, "llm").rollouts(0)


def test_tracker_turns_failing_sources_into_data_and_keeps_the_others() -> None:
    good = TierRevisionSource(StubTier([tier_revision(1, "stable", T0 - 900), tier_revision(2, "stable", T0 - 30)]))
    bad = TierRevisionSource(StubTier([], fail=True))
    bad.name = "tier-b"
    feed = ChangeTracker([good, bad]).rollouts(T0 - 3600)
    assert [r.revision for r in feed.rollouts] == ["r2"]
    assert feed.error == ("tier-b: GET http://127.0.0.1:1/api/v1/services/web/revisions: connection refused")


def test_tracker_drops_rollouts_before_since_and_sorts_by_time() -> None:
    class Listed:
        name = "listed"

        def rollouts(self, since: float) -> list[Rollout]:
            return [
                Rollout({"service": "a"}, "x2", "x1", T0 - 10, "listed"),
                Rollout({"service": "a"}, "x0", None, T0 - 99999, "listed"),
                Rollout({"service": "b"}, "y2", "y1", T0 - 50, "listed"),
            ]

    feed = ChangeTracker([Listed()]).rollouts(T0 - 3600)
    assert [r.revision for r in feed.rollouts] == ["y2", "x2"] and feed.error is None


def test_vllm_flag_parsing_and_diff() -> None:
    assert parse_vllm_args(["vllm", "serve", "m", "--max-num-seqs=8", "--enforce-eager", "--dtype", "bfloat16"]) == {
        "max_num_seqs": "8",
        "enforce_eager": True,
        "dtype": "bfloat16",
    }
    assert args_diff(["--kv-cache-dtype", "auto"], ["--kv-cache-dtype", "fp8", "--enable-lora"]) == {
        "enable_lora": {"from": None, "to": True},
        "kv_cache_dtype": {"from": "auto", "to": "fp8"},
    }


def test_parse_time() -> None:
    assert parse_time("2023-11-14T22:13:20Z") == T0
    assert parse_time("not a time") is None and parse_time(None) is None
