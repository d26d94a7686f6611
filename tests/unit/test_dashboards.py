"""Dashboards: JSON up to date, valid for POST /api/dashboards/db, real metric names, renames both ways, push."""

from __future__ import annotations

import json
import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from prometheus_client import CollectorRegistry

from tailguard.controller.core.policy import Policy
from tailguard.controller.loop.metrics import ControllerMetrics
from tailguard.controller.tools import dashboards
from tailguard.serving.tier.engine_args_metric import EngineArgCollector, ListedReplica
from tailguard.serving.tier.profiles import EngineArgs
from tailguard.serving.tier.router import RouterMetrics
from tests.support.fake_grafana import FakeGrafana, _load_operations, check_request

ROOT = Path(__file__).resolve().parents[2]
VLLM_FIXTURE = ROOT / "tests" / "fixtures" / "vllm-0.32-cpu-metrics.txt"
TOKEN = "dash-token"

PROMQL_WORDS = {
    "sum", "avg", "max", "min", "count", "rate", "increase", "irate", "histogram_quantile", "time", "by", "without",
    "on", "ignoring", "and", "or", "unless", "bool", "offset", "label_values", "group_left", "group_right",
}  # fmt: skip


def metric_names(expr: str) -> set[str]:
    """The metric names an expression reads (label matchers, grouping labels, ranges and functions removed)."""
    text = re.sub(r'"(?:[^"\\]|\\.)*"', '""', expr)
    text = re.sub(r"\{[^}]*\}", " ", text)
    text = re.sub(r"\[[^\]]*\]", " ", text)
    text = re.sub(r"\b(by|without|on|ignoring)\s*\([^)]*\)", " ", text)
    text = re.sub(r"label_values\(([^,()]+),[^)]*\)", r" \1 ", text)
    names = set()
    # The lookbehind skips the unit of a duration (the `m` of `offset 5m`).
    for match in re.finditer(r"(?<![A-Za-z0-9_:.])[A-Za-z_:][A-Za-z0-9_:]*", text):
        word = match.group(0)
        following = text[match.end() :].lstrip()[:1]
        if word in PROMQL_WORDS or following == "(":
            continue
        names.add(word)
    return names


def exposed_names() -> set[str]:
    names: set[str] = set()
    for line in VLLM_FIXTURE.read_text(encoding="utf-8").splitlines():
        if line and not line.startswith("#"):
            names.add(re.split(r"[{ ]", line, maxsplit=1)[0])
    registry = CollectorRegistry()
    ControllerMetrics(registry)
    RouterMetrics(registry)
    registry.register(EngineArgCollector(lambda: [ListedReplica("s", "r1", "s-r1-0", EngineArgs())]))
    for family in registry.collect():
        suffixes = {"counter": ["_total"], "histogram": ["_bucket", "_sum", "_count"], "gauge": [""]}
        names.update(family.name + suffix for suffix in suffixes.get(family.type, [""]))
    names.update(dashboards.DCGM_METRICS)
    return names


@pytest.fixture(scope="module")
def generated() -> dict[str, dict[str, Any]]:
    return dashboards.all_dashboards()


def test_committed_json_is_up_to_date(generated: dict[str, dict[str, Any]]) -> None:
    for name, dashboard in generated.items():
        committed = (ROOT / "dashboards" / name).read_text(encoding="utf-8")
        assert committed == dashboards.render(dashboard), f"dashboards/{name} is stale: tailguard dashboards generate"


def test_generate_check_reports_a_stale_file(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert dashboards.main(["generate", "--dir", str(tmp_path)]) == 0
    assert dashboards.main(["generate", "--dir", str(tmp_path), "--check"]) == 0
    (tmp_path / "vllm-slo.json").write_text("{}\n")
    assert dashboards.main(["generate", "--dir", str(tmp_path), "--check"]) == 1
    assert "vllm-slo.json: out of date" in capsys.readouterr().err
    assert (tmp_path / "vllm-slo.json").read_text() == "{}\n"  # --check never writes


def test_every_dashboard_validates_against_the_grafana_dashboards_spec(generated: dict[str, dict[str, Any]]) -> None:
    operations = _load_operations()
    for dashboard in generated.values():
        body = json.loads(json.dumps(dashboards.save_body(dashboard, "tailguard", "test")))
        check_request(operations, "POST", "/api/dashboards/db", "", body)


def test_dashboard_structure(generated: dict[str, dict[str, Any]]) -> None:
    for dashboard in generated.values():
        ids = [p["id"] for p in dashboard["panels"]]
        assert len(ids) == len(set(ids))
        for panel in dashboard["panels"]:
            position = panel["gridPos"]
            assert 0 <= position["x"] and position["x"] + position["w"] <= 24
            refs = [t["refId"] for t in panel.get("targets", [])]
            assert len(refs) == len(set(refs))
        assert dashboard["uid"] and len(dashboard["uid"]) <= 40


def test_slo_dashboard_has_the_panels_variables_and_annotations(generated: dict[str, dict[str, Any]]) -> None:
    slo = generated["vllm-slo.json"]
    titles = {p["title"] for p in slo["panels"]}
    for wanted in (
        "End-to-end latency", "Time to first token", "Inter-token latency", "Request rate", "Error rate", "Queue",
        "KV-cache usage", "Prefix-cache hit rate", "Preemptions", "HBM use (DCGM)", "DRAM activity (DCGM)",
        "Running per replica vs max_num_seqs",
    ):  # fmt: skip
        assert wanted in titles
    e2e = next(p for p in slo["panels"] if p["title"] == "End-to-end latency")
    assert [t["expr"].split(",")[0] for t in e2e["targets"]] == [
        "histogram_quantile(0.5", "histogram_quantile(0.95", "histogram_quantile(0.99",
    ]  # fmt: skip
    assert {v["name"] for v in slo["templating"]["list"]} == {"datasource", "namespace", "service", "version"}
    tags = [a["target"]["tags"] for a in slo["annotations"]["list"] if "target" in a]
    assert ["rollout"] in tags and ["tailguard"] in tags
    everything = " ".join(dashboards.expressions(slo))
    for metric in (
        "DCGM_FI_DEV_FB_USED",
        "DCGM_FI_DEV_FB_FREE",
        "DCGM_FI_PROF_DRAM_ACTIVE",
        "DCGM_FI_DEV_MEM_COPY_UTIL",
    ):
        assert metric in everything


def test_every_metric_name_exists_in_an_exposition(generated: dict[str, dict[str, Any]]) -> None:
    known = exposed_names()
    for name, dashboard in generated.items():
        for expr in dashboards.expressions(dashboard):
            for metric in metric_names(expr):
                resolved = metric
                for old, new in dashboards.RENAMED_METRICS.items():
                    if metric.startswith(old):
                        resolved = new + metric.removeprefix(old)
                assert resolved in known, f"{name}: {metric} in {expr!r} is exposed by nothing we know"


def test_metric_name_extraction_is_not_vacuous() -> None:
    expr = 'sum by (le, service) (rate(vllm:x_bucket{a="b", c=~"d|e"}[5m])) / time() - foo_total offset 5m'
    assert metric_names(expr) == {"vllm:x_bucket", "foo_total"}
    assert metric_names('label_values(vllm:num_requests_running{namespace=~"$namespace"}, service)') == {
        "vllm:num_requests_running"
    }


@pytest.mark.parametrize(("new", "old"), [dashboards.KV_CACHE_USAGE, dashboards.INTER_TOKEN_LATENCY])
def test_renamed_metrics_are_queried_both_ways(generated: dict[str, dict[str, Any]], new: str, old: str) -> None:
    exprs = [e for d in generated.values() for e in dashboards.expressions(d) if new in e or old in e]
    assert exprs, f"{new} is not charted"
    for expr in exprs:
        names = metric_names(expr)
        assert {n.removesuffix("_bucket") for n in names} >= {new, old}, expr
        assert " or " in expr


def test_controller_dashboard_uses_the_controller_metrics(generated: dict[str, dict[str, Any]]) -> None:
    used = {m for e in dashboards.expressions(generated["tailguard-controller.json"]) for m in metric_names(e)}
    for metric in (
        "tailguard_evaluations_total", "tailguard_decisions_total", "tailguard_actions_total",
        "tailguard_source_errors_total", "tailguard_condition_state", "tailguard_query_duration_seconds_bucket",
    ):  # fmt: skip
        assert metric in used


@pytest.fixture
def grafana() -> Iterator[FakeGrafana]:
    with FakeGrafana(token=TOKEN) as fake:
        yield fake


def test_push_provisions_both_dashboards_and_overwrites(grafana: FakeGrafana, tmp_path: Path) -> None:
    token_file = tmp_path / "token"
    token_file.write_text(TOKEN + "\n")
    argv = ["push", "--grafana", grafana.url, "--token-file", str(token_file), "--folder-uid", "sre"]
    assert dashboards.main(argv) == 0
    assert dashboards.main(argv) == 0  # a second push overwrites, no "already exists" error
    assert set(grafana.state.dashboards) == {dashboards.SLO_UID, dashboards.CONTROLLER_UID}
    assert grafana.state.dashboards[dashboards.SLO_UID]["version"] == 2
    assert grafana.state.dashboards[dashboards.SLO_UID]["folderUid"] == "sre"
    assert grafana.state.rejections == []


def test_push_with_a_wrong_token_fails_clearly(
    grafana: FakeGrafana, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setenv("TG_DASH_TOKEN", "wrong-token")
    assert dashboards.main(["push", "--grafana", grafana.url, "--token-env", "TG_DASH_TOKEN"]) == 1
    err = capsys.readouterr().err
    assert "HTTP 401" in err and "wrong-token" not in err
    assert grafana.state.dashboards == {}


def test_push_bad_arguments(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert dashboards.main(["push", "--grafana", "grafana:3000"]) == 2
    assert dashboards.main(["push", "--grafana", "http://127.0.0.1:9", "--token-file", str(tmp_path / "no")]) == 2
    err = capsys.readouterr().err
    assert "expected an http" in err and "token file" in err


# -- issue 14 (item 7): Grafana's dashboard model, policy thresholds, prediction and per-priority panels -----------

GRAFANA_DASHBOARD_SCHEMA = ROOT / "tests" / "support" / "specs" / "grafana-dashboard.jsonschema.json"


def _slo_panel(dashboard: dict[str, Any], title: str) -> dict[str, Any]:
    return next(p for p in dashboard["panels"] if p["title"] == title)


def _lines(panel: dict[str, Any]) -> list[float]:
    defaults = panel["fieldConfig"]["defaults"]
    if "thresholds" not in defaults:
        return []
    assert defaults["custom"]["thresholdsStyle"] == {"mode": "line"}
    steps = defaults["thresholds"]["steps"]
    assert steps[0]["value"] is None  # the base step; every other step is a line
    return [step["value"] for step in steps[1:]]


def test_every_dashboard_validates_against_grafanas_dashboard_model_schema(
    generated: dict[str, dict[str, Any]],
) -> None:
    import jsonschema

    schema = json.loads(GRAFANA_DASHBOARD_SCHEMA.read_text(encoding="utf-8"))
    validator = jsonschema.Draft7Validator(schema)
    for name, dashboard in generated.items():
        errors = [f"{list(e.absolute_path)}: {e.message}" for e in validator.iter_errors(dashboard)]
        assert errors == [], f"{name}: {errors[:5]}"
    # The schema is strict: an unknown dashboard field or a malformed threshold step is refused.
    broken = json.loads(json.dumps(generated["vllm-slo.json"]))
    broken["panelz"] = []
    assert not validator.is_valid(broken)
    broken = json.loads(json.dumps(generated["vllm-slo.json"]))
    e2e = _slo_panel(broken, "End-to-end latency")
    e2e["fieldConfig"]["defaults"]["thresholds"]["steps"][1]["value"] = "0.8"
    assert not validator.is_valid(broken)


def test_the_p99_panel_draws_the_example_policies_thresholds(generated: dict[str, dict[str, Any]]) -> None:
    e2e = _slo_panel(generated["vllm-slo.json"], "End-to-end latency")
    # p99-rollback and attributed-rollback-or-scale both hold P99 e2e latency at 0.8 s.
    assert _lines(e2e) == [0.8]


def _policy(name: str, query: str | None, value: float, *, predict: bool = False) -> Policy:
    signal: dict[str, Any] = (
        {"name": "s", "predict": {"model": "sla", "dimension": "gpu"}} if predict else {"name": "s", "query": query}
    )
    return Policy.model_validate(
        {
            "apiVersion": "tailguard.io/v1alpha1",
            "kind": "Policy",
            "name": name,
            "interval": "15s",
            "targets": {"groupBy": ["service"]},
            "signals": [signal],
            "conditions": [
                {
                    "name": "c",
                    "signal": "s",
                    "when": {"op": ">", "value": value},
                    "for": 1,
                    "noData": "hold",
                    "actions": [{"type": "annotate", "text": "x"}],
                }
            ],
        }
    )


def test_threshold_lines_follow_the_policies_given() -> None:
    p99 = "histogram_quantile(0.99, sum by (le, {{ by }}) (rate({m}_bucket{ {{ selector }} }[1m])))"
    policies = [
        _policy("e2e", p99.replace("{m}", dashboards.E2E_LATENCY), 0.5),
        _policy("e2e-p50", p99.replace("0.99", "0.5").replace("{m}", dashboards.E2E_LATENCY), 0.3),  # not a P99
        _policy("interactive", p99.replace("{m}", dashboards.PRIORITY_LATENCY), 0.25),
        _policy("predicted", None, 0.7, predict=True),
    ]
    slo = dashboards.slo_dashboard(policies)
    assert _lines(_slo_panel(slo, "End-to-end latency")) == [0.5]
    assert _lines(_slo_panel(slo, "Latency per priority (router)")) == [0.25]
    assert _lines(_slo_panel(slo, "SLA breach probability")) == [0.7]
    bare = dashboards.slo_dashboard([])
    assert _lines(_slo_panel(bare, "End-to-end latency")) == []


def test_prediction_and_per_priority_panels_chart_the_exported_metrics(generated: dict[str, dict[str, Any]]) -> None:
    slo = generated["vllm-slo.json"]
    prediction = _slo_panel(slo, "SLA breach probability")
    (target,) = prediction["targets"]
    assert metric_names(target["expr"]) == {"tailguard_sla_breach_probability"}
    assert "dimension" in target["expr"] and prediction["fieldConfig"]["defaults"]["max"] == 1
    # The prediction policy (predicted-gpu-breach-scale) fires above 0.8.
    assert 0.8 in _lines(prediction)
    priority = _slo_panel(slo, "Latency per priority (router)")
    exprs = [t["expr"] for t in priority["targets"]]
    assert all(metric_names(e) == {"tailguard_serving_request_latency_seconds_bucket"} for e in exprs)
    assert all("priority" in e.split("sum by (")[1].split(")")[0] for e in exprs)
    # Both names exist in what the controller and the router export (a fresh registry each).
    known = exposed_names()
    assert {"tailguard_sla_breach_probability", "tailguard_serving_request_latency_seconds_bucket"} <= known


def test_rollouts_and_decisions_are_annotation_queries_by_the_tags_the_annotator_writes(
    generated: dict[str, dict[str, Any]],
) -> None:
    source = (ROOT / "controller" / "adapters" / "annotations" / "grafana.py").read_text(encoding="utf-8")
    for dashboard in generated.values():
        queries = [a for a in dashboard["annotations"]["list"] if "target" in a]
        assert queries
        for query in queries:
            assert query["datasource"] == dashboards.GRAFANA_ANNOTATIONS and query["enable"] is True
            assert query["target"]["type"] == "tags" and query["target"]["matchAny"] is False
            for tag in query["target"]["tags"]:
                assert f'"{tag}"' in source, f"no annotation is tagged {tag!r}"
    slo_tags = [a["target"]["tags"] for a in generated["vllm-slo.json"]["annotations"]["list"] if "target" in a]
    assert slo_tags == [["rollout"], ["tailguard"]]


def test_generate_takes_the_rules_and_refuses_broken_ones(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    rules = tmp_path / "rules"
    rules.mkdir()
    (rules / "broken.yaml").write_text("name: [\n", encoding="utf-8")
    assert dashboards.main(["generate", "--dir", str(tmp_path / "out"), "--rules", str(rules)]) == 2
    assert "--rules" in capsys.readouterr().err
    assert dashboards.DASHBOARD_DIR == ROOT / "dashboards"
