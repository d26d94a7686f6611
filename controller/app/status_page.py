"""The status page (`GET /status`): one self-contained HTML document rendered from the status document
(controller/core/status_view.py). Read-only, no external assets (inline CSS, no script needed to read it; a
small inline script only reloads it), every value HTML-escaped. It leads with the open incidents
(controller/app/incident_view.py). Behind the same token as the API: a header, or the session cookie of the sign-in
form (controller/app/status_login.py); never a token in the URL.
"""

from __future__ import annotations

import datetime
import html
import json
from collections.abc import Mapping
from typing import Any
from urllib.parse import quote

from tailguard.controller.app.incident_view import (
    INCIDENT_CSS,
    action_text,
    condition_text,
    human_duration,
    incidents_section,
    with_unit,
)

REFRESH_SECONDS = 15

_CSS = """
body{font-family:system-ui,-apple-system,Segoe UI,Roboto,sans-serif;margin:1.5rem;color:#1d232a;background:#f6f7f9}
h1{font-size:1.4rem;margin:0 0 .3rem}h2{font-size:1.1rem;margin:1.6rem 0 .5rem}
.meta{color:#5b6570;font-size:.85rem}
table{border-collapse:collapse;width:100%;background:#fff;font-size:.85rem;box-shadow:0 1px 2px #0001}
th,td{text-align:left;padding:.35rem .55rem;border-bottom:1px solid #e4e7eb;vertical-align:top}
th{background:#eef0f3;font-weight:600}
.phase,.kind{display:inline-block;padding:.05rem .45rem;border-radius:.6rem;font-weight:600;font-size:.78rem}
.ok,.resolve{background:#d9f2df;color:#17612a}.pending{background:#fff1c2;color:#7a5a00}
.firing,.fire{background:#fbd5d5;color:#9b1c1c}.stale,.suppressed{background:#e5e7eb;color:#374151}
.errored{background:#f3d9fa;color:#6b21a8}.paused{background:#fde68a;color:#78350f}
.banner{padding:.6rem .9rem;border-radius:.4rem;background:#fde68a;color:#78350f;font-weight:600;margin:.6rem 0}
.timeline{list-style:none;padding:0;margin:0}
.timeline li{background:#fff;margin:0 0 .5rem;padding:.55rem .8rem;border-left:4px solid #9ca3af}
.timeline li.fire{border-left-color:#dc2626}.timeline li.resolve{border-left-color:#16a34a}
.timeline li.suppressed{border-left-color:#6b7280}.timeline li.errored{border-left-color:#9333ea}
.evidence{font-family:ui-monospace,monospace;font-size:.78rem;color:#374151}
.actions{margin:.3rem 0 0;padding-left:1.1rem;font-size:.82rem}
.timeline .actions li{border:0;padding:0;margin:0;box-shadow:none;background:none}
a{color:#1d4ed8}
.health{padding:.7rem 1rem;border-radius:.4rem;margin:.6rem 0;font-weight:600}
.health.blind{background:#b91c1c;color:#fff;font-size:1.05rem}.health.degraded{background:#fed7aa;color:#7c2d12}
.health.up{background:#d9f2df;color:#17612a;font-weight:500;font-size:.85rem;padding:.35rem .8rem}
.health .detail{font-weight:400;font-size:.85rem;margin-top:.2rem}
"""

_SCRIPT = f"setTimeout(function(){{location.reload()}},{REFRESH_SECONDS * 1000});"


def _e(value: Any) -> str:
    return html.escape("" if value is None else str(value), quote=True)


def _time(at: Any) -> str:
    if not isinstance(at, (int, float)):
        return "-"
    return datetime.datetime.fromtimestamp(float(at), datetime.UTC).strftime("%Y-%m-%d %H:%M:%SZ")


def _target(labels: Any) -> str:
    if isinstance(labels, Mapping):
        return ",".join(f"{name}={value}" for name, value in sorted(labels.items())) or "(all)"
    if isinstance(labels, list):
        return ",".join(f"{pair[0]}={pair[1]}" for pair in labels if len(pair) == 2) or "(all)"
    return str(labels)


def _number(value: Any) -> str:
    return f"{value:.4g}" if isinstance(value, (int, float)) else "-"


def _policies(document: Mapping[str, Any]) -> str:
    rows = []
    kill = document.get("killSwitch")
    for policy in document.get("policies", []):
        badges = []
        own = policy.get("policyPause")
        if own is None and policy.get("paused") and not kill:
            own = policy["paused"]  # a document from before policyPause: the pause shown is the policy's
        if own:
            badges.append(f'<span class="phase paused" data-badge="policy-paused" title="{_e(own.get("reason"))}">'
                          f'paused by {_e(own.get("by"))}: {_e(own.get("reason"))}</span>')  # fmt: skip
        if kill:
            badges.append('<span class="phase paused" data-badge="kill-switch">kill switch</span>')
        if policy.get("suspend"):
            badges.append('<span class="phase paused">suspended</span>')
        if policy.get("dryRun"):
            badges.append('<span class="phase stale">dry run</span>')
        targets = policy.get("targets") or [{}]
        for target in targets:
            phase = target.get("phase", "ok") if target else "ok"
            unit = target.get("unit")
            rows.append(
                "<tr>"
                f'<td data-policy="{_e(policy["name"])}">{_e(policy["name"])} {" ".join(badges)}</td>'
                f"<td>{_e(target.get('condition', '-'))}</td>"
                f"<td>{_e(_target(target.get('target', {})) if target else '-')}</td>"
                f'<td><span class="phase {_e(phase)}" data-phase="{_e(phase)}">{_e(phase)}</span></td>'
                f"<td>{_e(with_unit(target.get('value'), unit))}</td>"
                f"<td>{_e(condition_text(target) or '-')}</td>"
                f"<td>{_e(target.get('streak', 0))}</td>"
                f"<td>{_e(human_duration(target.get('cooldownLeft', 0)))}</td>"
                f"<td>{_e(target.get('budgetUsed', 0))}/{_e(target.get('budget', '-'))}</td>"
                f"<td>{_e(target.get('decisionId') or '-')}</td>"
                "</tr>"
            )
    header = (
        "<tr><th>policy</th><th>condition</th><th>target</th><th>phase</th><th>value</th><th>rule</th>"
        "<th>streak</th><th>cooldown left</th><th>budget (1 h)</th><th>last decision</th></tr>"
    )
    return f'<table id="policies">{header}{"".join(rows)}</table>'


def _incidents(document: Mapping[str, Any]) -> str:
    rows = []
    for incident in document.get("incidents", []):
        phase = str(incident.get("phase", "open"))
        notes = "".join(f"<div class=meta>{_e(note)}</div>" for note in incident.get("notes") or [])
        rows.append(
            f'<tr data-incident="{_e(incident.get("id"))}">'
            f"<td>{_e(incident.get('id'))}</td><td>{_e(incident.get('service'))}</td>"
            f'<td><span class="phase {_e(phase)}" data-phase="{_e(phase)}">{_e(phase)}</span></td>'
            f"<td>{_e(incident.get('cause') or '-')}</td><td>{_e(incident.get('action') or '-')}{notes}</td>"
            f"<td>{_e(incident.get('stage', 0))}</td><td>{_e(incident.get('next') or '-')}</td>"
            "</tr>"
        )
    if not rows:
        return '<p class="meta" id="incidents">no open incident</p>'
    header = (
        "<tr><th>incident</th><th>service</th><th>phase</th><th>cause</th><th>action</th><th>stage</th>"
        "<th>next step</th></tr>"
    )
    return f'<table id="incidents">{header}{"".join(rows)}</table>'


def _timeline(document: Mapping[str, Any]) -> str:
    links = document.get("links") or {}
    dashboard = links.get("grafanaDashboard")
    items = []
    # Each condition's terms (unit, rule) from the policies' targets: a decision's values in the signal's unit.
    terms = {
        (policy.get("name"), target.get("condition")): target
        for policy in document.get("policies", [])
        for target in policy.get("targets") or []
    }
    for decision in document.get("decisions", []):
        kind = str(decision.get("kind", ""))
        term = terms.get((decision.get("policy"), decision.get("condition")), {})
        unit = term.get("unit")
        evidence = ", ".join(
            f"{_time(point[0])[11:19]} {with_unit(point[1], unit)}"
            for point in decision.get("evidence", [])
            if isinstance(point, list) and len(point) == 2
        )
        actions = []
        for record in decision.get("action_records", []):
            detail = record.get("error") or record.get("detail") or ""
            actions.append(
                f"<li>{_e(action_text(record))}: "
                f'<b data-status="{_e(record.get("status"))}">{_e(record.get("status"))}</b> {_e(detail)}</li>'
            )
        link = ""
        if dashboard and isinstance(decision.get("at"), (int, float)):
            start, end = int((decision["at"] - 1800) * 1000), int((decision["at"] + 1800) * 1000)
            link = f' · <a href="{_e(dashboard)}?from={start}&amp;to={end}">Grafana</a>'
        items.append(
            f'<li class="{_e(kind)}" data-decision="{_e(decision.get("id"))}" data-kind="{_e(kind)}">'
            f'<span class="kind {_e(kind)}">{_e(kind)}</span> <b>{_e(decision.get("policy"))}</b> / '
            f"{_e(decision.get('condition'))} on {_e(_target(decision.get('target', [])))} at "
            f"{_e(_time(decision.get('at')))}{' (dry run)' if decision.get('dry_run') else ''}{link}"
            f"<div>{_e(decision.get('reason'))} · value {_e(with_unit(decision.get('value'), unit))}"
            f"{' (' + _e(condition_text(term)) + ')' if condition_text(term) else ''}</div>"
            f'<div class="evidence">evidence: {_e(evidence) or "-"}</div>'
            f'<ul class="actions">{"".join(actions)}</ul>'
            "</li>"
        )
    if not items:
        return '<p class="meta">no decisions yet</p>'
    return f'<ul class="timeline" id="timeline">{"".join(items)}</ul>'


def _health(document: Mapping[str, Any]) -> str:
    """First on the page: whether the controller can see (controller/core/source_health.py). A blind or degraded
    source is a red / orange banner naming since when, why and which policies; all up is one green line."""
    health = document.get("health") or {}
    sources = [source for source in health.get("sources", []) if isinstance(source, Mapping)]
    troubled = [source for source in sources if source.get("status") in ("blind", "degraded")]
    if not troubled:
        shown = ", ".join(f"{source.get('title')} up" for source in sources) or "no evaluation yet"
        return f'<div class="health up" id="health" data-health="up">sources: {_e(shown)}</div>'
    banners = []
    for source in sorted(troubled, key=lambda item: item.get("status") != "blind"):
        status = str(source.get("status"))
        affected = [str(name) for name in source.get("affected", [])]
        blind = set(source.get("blindPolicies", []))
        what = "unreachable" if status == "blind" else "failing for some queries"
        held = " (not evaluating on data: targets held, never acted on)" if blind else ""
        banners.append(
            f'<div class="health {_e(status)}" id="health-{_e(source.get("source"))}" data-health="{_e(status)}">'
            f"{_e(status.upper())} since {_e(_time(source.get('since'))[11:])}: {_e(source.get('title'))} {what}"
            f'<div class="detail">{"blind" if status == "blind" else "affected"}: '
            f"{_e(', '.join(affected) or '-')}{held}"
            f" · last error at {_e(_time(source.get('lastErrorAt'))[11:])}: {_e(source.get('lastError') or '-')}"
            f" · last answer {_e(_time(source.get('lastSuccessAt')))}</div></div>"
        )
    return "".join(banners)


def render_status_page(document: Mapping[str, Any]) -> str:
    """The whole page for one status document."""
    leader = document.get("leader") or {}
    links = document.get("links") or {}
    kill = document.get("killSwitch")
    banner = ""
    if kill:
        banner = (
            f'<div class="banner" id="kill-switch">every policy is paused (kill switch) by {_e(kill.get("by"))}: '
            f"{_e(kill.get('reason'))}</div>"
        )
    link_items = " · ".join(
        f'<a href="{_e(url)}">{_e(name)}</a>' for name, url in sorted(links.items()) if isinstance(url, str)
    )
    data = html.escape(json.dumps({"now": document.get("now")}), quote=False)
    return (
        "<!doctype html><html lang=en><head><meta charset=utf-8>"
        '<meta name=viewport content="width=device-width,initial-scale=1">'
        f"<title>tailguard status</title><style>{_CSS}{INCIDENT_CSS}</style></head><body>"
        f"<h1>tailguard status</h1><div class=meta>as of {_e(_time(document.get('now')))}"
        f"{' · leader ' + _e(leader.get('identity')) if leader.get('identity') else ''}"
        f"{' · ' + link_items if link_items else ''}</div>{_health(document)}{banner}"
        f"{incidents_section(document)}"
        f"<h2>Incidents: stage and next step</h2>{_incidents(document)}"
        f"<h2>Policies and targets</h2>{_policies(document)}"
        f"<h2>Recent decisions</h2>{_timeline(document)}"
        f'<script type="application/json" id="status-meta">{data}</script>'
        f"<script>{_SCRIPT}</script></body></html>"
    )


def dashboard_link(grafana_url: str | None, dashboard_uid: str) -> dict[str, str]:
    """The `links` of the status document from the notification links (settings `links`)."""
    if not grafana_url:
        return {}
    return {"grafanaDashboard": f"{grafana_url.rstrip('/')}/d/{quote(dashboard_uid)}"}
