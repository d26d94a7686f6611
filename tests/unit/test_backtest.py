"""The backtest over scripted range results: merging, open incidents, actions not executed, CLI errors."""

from __future__ import annotations

import socket
from pathlib import Path

import pytest

from tailguard.controller.core.model import target_key
from tailguard.controller.core.policy import Policy
from tailguard.controller.core.ports import RangeResult
from tailguard.controller.core.signals import render_signal_queries
from tailguard.controller.kit.cli_args import parse_time
from tailguard.controller.testing import FakeSource
from tailguard.controller.tools.backtest import backtest_main, evaluation_times, run_backtest

RULES = Path(__file__).resolve().parents[2] / "rules" / "examples" / "p99-rollback.yaml"
A = target_key({"service": "a"})
B = target_key({"service": "b"})


def _policy(cooldown: str = "10m") -> Policy:
    return Policy.model_validate(
        {
            "apiVersion": "tailguard.io/v1alpha1",
            "kind": "Policy",
            "name": "p99",
            "interval": "15s",
            "targets": {"groupBy": ["service"]},
            "signals": [{"name": "p99", "query": "q"}],
            "conditions": [
                {
                    "name": "slow",
                    "signal": "p99",
                    "when": {"op": ">", "value": 0.8},
                    "for": 2,
                    "noData": "hold",
                    "actions": [{"type": "rollback"}],
                    "recovery": {"for": 1, "actions": [{"type": "annotate", "text": "ok {{ service }}"}]},
                }
            ],
            "limits": {"cooldown": cooldown},
        }
    )


def _source(series: dict[tuple[tuple[str, str], ...], dict[float, float]]) -> FakeSource:
    return FakeSource(range_answers={render_signal_queries(_policy())["p99"]: RangeResult(series)})


def test_fire_and_resolve_merge_into_one_entry_and_open_incidents_have_null_resolved_at() -> None:
    a = {0.0: 0.1, 15.0: 1.0, 30.0: 1.0, 45.0: 0.2, 60.0: 0.2}
    b = {0.0: 0.1, 15.0: 0.1, 30.0: 2.0, 45.0: 2.0, 60.0: 2.0}
    source = _source({A: a, B: b})
    report = run_backtest(source, [_policy()], 0.0, 60.0, None)
    assert len(source.sent) == 1 and source.sent[0].step == 15.0  # step defaults to the interval
    assert report.evaluations == 5
    out = report.to_json()
    first, second = out["decisions"]
    assert (first["target"], first["onset"], first["fired_at"], first["resolved_at"]) == (
        {"service": "a"},
        15.0,
        30.0,
        45.0,
    )
    assert [(x["type"], x["on"], x["executed"]) for x in first["actions"]] == [
        ("rollback", "fire", False),
        ("annotate", "resolve", False),
    ]
    assert first["actions"][1]["params"]["text"] == "ok a"
    assert (second["target"], second["onset"], second["fired_at"], second["resolved_at"]) == (
        {"service": "b"},
        30.0,
        45.0,
        None,
    )
    assert "still firing" in report.to_markdown()


def test_suppressed_then_fired_is_one_entry() -> None:
    # a fires at 30, recovers at 45, breaches again from 60: the 10m cooldown suppresses the second rollback.
    a = {t * 15.0: v for t, v in enumerate([0.1, 1.0, 1.0, 0.2, 1.0, 1.0, 1.0])}
    report = run_backtest(_source({A: a}), [_policy()], 0.0, 90.0, 15.0)
    entries = report.to_json()["decisions"]
    assert [e["kinds"] for e in entries] == [["fire", "resolve"], ["suppressed"]]
    assert entries[1]["fired_at"] is None and entries[1]["suppressed_at"] == 75.0


def test_source_errors_are_reported_and_never_fire() -> None:
    source = FakeSource(range_answers={render_signal_queries(_policy())["p99"]: RangeResult(error="HTTP 400")})
    report = run_backtest(source, [_policy()], 0.0, 60.0, None)
    assert report.signal_errors == ["p99/p99: HTTP 400"]
    assert all(e.fired_at is None for e in report.decisions)


def test_evaluation_times_are_on_the_step_grid() -> None:
    assert evaluation_times(0.0, 45.0, 15.0) == [0.0, 15.0, 30.0, 45.0]
    assert evaluation_times(0.5, 1.0, 0.25) == [0.5, 0.75, 1.0]


def test_parse_time() -> None:
    assert parse_time("1700000000", "--start") == 1700000000.0
    assert parse_time("2023-11-14T22:13:20Z", "--start") == 1700000000.0
    with pytest.raises(ValueError, match="--end: expected epoch seconds or an RFC3339"):
        parse_time("yesterday", "--end")
    with pytest.raises(ValueError, match="needs a timezone"):
        parse_time("2023-11-14T22:13:20", "--end")


def test_cli_bad_time_exits_2_without_traceback(capsys: pytest.CaptureFixture[str]) -> None:
    code = backtest_main(
        [
            "--prometheus",
            "http://127.0.0.1:1",
            "--rules",
            str(RULES),
            "--start",
            "soon",
            "--end",
            "1700000000",
        ]
    )
    assert code == 2
    err = capsys.readouterr().err
    assert "--start: expected epoch seconds or an RFC3339 time" in err and "Traceback" not in err


def test_cli_unreachable_prometheus_exits_2(capsys: pytest.CaptureFixture[str]) -> None:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    code = backtest_main(
        [
            "--prometheus",
            f"http://127.0.0.1:{port}",
            "--rules",
            str(RULES),
            "--start",
            "1700000000",
            "--end",
            "1700003600",
            "--timeout",
            "1",
        ]
    )
    assert code == 2
    assert "Prometheus is not usable" in capsys.readouterr().err


def test_cli_bad_rules_exit_2(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    (tmp_path / "bad.yaml").write_text("apiVersion: tailguard.io/v1alpha1\nkind: Policy\nname: x\n")
    code = backtest_main(
        [
            "--prometheus",
            "http://127.0.0.1:1",
            "--rules",
            str(tmp_path),
            "--start",
            "1700000000",
            "--end",
            "1700003600",
        ]
    )
    assert code == 2
    assert "bad.yaml:" in capsys.readouterr().err


def test_cli_missing_argument_exits_2() -> None:
    assert backtest_main(["--rules", str(RULES)]) == 2


def test_a_policy_that_matched_no_series_is_named_not_reported_as_quiet() -> None:
    """'0 incidents' from a policy that saw nothing is a warning with '0 targets ever seen', per policy and per
    condition; a policy that watched healthy targets says how many it saw."""
    healthy = _policy()
    blind = Policy.model_validate({**healthy.model_dump(by_alias=True, exclude_none=True), "name": "blind"})
    source = FakeSource(
        range_answers={
            render_signal_queries(healthy)["p99"]: [RangeResult({A: {0.0: 0.1, 15.0: 0.2}, B: {15.0: 0.3}}),
                                                   RangeResult({})],  # the second policy's identical query: empty
        }
    )  # fmt: skip
    report = run_backtest(source, [healthy, blind], 0.0, 30.0, None)
    assert report.decisions == []
    assert report.targets_seen == {"p99": {"*": 2, "slow": 2}, "blind": {"*": 0, "slow": 0}}
    (warning,) = report.warnings
    assert warning.startswith("blind: matched no series in the window (0 targets ever seen)")
    markdown = report.to_markdown()
    assert "| blind | (any signal) | 0 |" in markdown and "WARNING: blind: matched no series" in markdown
    assert report.to_json()["targets_seen"]["p99"]["slow"] == 2
