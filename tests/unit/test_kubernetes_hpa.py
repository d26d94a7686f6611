"""The HPA actuator against the spec-validating fake Kubernetes API (official client, loopback)."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import pytest
from kubernetes import client as k8s

from tailguard.controller.adapters.kube.action_keys import ANNOTATION_KEYS
from tailguard.controller.adapters.kube.api_client import cluster_api_client
from tailguard.controller.adapters.kube.calls import KubernetesActuatorError
from tailguard.controller.adapters.kube.events import EventRecorder
from tailguard.controller.adapters.scale.hpa import ANNOTATION_HUMAN_FLOOR, HpaBounds, HpaScaler, plan_replicas
from tailguard.controller.core.ports import OutcomeStatus, ScaleRequest
from tailguard.controller.kit.clock import ManualClock
from tailguard.controller.kit.http import RetryPolicy
from tests.support.dispatch import dispatched
from tests.support.fake_kubernetes import FakeKubernetes, hpa


@pytest.fixture
def fake() -> Iterator[FakeKubernetes]:
    with FakeKubernetes() as server:
        server.put_object(hpa("chat", min_replicas=2, max_replicas=6))
        yield server


def deployer(fake: FakeKubernetes, clock: ManualClock, **kwargs: object) -> HpaScaler:
    api = fake.api_client()
    options: dict[str, object] = {
        "clock": clock,
        "bounds": HpaBounds(max_replicas=8),
        "namespace": "llm",
        "timeout": 5.0,
        "retry": RetryPolicy(attempts=3, backoff=1.0),
        "events": EventRecorder(k8s.CoreV1Api(api), clock),
    }
    options.update(kwargs)
    return HpaScaler(k8s.AutoscalingV2Api(api), **options)  # type: ignore[arg-type]


def spec(fake: FakeKubernetes) -> dict[str, object]:
    stored = fake.get_object("horizontalpodautoscalers", "llm", "chat")
    assert stored is not None
    return stored


def test_scale_up_raises_the_floor_records_the_human_floor_key_and_an_event(fake: FakeKubernetes) -> None:
    clock = ManualClock()
    outcome = deployer(fake, clock).set_replicas(ScaleRequest("chat", 7, idempotency_key="d1:fire:0"))
    assert outcome.status is OutcomeStatus.SUCCEEDED, outcome
    stored = spec(fake)
    assert stored["spec"]["minReplicas"] == 7  # type: ignore[index]
    assert stored["spec"]["maxReplicas"] == 7  # raised so min <= max  # type: ignore[index]
    annotations = stored["metadata"]["annotations"]  # type: ignore[index]
    assert annotations[ANNOTATION_HUMAN_FLOOR] == "2"
    assert json.loads(annotations[ANNOTATION_KEYS]) == ["d1:fire:0"]
    events = fake.objects("events", "llm")
    assert len(events) == 1 and events[0]["reason"] == "TailguardScale"
    assert events[0]["involvedObject"]["name"] == "chat"


def test_replay_of_a_key_is_a_no_op(fake: FakeKubernetes) -> None:
    clock = ManualClock()
    actuator = deployer(fake, clock)
    actuator.set_replicas(ScaleRequest("chat", 5, idempotency_key="d1:fire:0"))
    writes = len(fake.calls("update", "horizontalpodautoscalers"))
    again = actuator.set_replicas(ScaleRequest("chat", 5, idempotency_key="d1:fire:0"))
    assert again.status is OutcomeStatus.SUCCEEDED and again.detail["replayed"] is True
    assert len(fake.calls("update", "horizontalpodautoscalers")) == writes
    assert len(fake.objects("events", "llm")) == 1


def test_scale_down_never_goes_below_the_human_floor(fake: FakeKubernetes) -> None:
    clock = ManualClock()
    actuator = deployer(fake, clock)
    actuator.set_replicas(ScaleRequest("chat", 6, idempotency_key="up"))
    down = actuator.set_replicas(ScaleRequest("chat", 1, idempotency_key="down"))
    assert down.status is OutcomeStatus.SUCCEEDED
    assert "human floor 2" in down.detail["clamped"]
    assert spec(fake)["spec"]["minReplicas"] == 2  # type: ignore[index]
    # Already at the floor: asking for less again changes nothing and says why.
    again = actuator.set_replicas(ScaleRequest("chat", 1, idempotency_key="down-again"))
    assert again.status is OutcomeStatus.SKIPPED and "human floor" in again.detail["clamped"]


def test_below_the_floor_only_when_the_bounds_allow_it(fake: FakeKubernetes) -> None:
    actuator = deployer(fake, ManualClock(), bounds=HpaBounds(max_replicas=8, allow_below_human_floor=True))
    assert actuator.set_replicas(ScaleRequest("chat", 1, idempotency_key="k")).status is OutcomeStatus.SUCCEEDED
    assert spec(fake)["spec"]["minReplicas"] == 1  # type: ignore[index]


def test_a_human_edit_of_min_replicas_becomes_the_new_floor() -> None:
    recorded = {"tailguard.io/human-min-replicas": "2", "tailguard.io/tailguard-min-replicas": "6"}
    bounds = HpaBounds(max_replicas=10)
    # tailguard wrote 6; a human since set 4: 4 is the floor now.
    assert plan_replicas({"min_replicas": 4, "max_replicas": 10, "annotations": recorded}, 1, bounds).min_replicas == 4
    # still what tailguard wrote: the recorded floor 2 holds.
    assert plan_replicas({"min_replicas": 6, "max_replicas": 10, "annotations": recorded}, 1, bounds).min_replicas == 2
    # above the configured maximum: clamped.
    plan = plan_replicas({"min_replicas": 6, "max_replicas": 10, "annotations": recorded}, 40, bounds)
    assert (plan.min_replicas, plan.max_replicas) == (10, 10) and plan.clamped is not None


def test_conflict_is_retried_with_a_fresh_read(fake: FakeKubernetes) -> None:
    clock = ManualClock()
    fake.inject(
        "update", "horizontalpodautoscalers", hook=lambda: fake.touch("horizontalpodautoscalers", "llm", "chat")
    )
    outcome = deployer(fake, clock).set_replicas(ScaleRequest("chat", 4, idempotency_key="k"))
    assert outcome.status is OutcomeStatus.SUCCEEDED and outcome.detail["conflicts"] == 1
    assert len(fake.calls("get", "horizontalpodautoscalers")) == 2
    assert len(fake.calls("update", "horizontalpodautoscalers")) == 2
    stored = spec(fake)
    assert stored["spec"]["minReplicas"] == 4  # type: ignore[index]
    # the concurrent writer's change survived (it was re-read, not overwritten)
    assert "example.com/touched" in stored["metadata"]["annotations"]  # type: ignore[index]


def test_conflicts_are_bounded(fake: FakeKubernetes) -> None:
    fake.inject(
        "update",
        "horizontalpodautoscalers",
        hook=lambda: fake.touch("horizontalpodautoscalers", "llm", "chat"),
        times=10,
    )
    outcome = deployer(fake, ManualClock(), conflict_retries=2).set_replicas(
        ScaleRequest("chat", 4, idempotency_key="k")
    )
    assert outcome.status is OutcomeStatus.FAILED and not outcome.transient
    assert "409" in (outcome.error or "")
    assert len(fake.calls("update", "horizontalpodautoscalers")) == 3


def test_unknown_hpa_is_a_permanent_failure(fake: FakeKubernetes) -> None:
    outcome = deployer(fake, ManualClock()).set_replicas(ScaleRequest("nope", 3, idempotency_key="k"))
    assert outcome.status is OutcomeStatus.FAILED and not outcome.transient
    assert "404" in (outcome.error or "") and "llm/nope" in (outcome.error or "")
    assert len(fake.calls("get", "horizontalpodautoscalers")) == 1  # 404 is not retried


def test_server_errors_are_retried_with_backoff_then_reported_transient(fake: FakeKubernetes) -> None:
    clock = ManualClock()
    fake.inject("get", "horizontalpodautoscalers", status=500, times=3)
    start = clock.now()
    outcome = deployer(fake, clock).set_replicas(ScaleRequest("chat", 3, idempotency_key="k"))
    assert outcome.status is OutcomeStatus.FAILED and outcome.transient
    assert "HTTP 500" in (outcome.error or "")
    assert len(fake.calls("get", "horizontalpodautoscalers")) == 3
    assert clock.now() - start == pytest.approx(1.0 + 2.0)  # backoff through the injected clock
    assert fake.calls("update", "horizontalpodautoscalers") == []


def test_one_server_error_then_success(fake: FakeKubernetes) -> None:
    fake.inject("get", "horizontalpodautoscalers", status=503)
    outcome = deployer(fake, ManualClock()).set_replicas(ScaleRequest("chat", 3, idempotency_key="k"))
    assert outcome.status is OutcomeStatus.SUCCEEDED
    assert len(fake.calls("update", "horizontalpodautoscalers")) == 1


def test_a_write_that_times_out_is_not_applied_twice(fake: FakeKubernetes) -> None:
    # The PUT lands but the answer comes too late: the re-read finds the key and stops (no second write).
    fake.inject("update", "horizontalpodautoscalers", delay_after=1.0)
    clock = ManualClock()
    scaler = deployer(fake, clock, timeout=0.3)
    outcome = dispatched(lambda: scaler.set_replicas(ScaleRequest("chat", 5, idempotency_key="k")), clock=clock)
    assert outcome.status is OutcomeStatus.SUCCEEDED and outcome.detail["replayed"] is True
    assert len(fake.calls("update", "horizontalpodautoscalers")) == 1
    assert spec(fake)["spec"]["minReplicas"] == 5  # type: ignore[index]


def test_read_timeout_is_a_transient_failure(fake: FakeKubernetes) -> None:
    fake.inject("get", "horizontalpodautoscalers", delay=1.0, times=2)
    outcome = deployer(fake, ManualClock(), timeout=0.2, retry=RetryPolicy(attempts=2)).set_replicas(
        ScaleRequest("chat", 5, idempotency_key="k")
    )
    assert outcome.status is OutcomeStatus.FAILED and outcome.transient
    assert "no answer" in (outcome.error or "")
    assert fake.calls("update", "horizontalpodautoscalers") == []


def test_replicas_reads_the_current_count_and_raises_transiently_on_outage(fake: FakeKubernetes) -> None:
    actuator = deployer(fake, ManualClock(), retry=RetryPolicy(attempts=1))
    assert actuator.replicas("chat") == 2
    fake.inject("get", "horizontalpodautoscalers", status=503)
    with pytest.raises(KubernetesActuatorError) as raised:
        actuator.replicas("chat")
    assert raised.value.transient


def test_an_event_failure_never_fails_the_action(fake: FakeKubernetes) -> None:
    fake.inject("create", "events", status=500)
    outcome = deployer(fake, ManualClock()).set_replicas(ScaleRequest("chat", 4, idempotency_key="k"))
    assert outcome.status is OutcomeStatus.SUCCEEDED
    assert len(fake.calls("create", "events")) == 1  # one try, never retried


def test_metric_target(fake: FakeKubernetes) -> None:
    actuator = deployer(fake, ManualClock())
    outcome = actuator.set_metric_target("chat", "vllm:num_requests_waiting", "3", idempotency_key="m1")
    assert outcome.status is OutcomeStatus.SUCCEEDED, outcome
    metrics = spec(fake)["spec"]["metrics"]  # type: ignore[index]
    assert metrics[0]["pods"]["target"]["averageValue"] == "3"
    unknown = actuator.set_metric_target("chat", "nope", "3", idempotency_key="m2")
    assert unknown.status is OutcomeStatus.FAILED and "no Pods or External metric named 'nope'" in (unknown.error or "")


def test_cluster_api_client_has_no_urllib3_retries(tmp_path: Path) -> None:
    kubeconfig = tmp_path / "config"
    kubeconfig.write_text(
        "apiVersion: v1\nkind: Config\ncurrent-context: x\n"
        "clusters: [{name: c, cluster: {server: 'http://127.0.0.1:1'}}]\n"
        "users: [{name: u, user: {token: t}}]\ncontexts: [{name: x, context: {cluster: c, user: u}}]\n"
    )
    api = cluster_api_client(in_cluster=False, kubeconfig=str(kubeconfig))
    assert api.configuration.host == "http://127.0.0.1:1"
    assert api.configuration.retries == 0
