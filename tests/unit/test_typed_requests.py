"""One typed request per actuator port (issue 26 item 2): every RollbackPort takes a `RollbackRequest` carrying its
typed `RollbackPlan`, every ScalePort a `ScaleRequest`; the dispatcher knows no actuator's vocabulary (each scale
port names the fields it sets); and plans journaled before the change (at b6be7ee) are still read, key for key."""

from __future__ import annotations

import inspect
import json
from pathlib import Path
from typing import Any

import pytest

from tailguard.controller.adapters.notify.webhook import WebhookNotifier
from tailguard.controller.adapters.rollback.argocd import ArgoCDRollback
from tailguard.controller.adapters.rollback.deployment import DeploymentRollback
from tailguard.controller.adapters.scale.hpa import HpaScaler
from tailguard.controller.adapters.stores.journal import Journal
from tailguard.controller.adapters.tier.local_tier import LocalTierClient
from tailguard.controller.adapters.traffic.routes import HttpRouteRouter, VirtualServiceRouter
from tailguard.controller.core.actions import ActionStatus
from tailguard.controller.core.ports import (
    NoticePayload,
    NotifyPayload,
    NotifyRequest,
    RollbackPlan,
    RollbackRequest,
    ScaleLimits,
    ScaleRequest,
    ScaleState,
)
from tailguard.controller.core.unconfigured import (
    UnconfiguredNotifier,
    UnconfiguredRollback,
    UnconfiguredRouter,
    UnconfiguredScale,
    UnconfiguredScaleLimits,
)
from tailguard.controller.kit.clock import ManualClock
from tailguard.controller.loop.dispatcher import Actuators, Dispatcher, GlobalLimits
from tailguard.controller.loop.incident_ports import IncidentRollback, IncidentRouter, IncidentScale
from tailguard.controller.testing import FakeNotifier, FakeRollback, FakeRouter, FakeScaler, make_decision
from tailguard.controller.tools.backtest_world import WouldRun

ROLLBACK_PORTS = [
    ArgoCDRollback,
    DeploymentRollback,
    LocalTierClient,
    UnconfiguredRollback,
    FakeRollback,
    WouldRun,
    IncidentRollback,
]
TRAFFIC_PORTS = [HttpRouteRouter, VirtualServiceRouter, LocalTierClient, UnconfiguredRouter, FakeRouter, WouldRun]
TRAFFIC_PORTS += [IncidentRouter]
NOTIFY_PORTS = [WebhookNotifier, UnconfiguredNotifier, FakeNotifier, WouldRun]
SCALE_PORTS = [HpaScaler, LocalTierClient, UnconfiguredScale, FakeScaler, WouldRun, IncidentScale]

# Plans as b6be7ee journaled them (Journal.set_plan), one per rollback adapter, with the dispatcher's times.
OLD_ROWS: list[dict[str, Any]] = [
    {  # Argo CD
        "service": "web",
        "application": "llm-web",
        "from_revision": "r3",
        "bad_revision": "r3",
        "to_revision": "r1",
        "history_id": 1,
        "from_deployed_at": 1767236000.0,
        "decided_at": 1767236400.0,
        "deadline": 1767236445.0,
    },
    {  # a Deployment under Helm
        "service": "chat",
        "deployment": "Deployment default/chat",
        "from_revision": 3,
        "from_hash": "7d9f",
        "bad_revision": 3,
        "bad_hash": "7d9f",
        "from_deployed_at": 1767236000.5,
        "helm": {"release": "chat", "history_differs": True, "note": "Helm owns this Deployment"},
        "to_revision": 2,
        "to_hash": "5c4b",
        "decided_at": 1767236400.0,
        "deadline": 1767236700.0,
    },
    {"service": "chat", "from_revision": 3, "to_revision": 2, "decided_at": 0.5, "deadline": 45.5},  # the tier
    {"service": "chat", "from_revision": None, "to_revision": None},  # the backtest's
]


@pytest.mark.parametrize("port", ROLLBACK_PORTS, ids=lambda port: port.__name__)
def test_every_rollback_port_takes_one_request(port: type) -> None:
    parameters = list(inspect.signature(port.rollback).parameters)
    assert parameters == ["self", "request", "abort"]
    assert "RollbackPlan" in str(inspect.signature(port.plan_rollback).return_annotation)


@pytest.mark.parametrize("port", SCALE_PORTS, ids=lambda port: port.__name__)
def test_every_scale_port_takes_one_request_and_names_its_own_target(port: type) -> None:
    assert list(inspect.signature(port.set_replicas).parameters) == ["self", "request"]
    if port is not IncidentScale:  # delegates to the port it wraps
        assert callable(port.scale_target)


def test_each_scale_port_answers_its_own_target_fields() -> None:
    assert HpaScaler.scale_target(object.__new__(HpaScaler), 4) == {"minReplicas": 4}
    assert FakeScaler().scale_target(4) == {"replicas": 4}
    assert UnconfiguredScale().scale_target(4) == {"replicas": 4}


def test_the_dispatcher_knows_no_actuator_vocabulary() -> None:
    loop = Path(__file__).resolve().parents[2] / "controller" / "loop"
    for name in ("dispatcher", "action_calls", "execution", "decision_planning", "deferral", "preconditions"):
        code = "\n".join(
            line for line in (loop / f"{name}.py").read_text().splitlines() if not line.strip().startswith("#")
        )
        for word in ('"minReplicas"', '"maxReplicas"', "kubernetes.hpa"):
            assert word not in code, (name, word)


@pytest.mark.parametrize("row", OLD_ROWS, ids=["argocd", "deployment-helm", "tier", "backtest"])
def test_a_plan_journaled_at_b6be7ee_is_read_and_written_back_key_for_key(row: dict[str, Any]) -> None:
    plan = RollbackPlan.from_json(json.loads(json.dumps(row)))
    assert plan.to_json() == row
    assert json.dumps(plan.to_json(), sort_keys=True) == json.dumps(row, sort_keys=True)


def test_an_unknown_key_in_a_plan_is_refused_not_dropped() -> None:
    with pytest.raises(ValueError, match="bogus"):
        RollbackPlan.from_json({"service": "chat", "to_revision": 2, "bogus": 1})


def test_scale_limits_keep_the_plan_shape() -> None:
    old = {"maxReplicas": 12, "metrics": {"vllm_queue": 8.0}}
    assert ScaleLimits.from_json(old).to_json() == old
    assert ScaleLimits.of_action({"ceiling": 12, "metricTargets": {"vllm_queue": 8}}).to_json() == old
    assert ScaleLimits.of_action({}).to_json() == {}
    refused = UnconfiguredScaleLimits().set_limits("chat", max_replicas=12, metric_targets={}, idempotency_key="k")
    assert (
        refused.error is not None
        and "kubernetes.hpa" in refused.error
        and refused.detail == {"limits": {"maxReplicas": 12}}
    )


def test_a_rollback_planned_and_started_at_b6be7ee_resumes_on_its_journaled_plan(tmp_path: Path) -> None:
    """A row the old code left `started` with a dict plan: the resume hands the port the typed plan, which acts
    on that plan (never a new target): the world already shows to_revision 2, so done without a second call."""
    clock = ManualClock(1000.0)
    journal = Journal(tmp_path / "j.db")
    deployer = FakeRollback({"chat": 3})
    decision = make_decision([("rollback", {"service": "chat"})], onset=clock.now())
    journal.record_decision(decision, clock.now())
    key = decision.actions[0].idempotency_key
    journal.set_plan(key, {"service": "chat", "from_revision": 3, "to_revision": 2, "decided_at": 1000.0,
                           "deadline": 1045.0}, clock.now())  # fmt: skip
    journal.mark_started(key, clock.now(), journal.get_action(key).plan)  # type: ignore[union-attr]
    deployer.active_revision["chat"] = 2  # the call went through before the crash
    dispatcher = Dispatcher(journal, Actuators(rollback=deployer), clock, GlobalLimits())
    (record,) = dispatcher.resume()
    assert record.status is ActionStatus.SUCCEEDED
    assert record.result is not None and record.result["detail"]["already_done"] is True
    assert record.plan == {"service": "chat", "from_revision": 3, "to_revision": 2, "decided_at": 1000.0,
                           "deadline": 1045.0}  # fmt: skip
    request = RollbackRequest("chat", "k", plan=RollbackPlan.from_json(record.plan))
    assert deployer.rollback(request).detail["already_done"] is True
    assert ScaleRequest("chat", 3, "k").replicas == 3
    journal.close()


def test_notification_bodies_keep_their_shape() -> None:
    """The webhook body is the payload's JSON plus receiver and key: a decision's five fields as b6be7ee sent them,
    and the Argo CD notice as `{"kind": "notice", "message": ..., **detail}`."""
    decision = {"id": "d1", "evidence": [[1.0, 1.2]], "at": 5.0}
    payload = NotifyPayload(message="m", decision=decision, evidence=decision["evidence"], actions=[{"type": "x"}])
    assert payload.to_json() == {
        "message": "m",
        "decision": decision,
        "evidence": [[1.0, 1.2]],
        "actions": [{"type": "x"}],
        "links": {},
    }
    assert NotifyPayload.from_json(payload.to_json()) == NotifyPayload(
        message="m", decision=decision, evidence=[[1.0, 1.2]], actions=[{"type": "x"}]
    )
    notice = NoticePayload("auto-sync disabled", {"application": "llm-web", "service": "web"})
    assert notice.to_json() == {"kind": "notice", "message": "auto-sync disabled", "application": "llm-web",
                                "service": "web"}  # fmt: skip
    assert NotifyRequest("oncall", notice, "k").payload is notice


@pytest.mark.parametrize(
    ("port", "method", "parameters"),
    [
        *[(port, "set_weight", ["self", "request", "abort"]) for port in TRAFFIC_PORTS],
        *[(port, "notify", ["self", "request"]) for port in NOTIFY_PORTS],
    ],
    ids=lambda value: getattr(value, "__name__", str(value)),
)
def test_every_traffic_and_notify_port_takes_one_request(port: type, method: str, parameters: list[str]) -> None:
    assert list(inspect.signature(getattr(port, method)).parameters) == parameters


@pytest.mark.parametrize(
    "row",
    [
        {"minReplicas": 2, "maxReplicas": 10, "metrics": {"vllm_queue": "8"}, "replicas": None},  # an HPA
        {"minReplicas": 4, "maxReplicas": 12, "metrics": {}, "replicas": 5},
        {"replicas": 3},  # the local tier
    ],
)
def test_a_scale_state_journaled_at_b6be7ee_is_read_key_for_key(row: dict[str, Any]) -> None:
    state = ScaleState.from_json(json.loads(json.dumps(row)))
    assert state.to_json() == row
    assert json.dumps(state.to_json(), sort_keys=True) == json.dumps(row, sort_keys=True)


def test_every_scale_port_answers_a_typed_state() -> None:
    for port in SCALE_PORTS:
        if port is not IncidentScale:  # delegates to the port it wraps
            assert inspect.signature(port.scale_state).return_annotation in ("ScaleState", ScaleState), port
        restore = inspect.signature(port.restore_scale).parameters
        assert str(restore["state"].annotation) == "ScaleState", port
