"""The Grafana dashboards: built here as plain dicts, committed as dashboards/*.json, pushed through the API.

`tailguard dashboards generate` rewrites dashboards/*.json from these builders
(`--check` only says whether they are up to date); `tailguard dashboards push
--grafana URL` provisions them with POST /api/dashboards/db (overwrite, optional
folder). Two dashboards:

- vLLM serving SLOs per namespace/service/version: latency quantiles (e2e, TTFT,
  inter-token), request and error rates, queue, KV cache, prefix-cache hits,
  preemptions, HBM (DCGM) and DRAM activity, with the `rollout` and `tailguard`
  annotations on every panel;
- the controller itself: evaluations, decisions, actions, query latency, source
  errors, mutating-action budget use, condition states.

The policies (rules/examples, or `generate --rules DIR`) draw their thresholds on
the panels that chart what they watch: every `>`/`>=` threshold of a condition on
a P99 of vllm:e2e_request_latency_seconds is a line on the end-to-end latency
panel, one on tailguard_serving_request_latency_seconds (the router's
per-priority latency) on the per-priority panel, and one on a prediction signal
on the breach-probability panel (Grafana thresholds, `thresholdsStyle` line).
Rollouts and tailguard decisions are annotation queries by tag (`rollout`,
`tailguard`: the tags controller/adapters/annotations/grafana.py writes).

vLLM renamed two metrics; every query reading them asks for both names with `or`
(PromQL's `or` matches label sets without the metric name, so a server exposing
both is not counted twice and a server exposing either one works).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from tailguard.controller.adapters.annotations.settings import GrafanaTokenError, read_token_file
from tailguard.controller.core.policy import Policy, Signal
from tailguard.controller.core.policy_files import load_policies
from tailguard.controller.kit.clock import SystemClock

SLO_UID = "tailguard-vllm-slo"
CONTROLLER_UID = "tailguard-controller"
DASHBOARD_DIR = Path(__file__).resolve().parents[2] / "dashboards"
RULES_DIR = DASHBOARD_DIR.parent / "rules" / "examples"
# The P99 the latency policies watch, the router's per-priority latency, and the predicted breach probability.
E2E_LATENCY = "vllm:e2e_request_latency_seconds"
PRIORITY_LATENCY = "tailguard_serving_request_latency_seconds"
BREACH_PROBABILITY = "tailguard_sla_breach_probability"
THRESHOLD_COLORS = ("orange", "red", "dark-red", "purple")
SCHEMA_VERSION = 39
DATASOURCE = {"type": "prometheus", "uid": "${datasource}"}
GRAFANA_ANNOTATIONS = {"type": "grafana", "uid": "-- Grafana --"}

# vLLM renames: (new name, old name). Queries carry both.
KV_CACHE_USAGE = ("vllm:kv_cache_usage_perc", "vllm:gpu_cache_usage_perc")
INTER_TOKEN_LATENCY = ("vllm:inter_token_latency_seconds", "vllm:time_per_output_token_seconds")
RENAMED_METRICS = {old: new for new, old in (KV_CACHE_USAGE, INTER_TOKEN_LATENCY)}
# The DCGM exporter fields the dashboards (and the HBM/DRAM policies) read.
DCGM_METRICS = ("DCGM_FI_DEV_FB_USED", "DCGM_FI_DEV_FB_FREE", "DCGM_FI_PROF_DRAM_ACTIVE", "DCGM_FI_DEV_MEM_COPY_UTIL")

SELECTOR = 'namespace=~"$namespace", service=~"$service", version=~"$version"'
BY = "service, version"
RATE = "$__rate_interval"


# -- small builders ----------------------------------------------------------------------------------------


def target(expr: str, legend: str, ref: str) -> dict[str, Any]:
    return {"datasource": DATASOURCE, "expr": expr, "legendFormat": legend, "refId": ref, "range": True}


def panel(
    title: str,
    targets: Sequence[tuple[str, str]],
    *,
    unit: str = "short",
    description: str = "",
    kind: str = "timeseries",
    maximum: float | None = None,
    thresholds: Sequence[float] = (),
) -> dict[str, Any]:
    defaults: dict[str, Any] = {"unit": unit}
    if maximum is not None:
        defaults["min"], defaults["max"] = 0, maximum
    if thresholds:
        # One line per distinct policy threshold (Grafana draws each step above the base as a line).
        steps: list[dict[str, Any]] = [{"color": "green", "value": None}]
        for i, value in enumerate(sorted(set(thresholds))):
            steps.append({"color": THRESHOLD_COLORS[min(i, len(THRESHOLD_COLORS) - 1)], "value": value})
        defaults["thresholds"] = {"mode": "absolute", "steps": steps}
        defaults["custom"] = {"thresholdsStyle": {"mode": "line"}}
    return {
        "type": kind,
        "title": title,
        "description": description,
        "datasource": DATASOURCE,
        "targets": [target(expr, legend, chr(ord("A") + i)) for i, (expr, legend) in enumerate(targets)],
        "fieldConfig": {"defaults": defaults, "overrides": []},
        "options": {"legend": {"displayMode": "table", "placement": "bottom", "calcs": ["lastNotNull", "max"]}},
    }


def row(title: str) -> dict[str, Any]:
    return {"type": "row", "title": title, "collapsed": False, "panels": []}


def layout(items: Sequence[dict[str, Any]], width: int = 8, height: int = 8) -> list[dict[str, Any]]:
    """Ids and grid positions: rows span the width, panels flow three a line."""
    out: list[dict[str, Any]] = []
    x = y = 0
    for number, item in enumerate(items, start=1):
        placed = dict(item, id=number)
        if item["type"] == "row":
            if x:
                x, y = 0, y + height
            placed["gridPos"] = {"h": 1, "w": 24, "x": 0, "y": y}
            y += 1
        else:
            if x + width > 24:
                x, y = 0, y + height
            placed["gridPos"] = {"h": height, "w": width, "x": x, "y": y}
            x += width
        out.append(placed)
    return out


def query_variable(name: str, label: str, query: str) -> dict[str, Any]:
    return {
        "type": "query",
        "name": name,
        "label": label,
        "datasource": DATASOURCE,
        "query": query,
        "definition": query,
        "refresh": 2,
        "multi": True,
        "includeAll": True,
        "allValue": ".*",
        "current": {"selected": True, "text": ["All"], "value": ["$__all"]},
        "sort": 1,
    }


def datasource_variable() -> dict[str, Any]:
    return {"type": "datasource", "name": "datasource", "label": "Prometheus", "query": "prometheus", "refresh": 1}


def annotation_query(name: str, tags: Sequence[str], color: str) -> dict[str, Any]:
    return {
        "name": name,
        "datasource": GRAFANA_ANNOTATIONS,
        "enable": True,
        "iconColor": color,
        "target": {"type": "tags", "tags": list(tags), "matchAny": False, "limit": 200},
    }


def dashboard(
    uid: str,
    title: str,
    description: str,
    panels: list[dict[str, Any]],
    variables: list[dict[str, Any]],
    annotations: list[dict[str, Any]],
    tags: Sequence[str],
) -> dict[str, Any]:
    builtin = {
        "builtIn": 1,
        "datasource": GRAFANA_ANNOTATIONS,
        "enable": True,
        "hide": True,
        "iconColor": "rgba(0, 211, 255, 1)",
        "name": "Annotations & Alerts",
        "type": "dashboard",
    }
    return {
        "uid": uid,
        "title": title,
        "description": description,
        "tags": list(tags),
        "timezone": "utc",
        "editable": True,
        "graphTooltip": 1,
        "schemaVersion": SCHEMA_VERSION,
        "version": 1,
        "refresh": "30s",
        "time": {"from": "now-3h", "to": "now"},
        "templating": {"list": variables},
        "annotations": {"list": [builtin, *annotations]},
        "panels": panels,
    }


# -- the vLLM SLO dashboard -----------------------------------------------------------------------------------


def _quantiles(metric: str, old: str | None = None) -> list[tuple[str, str]]:
    def buckets(name: str) -> str:
        return f"rate({name}_bucket{{{SELECTOR}}}[{RATE}])"

    inner = buckets(metric) if old is None else f"{buckets(metric)} or {buckets(old)}"
    return [
        (f"histogram_quantile({q}, sum by (le, {BY}) ({inner}))", f"P{int(q * 100)} {{{{service}}}} {{{{version}}}}")
        for q in (0.5, 0.95, 0.99)
    ]


def _by(expr: str, aggregation: str = "sum") -> str:
    return f"{aggregation} by ({BY}) ({expr})"


# -- the policies' thresholds ---------------------------------------------------------------------------------


def example_policies(rules: Path = RULES_DIR) -> list[Policy]:
    """The policies whose thresholds the dashboards draw (rules/examples by default); a broken file is an error."""
    loaded, errors = load_policies([rules])
    if errors:
        raise ValueError("; ".join(f"{e.file}:{e.line}: {e.message}" for e in errors))
    return [item.policy for item in loaded]


def policy_thresholds(policies: Sequence[Policy], watches: Callable[[Signal], bool]) -> list[float]:
    """Every upper threshold (`>`/`>=`) of a condition whose signal `watches` selects: the lines of a panel."""
    values: set[float] = set()
    for policy in policies:
        signals = {signal.name: signal for signal in policy.signals}
        for condition in policy.conditions:
            signal = signals.get(condition.signal)
            if signal is not None and watches(signal) and condition.when.op in (">", ">="):
                values.add(condition.when.value)
    return sorted(values)


def _p99_of(metric: str) -> Callable[[Signal], bool]:
    def watches(signal: Signal) -> bool:
        query = " ".join((signal.query or "").split())
        return f"{metric}_bucket" in query and query.startswith("histogram_quantile(0.99")

    return watches


def _predicted(signal: Signal) -> bool:
    return signal.predict is not None


def slo_dashboard(policies: Sequence[Policy] | None = None) -> dict[str, Any]:
    policies = example_policies() if policies is None else policies
    legend = "{{service}} {{version}}"
    by_service = 'namespace=~"$namespace", service=~"$service"'  # the router's priority series have no version
    kv_new, kv_old = KV_CACHE_USAGE
    itl_new, itl_old = INTER_TOKEN_LATENCY
    items = [
        row("Latency"),
        panel(
            "End-to-end latency",
            _quantiles("vllm:e2e_request_latency_seconds"),
            unit="s",
            description="P50/P95/P99 of vllm:e2e_request_latency_seconds per service and version; the lines are "
            "the P99 thresholds of the policies (rules/examples).",
            thresholds=policy_thresholds(policies, _p99_of(E2E_LATENCY)),
        ),
        panel("Time to first token", _quantiles("vllm:time_to_first_token_seconds"), unit="s"),
        panel(
            "Inter-token latency",
            _quantiles(itl_new, itl_old),
            unit="s",
            description=f"{itl_new}, or {itl_old} on vLLM servers before the rename.",
        ),
        panel(
            "Latency per priority (router)",
            [
                (
                    (
                        f"histogram_quantile({q}, sum by (le, service, priority) "
                        f"(rate({PRIORITY_LATENCY}_bucket{{{by_service}}}[{RATE}])))"
                    ),
                    f"P{int(q * 100)} {{{{service}}}} {{{{priority}}}}",
                )
                for q in (0.5, 0.99)
            ],
            unit="s",
            description=f"{PRIORITY_LATENCY}: the router's time to answer per priority class (interactive, batch), "
            "batching window included; the lines are the thresholds of the per-priority policies.",
            thresholds=policy_thresholds(policies, _p99_of(PRIORITY_LATENCY)),
        ),
        row("Prediction"),
        panel(
            "SLA breach probability",
            [(f"max by (dimension, target) ({BREACH_PROBABILITY})", "{{dimension}} {{target}}")],
            unit="percentunit",
            maximum=1,
            description="The SLA model's probability that a dimension breaches within its horizon, per target, as "
            "the controller exports it for its prediction signals; the lines are the prediction policies' thresholds.",
            thresholds=policy_thresholds(policies, _predicted),
        ),
        row("Traffic and errors"),
        panel(
            "Request rate",
            [
                (_by(f"rate(vllm:request_success_total{{{SELECTOR}}}[{RATE}])"), legend),
                (_by(f"rate(tailguard_router_requests_total{{{SELECTOR}}}[{RATE}])"), f"router {legend}"),
            ],
            unit="reqps",
        ),
        panel(
            "Error rate",
            [
                (
                    _by(f'rate(vllm:request_success_total{{{SELECTOR}, finished_reason="error"}}[{RATE}])')
                    + " / "
                    + _by(f"rate(vllm:request_success_total{{{SELECTOR}}}[{RATE}])"),
                    f"engine {legend}",
                ),
                (
                    _by(f'rate(tailguard_router_requests_total{{{SELECTOR}, code=~"5.."}}[{RATE}])')
                    + " / "
                    + _by(f"rate(tailguard_router_requests_total{{{SELECTOR}}}[{RATE}])"),
                    f"router 5xx {legend}",
                ),
            ],
            unit="percentunit",
            maximum=1,
        ),
        panel(
            "Queue",
            [
                (_by(f"vllm:num_requests_waiting{{{SELECTOR}}}"), f"waiting {legend}"),
                (_by(f"vllm:num_requests_running{{{SELECTOR}}}"), f"running {legend}"),
            ],
        ),
        panel(
            "Running per replica vs max_num_seqs",
            [
                (_by(f"vllm:num_requests_running{{{SELECTOR}}}", "avg"), f"running per replica {legend}"),
                (
                    _by(f'tailguard_serving_engine_arg{{{SELECTOR}, arg="max_num_seqs"}}', "min"),
                    f"max_num_seqs {legend}",
                ),
            ],
            description="A replica whose running requests reach its max_num_seqs queues the rest. The limit comes "
            "from tailguard_serving_engine_arg, which the bundled tier's router exports for every listed replica "
            "(starting ones included); vLLM does not export it.",
        ),
        row("Cache and memory"),
        panel(
            "KV-cache usage",
            [
                (_by(f"{kv_new}{{{SELECTOR}}} or {kv_old}{{{SELECTOR}}}", "avg"), f"avg {legend}"),
                (_by(f"{kv_new}{{{SELECTOR}}} or {kv_old}{{{SELECTOR}}}", "max"), f"max {legend}"),
            ],
            unit="percentunit",
            maximum=1,
            description=f"{kv_new}, or {kv_old} on vLLM servers before the rename.",
        ),
        panel(
            "Prefix-cache hit rate",
            [
                (
                    _by(f"rate(vllm:prefix_cache_hits_total{{{SELECTOR}}}[{RATE}])")
                    + " / "
                    + _by(f"rate(vllm:prefix_cache_queries_total{{{SELECTOR}}}[{RATE}])"),
                    legend,
                ),
            ],
            unit="percentunit",
            maximum=1,
        ),
        panel("Preemptions", [(_by(f"rate(vllm:num_preemptions_total{{{SELECTOR}}}[{RATE}])"), legend)], unit="ops"),
        panel(
            "HBM use (DCGM)",
            [
                (
                    _by(f"DCGM_FI_DEV_FB_USED{{{SELECTOR}}}")
                    + " / "
                    + _by(f"DCGM_FI_DEV_FB_USED{{{SELECTOR}}} + DCGM_FI_DEV_FB_FREE{{{SELECTOR}}}"),
                    f"used {legend}",
                ),
            ],
            unit="percentunit",
            maximum=1,
            description="Framebuffer used / (used + free), all GPUs of a version.",
        ),
        panel("HBM used (MiB)", [(_by(f"DCGM_FI_DEV_FB_USED{{{SELECTOR}}}"), legend)], unit="decmbytes"),
        panel(
            "DRAM activity (DCGM)",
            [
                (_by(f"DCGM_FI_PROF_DRAM_ACTIVE{{{SELECTOR}}}", "avg"), f"DRAM active {legend}"),
                (_by(f"DCGM_FI_DEV_MEM_COPY_UTIL{{{SELECTOR}}}", "avg") + " / 100", f"memory copy util {legend}"),
            ],
            unit="percentunit",
            maximum=1,
        ),
    ]
    variables = [
        datasource_variable(),
        query_variable("namespace", "Namespace", "label_values(vllm:num_requests_running, namespace)"),
        query_variable(
            "service", "Service", 'label_values(vllm:num_requests_running{namespace=~"$namespace"}, service)'
        ),
        query_variable(
            "version",
            "Version",
            'label_values(vllm:num_requests_running{namespace=~"$namespace", service=~"$service"}, version)',
        ),
    ]
    annotations = [
        annotation_query("Rollouts", ["rollout"], "blue"),
        annotation_query("tailguard decisions", ["tailguard"], "red"),
    ]
    return dashboard(
        SLO_UID,
        "vLLM serving SLOs",
        "Latency, traffic, cache and memory per service and version, with "
        "every rollout and tailguard decision as annotations.",
        layout(items),
        variables,
        annotations,
        ["tailguard", "vllm", "slo"],
    )


# -- the controller dashboard ---------------------------------------------------------------------------------


def controller_dashboard() -> dict[str, Any]:
    pol = 'policy=~"$policy"'
    items = [
        row("Evaluations"),
        panel(
            "Evaluations",
            [
                (
                    f"sum by (policy, trigger) (rate(tailguard_evaluations_total{{{pol}}}[{RATE}]))",
                    "{{policy}} {{trigger}}",
                )
            ],
            unit="ops",
        ),
        panel(
            "Seconds since last evaluation",
            [
                (f"time() - tailguard_last_evaluation_timestamp_seconds{{{pol}}}", "{{policy}}"),
            ],
            unit="s",
        ),
        panel(
            "Signal query latency P95",
            [
                (
                    (
                        f"histogram_quantile(0.95, sum by (le, policy, signal) "
                        f"(rate(tailguard_query_duration_seconds_bucket{{{pol}}}[{RATE}])))"
                    ),
                    "{{policy}} {{signal}}",
                ),
            ],
            unit="s",
        ),
        panel(
            "Evaluation cycle time",
            [
                (
                    (
                        f"histogram_quantile({quantile}, sum by (le, policy) "
                        f"(rate(tailguard_evaluation_duration_seconds_bucket{{{pol}}}[{RATE}])))"
                    ),
                    f"{{{{policy}}}} P{label}",
                )
                for quantile, label in (("0.5", "50"), ("0.95", "95"))
            ],
            unit="s",
            description="One evaluation: its queries (issued at once), the engine, the journal commit, the dispatch.",
        ),
        panel(
            "Targets per evaluation",
            [(f"tailguard_evaluation_targets{{{pol}}}", "{{policy}}")],
            description="Distinct targets with state after each policy's last evaluation (the cycle time's N).",
        ),
        row("Decisions and actions"),
        panel(
            "Decisions by kind",
            [
                (
                    f"sum by (policy, kind) (increase(tailguard_decisions_total{{{pol}}}[{RATE}]))",
                    "{{policy}} {{kind}}",
                ),
            ],
        ),
        panel(
            "Actions by type and outcome",
            [
                (f"sum by (type, status) (increase(tailguard_actions_total[{RATE}]))", "{{type}} {{status}}"),
            ],
        ),
        panel(
            "Mutating actions in the last hour (budget use)",
            [
                (
                    (
                        'sum by (type) (increase(tailguard_actions_total{type=~"rollback|scale|shift_traffic", '
                        'status="succeeded"}[1h]))'
                    ),
                    "{{type}}",
                ),
            ],
            description="Compare with limits.maxActionsPerHour of each policy and the global budget.",
        ),
        row("Health"),
        panel(
            "Source errors",
            [
                (
                    f"sum by (policy, signal) (rate(tailguard_source_errors_total{{{pol}}}[{RATE}]))",
                    "{{policy}} {{signal}}",
                ),
            ],
            unit="ops",
            description="Failed signal queries; never counted as breaches.",
        ),
        panel(
            "Condition states",
            [
                (
                    f"sum by (policy, condition, phase) (tailguard_condition_state{{{pol}}})",
                    "{{policy}}/{{condition}} {{phase}}",
                ),
            ],
        ),
        panel(
            "Policies loaded and reload errors",
            [
                ("tailguard_policies_loaded", "loaded"),
                (f"increase(tailguard_reload_errors_total[{RATE}])", "reload errors"),
            ],
        ),
    ]
    variables = [
        datasource_variable(),
        query_variable("policy", "Policy", "label_values(tailguard_evaluations_total, policy)"),
    ]
    annotations = [annotation_query("tailguard decisions", ["tailguard"], "red")]
    return dashboard(
        CONTROLLER_UID,
        "tailguard controller",
        "What the controller evaluates, decides and does.",
        layout(items),
        variables,
        annotations,
        ["tailguard"],
    )


BUILDERS: dict[str, Callable[[Sequence[Policy]], dict[str, Any]]] = {
    "vllm-slo.json": slo_dashboard,
    "tailguard-controller.json": lambda _policies: controller_dashboard(),
}


def render(dashboard_json: dict[str, Any]) -> str:
    return json.dumps(dashboard_json, indent=2, sort_keys=True) + "\n"


def all_dashboards(policies: Sequence[Policy] | None = None) -> dict[str, dict[str, Any]]:
    policies = example_policies() if policies is None else policies
    return {name: build(policies) for name, build in BUILDERS.items()}


def expressions(dashboard_json: dict[str, Any]) -> list[str]:
    """Every PromQL expression of a dashboard: panel targets and query variables."""
    found = [t["expr"] for p in dashboard_json["panels"] for t in p.get("targets", [])]
    for variable in dashboard_json["templating"]["list"]:
        if variable["type"] == "query":
            found.append(variable["definition"])
    return found


def save_body(dashboard_json: dict[str, Any], folder_uid: str | None, message: str) -> dict[str, Any]:
    """The POST /api/dashboards/db body: overwrite, so a push is idempotent."""
    # No id: Grafana matches on the uid, so the same body creates or updates.
    dashboard = {key: value for key, value in dashboard_json.items() if key != "id"}
    body: dict[str, Any] = {"dashboard": dashboard, "overwrite": True, "message": message}
    if folder_uid:
        body["folderUid"] = folder_uid
    return body


# -- CLI -----------------------------------------------------------------------------------------------------


def generate(directory: Path, check: bool, rules: Path = RULES_DIR) -> int:
    stale: list[str] = []
    try:
        policies = example_policies(rules)
    except ValueError as broken:
        print(f"--rules: {broken}", file=sys.stderr)
        return 2
    for name, dashboard_json in all_dashboards(policies).items():
        path = directory / name
        text = render(dashboard_json)
        current = path.read_text(encoding="utf-8") if path.exists() else None
        if current == text:
            continue
        stale.append(str(path))
        if not check:
            directory.mkdir(parents=True, exist_ok=True)
            path.write_text(text, encoding="utf-8")
    if check and stale:
        for shown in stale:
            print(f"{shown}: out of date; run `tailguard dashboards generate`", file=sys.stderr)
        return 1
    for shown in stale:
        print(f"wrote {shown}")
    return 0


def push(url: str, token: str | None, folder_uid: str | None, timeout: float) -> int:
    # The cluster extra (grafana-client): imported only when dashboards are pushed.
    from tailguard.controller.adapters.annotations.grafana import GrafanaHttp

    http = GrafanaHttp(url, token, SystemClock(), timeout=timeout, retries=3)
    failed = 0
    for name, dashboard_json in all_dashboards().items():
        # Overwrite by uid is idempotent: retrying a POST that may have landed changes nothing.
        answer = http.call(
            "POST", "/dashboards/db", save_body(dashboard_json, folder_uid, "tailguard push"), retry=True
        )
        if answer.ok:
            body = answer.body if isinstance(answer.body, dict) else {}
            print(f"{name}: {body.get('status', 'ok')} uid={body.get('uid')} version={body.get('version')}")
        else:
            failed += 1
            print(f"{name}: {answer.error}", file=sys.stderr)
    return 1 if failed else 0


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="tailguard dashboards", description=__doc__.splitlines()[0] if __doc__ else ""
    )
    commands = parser.add_subparsers(dest="action", required=True, metavar="ACTION")
    gen = commands.add_parser("generate", help="rewrite dashboards/*.json from controller/tools/dashboards.py")
    gen.add_argument("--dir", type=Path, default=DASHBOARD_DIR, help="output directory (default: %(default)s)")
    gen.add_argument("--check", action="store_true", help="only check that the files are up to date (exit 1 if not)")
    gen.add_argument(
        "--rules", type=Path, default=RULES_DIR, help="policies whose thresholds the panels draw (default: %(default)s)"
    )
    pushp = commands.add_parser("push", help="provision the dashboards through the Grafana API")
    pushp.add_argument("--grafana", required=True, help="Grafana base URL, e.g. http://127.0.0.1:3000")
    pushp.add_argument("--token-file", type=Path, help="file holding a Grafana service-account token")
    pushp.add_argument(
        "--token-env",
        default="GRAFANA_TOKEN",
        help="environment variable with the token when no --token-file is given (default: %(default)s)",
    )
    pushp.add_argument("--folder-uid", help="folder to put the dashboards in (default: General)")
    pushp.add_argument("--timeout", type=float, default=10.0, help="seconds per request (default: %(default)s)")
    args = parser.parse_args(list(argv) if argv is not None else None)
    if args.action == "generate":
        return generate(args.dir, args.check, args.rules)
    if not args.grafana.startswith(("http://", "https://")):
        print(f"--grafana: expected an http:// or https:// URL, got {args.grafana!r}", file=sys.stderr)
        return 2
    try:
        token = read_token_file(args.token_file) if args.token_file else (os.environ.get(args.token_env) or None)
    except GrafanaTokenError as unreadable:
        print(f"--token-file: {unreadable}", file=sys.stderr)
        return 2
    return push(args.grafana, token, args.folder_uid, args.timeout)


if __name__ == "__main__":
    raise SystemExit(main())
