"""Backtest against a real Prometheus backfilled with promtool (tests/support/scenarios.py)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from tailguard.controller.adapters.metrics.prometheus import PrometheusSettings, PrometheusSource
from tailguard.controller.core.policy import Policy
from tailguard.controller.core.policy_files import load_policies
from tailguard.controller.kit.clock import ManualClock
from tailguard.controller.tools.backtest import BacktestReport, backtest_main, run_backtest
from tests.conftest import BackfilledPrometheus
from tests.support.scenarios import T0

pytestmark = pytest.mark.integration

RULES = Path(__file__).resolve().parents[2] / "rules" / "examples" / "p99-rollback.yaml"


def _policy() -> Policy:
    loaded, errors = load_policies([RULES])
    assert not errors
    return loaded[0].policy


@pytest.fixture(scope="module")
def report(backfilled_prometheus: BackfilledPrometheus) -> BacktestReport:
    with PrometheusSource(PrometheusSettings(url=backfilled_prometheus.url), ManualClock()) as source:
        return run_backtest(source, [_policy()], T0 + 60, T0 + 3600, None)


def _entries(report: BacktestReport, service: str, *, escalations: bool = False) -> list[dict[str, Any]]:
    """The policy's decisions on `service` (with `escalations`: its incident's escalation steps instead)."""
    return [
        entry.to_json()
        for entry in report.decisions
        if entry.to_json()["target"] == {"service": service} and entry.policy_fired != escalations
    ]


def test_a_regression_the_rollback_did_not_end_escalates_once_as_live(report: BacktestReport) -> None:
    """The history does not react to the rollback (T0+1230): P99 stays high until T0+1800, so the incident moves
    to its ladder's first step (notify on-call) at the first evaluation 5 minutes after it, once."""
    (step,) = _entries(report, "regress", escalations=True)
    assert step["fired_at"] == T0 + 1530 and step["incident"] == "regress-1700001230"
    assert [(a["type"], a["params"].get("receiver")) for a in step["actions"]] == [("notify", "oncall"),
                                                                                  ("annotate", None)]  # fmt: skip
    assert step["reason"] == (
        "incident regress-1700001230 on regress: rollback succeeded did not end the breach within 300s; escalation "
        "step 1 (notify-oncall, severity critical); next: a human"
    )


def test_regression_fires_after_three_breaching_evaluations_and_resolves_after_two_healthy(
    report: BacktestReport,
) -> None:
    (entry,) = _entries(report, "regress")
    # Slow requests start at T0+1200: the first 1m-rate window that holds them is evaluated at T0+1200.
    assert entry["onset"] == T0 + 1200
    assert entry["fired_at"] == T0 + 1230  # `for: 3` at a 15 s interval
    # Last slow step T0+1800; the window [t-60s, t] is clean from T0+1860, and recovery needs 2 evaluations.
    assert entry["resolved_at"] == T0 + 1875
    assert entry["kinds"] == ["fire", "resolve"]
    assert entry["peak"] is not None and 1.0 < entry["peak"] <= 1.5  # P99 inside the (1.0, 1.5] bucket
    fire_actions = [a for a in entry["actions"] if a["on"] == "fire"]
    assert [a["type"] for a in fire_actions] == ["annotate", "rollback"]
    assert fire_actions[1]["params"]["service"] == "regress"
    assert all(a["executed"] is False for a in entry["actions"])
    assert [a["type"] for a in entry["actions"] if a["on"] == "resolve"] == ["annotate"]


def test_noisy_but_healthy_series_never_fires(report: BacktestReport) -> None:
    assert _entries(report, "noisy") == []


def test_gap_in_data_neither_resolves_nor_refires_a_firing_regression(report: BacktestReport) -> None:
    (entry,) = _entries(report, "gap")
    assert entry["onset"] == T0 + 1200
    assert entry["fired_at"] == T0 + 1230
    # No samples from T0+1515 to T0+1755: absence is not recovery. Healthy data returns at T0+1770,
    # the first rate over two healthy samples is at T0+1785, and recovery needs two evaluations.
    assert entry["resolved_at"] == T0 + 1800
    assert entry["kinds"] == ["fire", "resolve"]


def test_evaluation_count_and_no_signal_errors(report: BacktestReport) -> None:
    assert report.evaluations == (3600 - 60) // 15 + 1
    assert report.signal_errors == []


def test_cli_prints_the_decisions_as_json(
    backfilled_prometheus: BackfilledPrometheus, capsys: pytest.CaptureFixture[str]
) -> None:
    code = backtest_main(
        [
            "--prometheus",
            backfilled_prometheus.url,
            "--rules",
            str(RULES),
            "--start",
            str(T0 + 60),
            "--end",
            "2023-11-14T23:13:20Z",
            "--step",
            "15s",
            "--output",
            "json",
        ]
    )
    assert code == 0
    out = json.loads(capsys.readouterr().out)
    assert set(out) >= {"decisions", "evaluations"}
    assert out["evaluations"] == (3600 - 60) // 15 + 1
    assert {tuple(sorted(d["target"].items())) for d in out["decisions"]} == {
        (("service", "gap"),),
        (("service", "regress"),),
    }
    for decision in out["decisions"]:
        assert set(decision) >= {
            "policy",
            "condition",
            "target",
            "onset",
            "fired_at",
            "resolved_at",
            "actions",
        }
        assert decision["policy"] == "p99-rollback"
        assert decision["condition"] == "p99-above-800ms"
        assert isinstance(decision["onset"], float)
        assert all(action["executed"] is False for action in decision["actions"])


def test_cli_markdown_table(backfilled_prometheus: BackfilledPrometheus, capsys: pytest.CaptureFixture[str]) -> None:
    code = backtest_main(
        [
            "--prometheus",
            backfilled_prometheus.url,
            "--rules",
            str(RULES),
            "--start",
            str(T0 + 60),
            "--end",
            str(T0 + 3600),
            "--output",
            "markdown",
        ]
    )
    assert code == 0
    out = capsys.readouterr().out
    assert '| p99-rollback | p99-above-800ms | {service="regress"} | 2023-11-14T22:33:20Z |' in out


def test_cli_warns_about_a_blind_policy_and_strict_fails(
    backfilled_prometheus: BackfilledPrometheus, capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    """The same policy with a misspelt metric matches no series: the report says '0 targets ever seen' beside the
    real policy's count, the warning goes to stderr, and --strict exits 3."""
    blind = RULES.read_text().replace("name: p99-rollback", "name: p99-typo", 1)
    assert "_bucket" in blind
    (tmp_path / "typo.yaml").write_text(blind.replace("_bucket", "_buckets"))
    common = ["--prometheus", backfilled_prometheus.url, "--rules", str(RULES), "--rules", str(tmp_path / "typo.yaml"),
              "--start", str(T0 + 60), "--end", str(T0 + 3600), "--output", "json"]  # fmt: skip
    assert backtest_main(common) == 0
    captured = capsys.readouterr()
    out = json.loads(captured.out)
    assert out["targets_seen"]["p99-typo"] == {"*": 0, "p99-above-800ms": 0}
    assert out["targets_seen"]["p99-rollback"]["*"] >= 2
    assert "warning: p99-typo: matched no series in the window (0 targets ever seen)" in captured.err
    assert backtest_main([*common, "--strict"]) == 3


def test_report_plots_a_journaled_incident_from_prometheus(
    backfilled_prometheus: BackfilledPrometheus, tmp_path: Path
) -> None:
    """`tailguard report --config`: the series of the policy's own query around the journaled incident, for its
    target, from the configuration's Prometheus (here the backfilled regression of service=regress)."""
    from tailguard.controller.adapters.stores.journal import Journal
    from tailguard.controller.app import cli
    from tailguard.controller.core.model import SignalResult, target_key
    from tailguard.controller.loop.dispatcher import Actuators, Dispatcher, GlobalLimits
    from tailguard.controller.loop.runtime import Controller
    from tailguard.controller.testing import FakeRollback, FakeSource

    regress = target_key({"service": "regress"})
    journal = Journal(tmp_path / "journal.db")
    clock = ManualClock(T0 + 1260)
    source = FakeSource()
    dispatcher = Dispatcher(journal, Actuators(rollback=FakeRollback({"regress": 2})), clock, GlobalLimits())
    controller = Controller(policy_paths=[RULES], source=source, journal=journal, dispatcher=dispatcher, clock=clock,
                            schedule=False, controls_store=journal)  # fmt: skip
    controller.start()
    try:
        for value in (1.2, 1.2, 1.2, 1.2, 0.2, 0.2, 0.2):
            source.default = SignalResult({regress: value})
            controller.evaluate("p99-rollback")
            clock.advance(15.0)
        (fire,) = [d for d in controller.recent_decisions(20) if d["kind"] == "fire"]
    finally:
        controller.stop()
    config = tmp_path / "controller.yaml"
    config.write_text(
        f"prometheus: {{url: {backfilled_prometheus.url}}}\npolicies: [{RULES}]\njournal: {tmp_path / 'j.db'}\n"
        f"stateDir: {tmp_path / 'state'}\n"
    )
    out = tmp_path / "report"
    argv = ["report", "--decision", fire["id"], "--journal", str(tmp_path / "journal.db"), "--config", str(config),
            "--out", str(out)]  # fmt: skip
    assert cli.main(argv) == 0
    document = json.loads((out / "incident.json").read_text())
    values = [value for _, value in document["series"]]
    assert len(values) > 50 and max(values) > 1.0 and min(values) < 0.5  # the slow stretch and around it
    assert document["series"][0][0] <= fire["onset"] - 590  # from ten minutes before the onset
    assert "p99-e2e-latency above 800 ms" in (out / "incident.md").read_text()
