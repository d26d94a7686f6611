"""Issue 12 item 5: a query Prometheus refuses (bad data) is a POLICY error, found before and at run time.

`rules validate` parses every rendered query with promtool (file:line of the signal's query on an error); at run
time a refused query is listed on /readyz and counted in tailguard_policy_errors{policy}, never a breach; a hot
reload whose query is refused keeps that policy's last good version; an empty policy set is a reload error.
"""

from __future__ import annotations

import shutil
from pathlib import Path
from typing import Any

import pytest
from prometheus_client import CollectorRegistry

from tailguard.controller.adapters.stores.journal import Journal
from tailguard.controller.app import cli, query_check
from tailguard.controller.core.model import DecisionKind, SignalResult, target_key
from tailguard.controller.core.policy_files import load_policies, parse_policy_text
from tailguard.controller.core.ports import RangeResult
from tailguard.controller.core.signals import refused_queries, render_signal_queries
from tailguard.controller.kit.clock import ManualClock
from tailguard.controller.loop.metrics import ControllerMetrics
from tailguard.controller.loop.runtime import Controller
from tailguard.controller.testing import FakeDispatcher, FakeSource

BROKEN = "BROKEN("  # the fake source refuses any query holding it, as Prometheus refuses a syntax error

GOOD_QUERY = "histogram_quantile(0.99, sum by (le, {{ by }}) (rate(lat_bucket{ {{ selector }} }[1m])))"
BAD_QUERY = "histogram_quantile(0.99, sum by (le, {{ by }}) (rate(lat_bucket{ {{ selector }} }[1m]))"  # unclosed


def policy_yaml(name: str, query: str = GOOD_QUERY, threshold: float = 0.8) -> str:
    return f"""\
apiVersion: tailguard.io/v1alpha1
kind: Policy
name: {name}
interval: 15s
targets:
  groupBy: [service]
signals:
  - name: ok-signal
    query: sum by ({{{{ by }}}}) (up{{ {{{{ selector }}}} }})
  - name: p99
    query: "{query}"
conditions:
  - name: p99-high
    signal: p99
    when: {{op: ">", value: {threshold}}}
    for: 1
    noData: hold
    actions:
      - type: annotate
        text: "p99 {{{{ value }}}}"
"""


QUERY_LINE = 11  # the line of `query:` of signal p99 in policy_yaml


class RefusingSource(FakeSource):
    """A FakeSource that refuses, as bad data, every query holding BROKEN; others answer `values`."""

    def __init__(self, values: dict[Any, float] | None = None) -> None:
        super().__init__(default=SignalResult(values or {}))

    def instant(self, query: str, group_by: Any, at: float | None = None) -> SignalResult:
        if BROKEN in query:
            super().instant(query, group_by, at)
            return SignalResult.refused("prometheus query failed: HTTP 400: bad_data: parse error")
        return super().instant(query, group_by, at)


def make_controller(rules: Path, tmp_path: Path, source: Any, registry: CollectorRegistry) -> Controller:
    return Controller(
        policy_paths=[rules],
        source=source,
        journal=Journal(tmp_path / "journal.db"),
        dispatcher=FakeDispatcher(),
        clock=ManualClock(),
        metrics=ControllerMetrics(registry),
        schedule=False,
    )


def gauge(registry: CollectorRegistry, policy: str) -> float | None:
    return registry.get_sample_value("tailguard_policy_errors", {"policy": policy})


def test_a_refused_query_is_a_policy_error_on_readyz_and_in_metrics_never_a_breach(tmp_path: Path) -> None:
    rules = tmp_path / "rules"
    rules.mkdir()
    (rules / "a.yaml").write_text(policy_yaml("lat-a", query=BROKEN + "x)"))
    (rules / "b.yaml").write_text(policy_yaml("lat-b"))
    registry = CollectorRegistry()
    controller = make_controller(rules, tmp_path, RefusingSource({target_key({"service": "chat"}): 2.0}), registry)
    controller.start()
    try:
        outcome = controller.evaluate("lat-a")
        assert outcome is not None
        assert [d.kind for d in outcome.decisions if d.kind is DecisionKind.FIRE] == []  # never a breach
        assert len(outcome.policy_errors) == 1 and outcome.policy_errors[0].startswith("p99: ")
        fired = controller.evaluate("lat-b")
        assert fired is not None and fired.policy_errors == ()
        readiness = controller.readiness()
        assert len(readiness.policy_errors) == 1
        assert readiness.policy_errors[0].startswith("policy lat-a: signal p99: ")
        assert "bad_data" in readiness.policy_errors[0]
        assert readiness.to_json()["policy_errors"] == list(readiness.policy_errors)
        assert readiness.ready  # the other policies keep working: a policy error does not make the controller unready
        assert gauge(registry, "lat-a") == 1
        assert gauge(registry, "lat-b") == 0
    finally:
        controller.stop()


def test_the_policy_error_clears_when_the_query_is_accepted_again(tmp_path: Path) -> None:
    rules = tmp_path / "rules"
    rules.mkdir()
    (rules / "a.yaml").write_text(policy_yaml("lat-a"))
    registry = CollectorRegistry()
    answers = [SignalResult.refused("HTTP 400: bad_data: x"), SignalResult({})]
    loaded, _ = load_policies([rules])
    query = render_signal_queries(loaded[0].policy)["p99"]
    source = FakeSource(instant_answers={query: answers}, default=SignalResult({}))
    controller = make_controller(rules, tmp_path, source, registry)
    controller.start()
    try:
        controller.evaluate("lat-a")
        assert len(controller.readiness().policy_errors) == 1 and gauge(registry, "lat-a") == 1
        controller.evaluate("lat-a")
        assert controller.readiness().policy_errors == () and gauge(registry, "lat-a") == 0
    finally:
        controller.stop()


def test_a_reload_whose_query_is_refused_keeps_the_last_good_version_of_that_policy_only(tmp_path: Path) -> None:
    rules = tmp_path / "rules"
    rules.mkdir()
    (rules / "a.yaml").write_text(policy_yaml("lat-a"))
    registry = CollectorRegistry()
    controller = make_controller(rules, tmp_path, RefusingSource(), registry)
    controller.start()
    try:
        # lat-a's new version has a refused query; lat-b is new and fine; lat-c is new and refused.
        (rules / "a.yaml").write_text(policy_yaml("lat-a", query=BROKEN + "x)", threshold=5.0))
        (rules / "b.yaml").write_text(policy_yaml("lat-b"))
        (rules / "c.yaml").write_text(policy_yaml("lat-c", query=BROKEN + "y)"))
        outcome = controller.reload()
        assert outcome.applied and outcome.added == ("lat-b",) and outcome.updated == ()
        assert sorted(controller.policies()) == ["lat-a", "lat-b"]
        assert controller.policies()["lat-a"].conditions[0].when.value == 0.8  # the last good version runs
        errors = [str(error) for error in outcome.errors]
        assert len(errors) == 2
        assert errors[0].startswith(f"{rules / 'a.yaml'}:{QUERY_LINE}: signals[1].query: Prometheus refuses")
        assert "keeping its last good version" in errors[0]
        assert errors[1].startswith(f"{rules / 'c.yaml'}:{QUERY_LINE}: signals[1].query:") and "not loaded" in errors[1]
        assert [str(e) for e in controller.reload_errors()] == errors
        assert controller.readiness().reload_errors == tuple(errors)
        assert registry.get_sample_value("tailguard_reload_errors_total") == 1

        (rules / "a.yaml").write_text(policy_yaml("lat-a", threshold=5.0))  # fixed: applied, errors cleared
        (rules / "c.yaml").unlink()
        outcome = controller.reload()
        assert outcome.applied and outcome.updated == ("lat-a",) and outcome.errors == ()
        assert controller.policies()["lat-a"].conditions[0].when.value == 5.0
        assert controller.reload_errors() == []
    finally:
        controller.stop()


def test_an_empty_policy_set_is_a_reload_error_and_the_last_good_set_keeps_running(tmp_path: Path) -> None:
    rules = tmp_path / "rules"
    rules.mkdir()
    (rules / "a.yaml").write_text(policy_yaml("lat-a"))
    registry = CollectorRegistry()
    controller = make_controller(rules, tmp_path, RefusingSource(), registry)
    controller.start()
    try:
        controller.evaluate("lat-a")
        (rules / "a.yaml").unlink()
        outcome = controller.reload()
        assert outcome.changed and not outcome.applied
        assert sorted(controller.policies()) == ["lat-a"]
        assert "empty policy set" in str(outcome.errors[0])
        assert controller.readiness().reload_errors and controller.readiness().ready
        assert registry.get_sample_value("tailguard_reload_errors_total") == 1
        assert controller.evaluate("lat-a") is not None  # still evaluated
    finally:
        controller.stop()


def test_refused_queries_names_only_refusals_not_outages() -> None:
    loaded, errors = parse(policy_yaml("lat-a", query=BROKEN + "x)"))
    assert not errors
    source = RefusingSource()
    assert list(refused_queries(source, loaded.policy)) == ["p99"]
    down = FakeSource(default=SignalResult.failed("cannot connect"))
    assert refused_queries(down, loaded.policy) == {}  # an outage proves nothing about the query
    assert RangeResult(error="HTTP 400", policy_error=True).at(1.0).policy_error


def parse(text: str) -> Any:
    policies, errors = parse_policy_text(text, "p.yaml")
    return (policies[0] if policies else None), errors


def test_loaded_policies_know_the_line_of_each_query() -> None:
    loaded, _ = parse(policy_yaml("lat-a"))
    assert loaded.query_line("p99") == QUERY_LINE
    assert loaded.query_line("ok-signal") == QUERY_LINE - 2
    assert loaded.query_field("p99") == "signals[1].query"


needs_promtool = pytest.mark.skipif(shutil.which("promtool") is None, reason="promtool is not installed")


@needs_promtool
def test_rules_validate_parses_every_query_with_promtool_and_names_file_and_line(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    (tmp_path / "good.yaml").write_text(policy_yaml("lat-good"))
    (tmp_path / "bad.yaml").write_text(policy_yaml("lat-bad", query=BAD_QUERY))
    assert cli.main(["rules", "validate", str(tmp_path)]) == cli.EXIT_INVALID
    err = capsys.readouterr().err
    lines = [line for line in err.splitlines() if line.startswith(str(tmp_path))]
    assert len(lines) == 1
    assert lines[0].startswith(f"{tmp_path / 'bad.yaml'}:{QUERY_LINE}: signals[1].query: PromQL does not parse")
    assert "'lat-bad'" in lines[0] and "'p99'" in lines[0]

    (tmp_path / "bad.yaml").unlink()
    assert cli.main(["rules", "validate", str(tmp_path)]) == cli.EXIT_OK


def test_rules_validate_without_promtool_or_url_fails_and_says_how_to_check(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """Issue 24 item 9: at 7710821 this exited 0 ("ok") with a query that does not parse, promtool missing."""
    monkeypatch.setattr(cli, "promtool_path", lambda: None)
    (tmp_path / "bad.yaml").write_text(policy_yaml("lat-bad", query=BAD_QUERY))
    assert cli.main(["rules", "validate", str(tmp_path)]) == cli.EXIT_CONFIG
    captured = capsys.readouterr()
    assert captured.out == ""
    assert captured.err == (
        "cannot check PromQL: promtool is not on PATH and no --prometheus URL was given; install promtool or pass "
        "--prometheus URL (or --skip-promql to validate without the parser check)\n"
    )


def test_rules_validate_skips_the_parser_check_only_when_told(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(cli, "promtool_path", lambda: None)
    (tmp_path / "bad.yaml").write_text(policy_yaml("lat-bad", query=BAD_QUERY))
    assert cli.main(["rules", "validate", "--skip-promql", str(tmp_path)]) == cli.EXIT_OK
    captured = capsys.readouterr()
    assert captured.err == "skipped the PromQL parser check (--skip-promql)\n"
    assert captured.out.startswith("ok: 1 policies")
    with pytest.raises(SystemExit) as usage:  # one or the other
        cli.main(["rules", "validate", "--skip-promql", "--prometheus", "http://127.0.0.1:9", str(tmp_path)])
    assert usage.value.code == 2


def test_rules_validate_with_an_unreachable_prometheus_is_a_usage_error(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    (tmp_path / "good.yaml").write_text(policy_yaml("lat-good"))
    code = cli.main(["rules", "validate", "--prometheus", "http://127.0.0.1:9", str(tmp_path)])
    assert code == cli.EXIT_CONFIG
    assert "--prometheus http://127.0.0.1:9: Prometheus is not usable" in capsys.readouterr().err
    assert query_check.ParserUnavailable.__doc__
