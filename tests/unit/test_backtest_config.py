"""The backtest's inputs beyond the policies (issue 12 item 6): `--config CONTROLLER_YAML` (its Prometheus,
policies, global limits, dryRun and change sources, read by the app), the change tracker port feeding attribution,
recorded alerts (`--alerts FILE`) and the CLI's refusals."""

from __future__ import annotations

import json
import socket
from pathlib import Path

import pytest

from tailguard.controller.adapters.changes.tracker import ChangeTracker
from tailguard.controller.app.ml_commands import backtest_config
from tailguard.controller.app.ml_commands import backtest_main as app_backtest_main
from tailguard.controller.core.actions import ActionType
from tailguard.controller.core.attribution import Rollout
from tailguard.controller.core.model import target_key
from tailguard.controller.core.policy_files import load_policies
from tailguard.controller.core.ports import RangeResult
from tailguard.controller.core.signals import render_signal_queries
from tailguard.controller.kit.cli_args import UsageError
from tailguard.controller.testing import FakeChangeTracker, FakeSource
from tailguard.controller.tools.backtest import backtest_main, evaluation_times, run_backtest
from tailguard.controller.tools.backtest_world import load_alerts

EXAMPLES = Path(__file__).resolve().parents[2] / "rules" / "examples"
T0 = 1_700_000_000.0
CHAT = target_key({"service": "chat"})


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


def _config(tmp_path: Path, port: int, extra: str = "") -> Path:
    path = tmp_path / "controller.yaml"
    path.write_text(
        f"prometheus: {{url: 'http://127.0.0.1:{port}'}}\n"
        f"policies: ['{EXAMPLES / 'p99-rollback.yaml'}']\n"
        "tier: {url: 'http://127.0.0.1:1'}\n"
        "changeTracking: {sources: [tier], window: 30m}\n"
        "limits: {cooldown: 2m, maxActionsPerHour: 4, precedence: [rollback, scale]}\n"
        "dryRun: true\n" + extra
    )
    return path


def test_the_config_gives_limits_policies_prometheus_dry_run_and_the_change_tracker(tmp_path: Path) -> None:
    configured = backtest_config(str(_config(tmp_path, 9090)))
    assert configured.prometheus.url == "http://127.0.0.1:9090"
    assert configured.policies == (str(EXAMPLES / "p99-rollback.yaml"),)
    assert configured.limits.cooldown == 120.0 and configured.limits.maxActionsPerHour == 4
    assert configured.limits.precedence == (ActionType.ROLLBACK, ActionType.SCALE)
    assert configured.dry_run is True
    assert isinstance(configured.change_tracker, ChangeTracker) and configured.change_window == 1800.0


def test_an_unusable_config_is_a_usage_error_naming_the_file(tmp_path: Path) -> None:
    bad = tmp_path / "bad.yaml"
    bad.write_text(
        "prometheus: {url: 'http://127.0.0.1:9090'}\npolicies: [x.yaml]\nchangeTracking: {sources: [argocd]}\n"
    )
    with pytest.raises(UsageError, match=r"--config .*bad.yaml: .*argocd"):
        backtest_config(str(bad))


def test_the_cli_takes_prometheus_and_rules_from_the_config(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    port = _free_port()
    code = app_backtest_main(["--config", str(_config(tmp_path, port)), "--start", str(T0), "--end", str(T0 + 60)])
    assert code == 2
    err = capsys.readouterr().err
    assert "Prometheus is not usable" in err and "Traceback" not in err  # it went on to the configured URL


def test_the_cli_needs_prometheus_or_a_config_and_refuses_a_config_it_cannot_read(
    capsys: pytest.CaptureFixture[str],
) -> None:
    assert backtest_main(["--rules", str(EXAMPLES), "--start", str(T0), "--end", str(T0 + 60)]) == 2
    assert "--prometheus URL is required (or --config CONTROLLER_YAML)" in capsys.readouterr().err
    args = ["--config", "controller.yaml", "--start", str(T0), "--end", str(T0 + 60)]
    assert backtest_main(args) == 2  # the tools' entry point has no configuration reader: the app's has
    assert "this entry point cannot read a controller configuration" in capsys.readouterr().err


def test_a_bad_alert_file_is_a_usage_error(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    alerts = tmp_path / "alerts.json"
    alerts.write_text(json.dumps([{"labels": {"service": "chat"}}]))
    args = ["--prometheus", "http://127.0.0.1:1", "--rules", str(EXAMPLES), "--alerts", str(alerts)]
    assert backtest_main([*args, "--start", str(T0), "--end", str(T0 + 60)]) == 2
    assert "expected {at, labels} or an Alertmanager payload" in capsys.readouterr().err


def test_alertmanager_payloads_arrive_at_their_time_or_their_alerts_start_and_end(tmp_path: Path) -> None:
    payload = {
        "version": "4",
        "status": "firing",
        "alerts": [
            {"status": "firing", "labels": {"service": "chat"}, "startsAt": "2023-11-14T22:13:30Z"},
            {"status": "resolved", "labels": {"service": "code"}, "endsAt": "2023-11-14T22:13:40.5Z"},
        ],
    }
    path = tmp_path / "alerts.json"
    path.write_text(json.dumps([payload, {**payload, "at": T0 + 5}, {"at": "2023-11-14T22:13:21Z", "labels": {}}]))
    assert [(a.at, dict(a.labels)) for a in load_alerts(str(path))] == [
        (T0 + 1, {}),
        (T0 + 5, {"service": "chat"}),
        (T0 + 5, {"service": "code"}),
        (T0 + 10, {"service": "chat"}),
        (T0 + 20.5, {"service": "code"}),
    ]


def test_the_change_tracker_port_feeds_attribution_and_its_errors_are_reported() -> None:
    """The configured change sources, read once for the window through the port: an attributed rollback comes out
    as a rollback; a rollout after the evaluation's time is not known then; a failing source is reported."""
    loaded, errors = load_policies([EXAMPLES / "attributed-rollback-or-scale.yaml"])
    assert not errors
    policy = loaded[0].policy.model_copy(update={"dryRun": False})
    times = evaluation_times(T0, T0 + 600, policy.interval)
    history = RangeResult({CHAT: {t: 2.0 if t >= T0 + 120 else 0.2 for t in times}})
    source = FakeSource(range_answers=dict.fromkeys(render_signal_queries(policy).values(), history))
    rollout = Rollout({"service": "chat", "namespace": "llm"}, "rev-2", "rev-1", T0 + 100, "argocd")
    tracker = FakeChangeTracker([rollout])
    report = run_backtest(source, [policy], T0, T0 + 600, None, change_tracker=tracker)
    assert len(tracker.asked) == 1 and tracker.asked[0] < T0  # once, from the largest attribution window
    types = [action.type for entry in report.decisions for _kind, action in entry.actions]
    assert ActionType.ROLLBACK in types and report.signal_errors == []

    later = FakeChangeTracker([Rollout(rollout.labels, "rev-2", "rev-1", T0 + 700, "argocd")], errors=("argocd: 503",))
    report = run_backtest(source, [policy], T0, T0 + 600, None, change_tracker=later)
    assert ActionType.ROLLBACK not in [a.type for e in report.decisions for _k, a in e.actions]
    assert report.signal_errors == ["change tracking: argocd: 503"]
