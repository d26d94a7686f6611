"""Real Prometheus (backfilled) -> controller evaluation -> breach attributed to an Argo CD rollout -> Argo CD
rollback on the swagger-validating fake; and, when the change source fails, "unknown" -> no rollback."""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

import pytest

from tailguard.controller.adapters.argocd.client import ArgoCDClient
from tailguard.controller.adapters.argocd.settings import ArgoCDApp
from tailguard.controller.adapters.changes.tracker import ArgoCDHistorySource, ChangeTracker
from tailguard.controller.adapters.metrics.prometheus import PrometheusSettings, PrometheusSource
from tailguard.controller.adapters.rollback.argocd import ArgoCDRollback
from tailguard.controller.adapters.stores.journal import Journal
from tailguard.controller.core.attribution import AttributedDecision, AttributionStatus
from tailguard.controller.core.model import DecisionKind
from tailguard.controller.core.policy import Policy
from tailguard.controller.core.ports import MetricsSource
from tailguard.controller.core.signals import query_signals
from tailguard.controller.kit.clock import ManualClock
from tailguard.controller.loop.dispatcher import Actuators, Dispatcher, GlobalLimits
from tailguard.controller.loop.evaluation import EvaluationOutcome
from tailguard.controller.loop.runtime import Controller
from tailguard.controller.testing import FakeNotifier
from tests.conftest import BackfilledPrometheus
from tests.support.fake_argocd import FakeArgoCD, application
from tests.support.scenarios import REGRESSION_START, T0

pytestmark = pytest.mark.integration

TOKEN = "argocd-test-token"
POLICY = """apiVersion: tailguard.io/v1alpha1
kind: Policy
name: attributed
interval: 15s
targets:
  groupBy: [service]
  match: {namespace: llm}
signals:
  - name: p99
    query: >-
      histogram_quantile(0.99,
        sum by (le, {{ by }}) (rate(vllm:e2e_request_latency_seconds_bucket{ {{ selector }} }[1m])))
conditions:
  - name: p99-high
    signal: p99
    when: {op: ">", value: 0.8}
    for: 2
    noData: hold
    attribution: {window: 30m, labels: [service]}
    choose:
      - name: rollback-the-rollout
        if: {attributedToRollout: true}
        actions: [{type: rollback, service: "{{ service }}"}]
      - name: notify
        actions: [{type: notify, receiver: oncall, message: "{{ branch }}"}]
limits: {cooldown: 0s, maxActionsPerHour: 10}
"""
ROLLOUT_AT = REGRESSION_START - 90  # the bad config went out 90 s before the latency rose


@pytest.fixture
def fake_argocd() -> Iterator[FakeArgoCD]:
    with FakeArgoCD() as fake:
        fake.state.token = TOKEN
        fake.add_app(
            application(
                "llm-regress",
                [("good1", T0 - 7200), ("bad2", ROLLOUT_AT)],
                helm_parameters={"good1": [("maxNumSeqs", "64")], "bad2": [("maxNumSeqs", "2")]},
            )
        )
        yield fake
    assert fake.state.spec_violations == []


def run_until_fire(
    tmp_path: Path, prometheus_url: str, fake: FakeArgoCD, tracker_token: str
) -> tuple[EvaluationOutcome, Journal, FakeNotifier]:
    (tmp_path / "policies").mkdir()
    (tmp_path / "policies" / "attributed.yaml").write_text(POLICY, encoding="utf-8")
    clock = ManualClock(REGRESSION_START - 30)
    apps = {"regress": ArgoCDApp(name="llm-regress")}
    deployer_client = ArgoCDClient(fake.url, clock=clock, token=lambda: TOKEN, timeout=5, retries=2)
    journal = Journal(tmp_path / "journal.db")
    deployer = ArgoCDRollback(deployer_client, apps, clock=clock, wait_timeout=120, poll_interval=5)
    tracker_client = ArgoCDClient(fake.url, clock=clock, token=lambda: tracker_token, timeout=5, retries=1)
    tracker = ChangeTracker([ArgoCDHistorySource(tracker_client, apps)])
    notifier = FakeNotifier()
    dispatcher = Dispatcher(journal, Actuators(rollback=deployer, notifier=notifier), clock, GlobalLimits())
    source = PrometheusSource(PrometheusSettings(url=prometheus_url, timeout=5, retries=1), clock)

    def at_clock(metrics: MetricsSource, policy: Policy, _at: float | None) -> Mapping[str, Any]:
        # The backfilled history lies in the past: evaluate "now" as the manual clock says.
        return query_signals(metrics, policy, clock.now())

    controller = Controller(
        policy_paths=[tmp_path / "policies"],
        source=source,
        journal=journal,
        dispatcher=dispatcher,
        clock=clock,
        query_signals=at_clock,
        schedule=False,
        change_tracker=tracker,
        change_window=600,
    )
    controller.start()
    try:
        for _ in range(20):
            outcome = controller.evaluate("attributed")
            assert outcome is not None
            if any(d.kind is DecisionKind.FIRE for d in outcome.decisions):
                return outcome, journal, notifier
            clock.advance(15)
        pytest.fail("the regression never fired")
    finally:
        controller.stop()


def test_breach_attributed_to_the_argocd_rollout_is_rolled_back_on_argocd(
    tmp_path: Path, backfilled_prometheus: BackfilledPrometheus, fake_argocd: FakeArgoCD
) -> None:
    outcome, _journal, notifier = run_until_fire(tmp_path, backfilled_prometheus.url, fake_argocd, TOKEN)
    fired = {dict(d.target)["service"]: d for d in outcome.decisions if d.kind is DecisionKind.FIRE}
    decision = fired["regress"]
    assert isinstance(decision, AttributedDecision)
    assert decision.attribution is not None and decision.attribution.rollout is not None
    assert decision.attribution.rollout.revision == "bad2"
    assert decision.attribution.rollout.diff == {"maxNumSeqs": {"from": "64", "to": "2"}}
    assert decision.branch is not None and decision.branch.name == "rollback-the-rollout"
    assert "attributed to rollout bad2 (maxNumSeqs 64 -> 2)" in decision.reason
    # Exactly one rollback, to the history entry before the attributed rollout, validated against the swagger.
    posts = [call.body for call in fake_argocd.calls("POST", "/rollback")]
    assert posts == [{"name": "llm-regress", "id": 1, "dryRun": False, "prune": False}]
    assert fake_argocd.app("llm-regress")["status"]["sync"]["revision"] == "good1"
    with Journal(tmp_path / "journal.db") as reopened:  # the controller closed its own on stop
        (record,) = reopened.actions_for(decision.id)
        stored = reopened.decision(decision.id, "fire")
    assert record.status.value == "succeeded"
    assert stored is not None and stored["attribution"]["rollout"]["revision"] == "bad2"
    # "gap" regressed at the same time without any rollout: not attributed, so a human is notified instead.
    gap = fired["gap"]
    assert isinstance(gap, AttributedDecision) and gap.branch is not None and gap.branch.name == "notify"
    assert gap.attribution is not None and gap.attribution.status is AttributionStatus.NONE
    assert [call.args["receiver"] for call in notifier.calls] == ["oncall"]


def test_change_source_error_makes_attribution_unknown_and_does_not_roll_back(
    tmp_path: Path, backfilled_prometheus: BackfilledPrometheus, fake_argocd: FakeArgoCD
) -> None:
    outcome, _journal, notifier = run_until_fire(tmp_path, backfilled_prometheus.url, fake_argocd, "wrong-token")
    decision = next(
        d for d in outcome.decisions if d.kind is DecisionKind.FIRE and dict(d.target)["service"] == "regress"
    )
    assert isinstance(decision, AttributedDecision) and decision.attribution is not None
    assert decision.attribution.status is AttributionStatus.UNKNOWN
    assert decision.attribution.reason.startswith("unknown (change source error: argocd:")
    assert any(error.startswith("change tracking: argocd:") for error in outcome.source_errors)
    assert decision.branch is not None and decision.branch.name == "notify"
    assert fake_argocd.calls("POST", "/rollback") == []
    assert len(notifier.calls) == len([d for d in outcome.decisions if d.kind is DecisionKind.FIRE])
