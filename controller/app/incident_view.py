"""The status page's incident view: each open incident (a target firing) told as a person needs it in the minute it
matters: what fired and why, in the signal's unit ("p99-e2e-latency 1.2 s, fires when > 800 ms for 2 evaluations"),
the evidence as a small sparkline with the threshold, the action with its detail (revision from -> to, image,
weights, floor), the rollout it blamed, what ends it ("recovers when <= 800 ms for 2 evaluations"), when the next
action may come ("cooldown 9 m 52 s"), and the exact commands to pause the policy or abort the decision.

Pure: HTML from the status document (controller/core/status_view.py), every value escaped, no script, no external
asset. Values read from action records are shown as they are: the adapters' plans and results name
`from_revision`/`to_revision` (Argo CD, Deployments, the local tier), `from`/`to` (replicas, weights).
"""

from __future__ import annotations

import datetime
import html
from collections.abc import Mapping, Sequence
from typing import Any

SPARK_WIDTH, SPARK_HEIGHT = 180, 40


def _e(value: Any) -> str:
    return html.escape("" if value is None else str(value), quote=True)


def human_duration(seconds: Any) -> str:
    """9 m 52 s, 2 h 5 m, 45 s; '-' for nothing."""
    if not isinstance(seconds, (int, float)) or seconds <= 0:
        return "-"
    whole = round(seconds)
    hours, rest = divmod(whole, 3600)
    minutes, secs = divmod(rest, 60)
    if hours:
        return f"{hours} h {minutes} m"
    if minutes:
        return f"{minutes} m {secs} s"
    return f"{secs} s"


def with_unit(value: Any, unit: str | None) -> str:
    """A value in its unit: seconds below one as ms, ratios and probabilities as percent, bytes in binary units."""
    if not isinstance(value, (int, float)):
        return "-"
    number = float(value)
    if unit == "s":
        return f"{number * 1000:.0f} ms" if abs(number) < 1 else f"{number:.3g} s"
    if unit in ("ratio", "probability"):
        return f"{number * 100:.3g} %"
    if unit == "%":
        return f"{number:.3g} %"
    if unit == "B":
        for name, size in (("GiB", 1 << 30), ("MiB", 1 << 20), ("KiB", 1 << 10)):
            if abs(number) >= size:
                return f"{number / size:.3g} {name}"
        return f"{number:.0f} B"
    return f"{number:.4g}"


def condition_text(target: Mapping[str, Any]) -> str:
    """"fires when > 800 ms for 2 evaluations" (the threshold as a rule, never as a comparison with the value)."""
    if target.get("op") is None:
        return ""
    text = f"fires when {target['op']} {with_unit(target.get('threshold'), target.get('unit'))}"
    return f"{text} for {target['for']}" if target.get("for") else text


def recovery_text(target: Mapping[str, Any]) -> str:
    if target.get("recoverOp") is None:
        return ""
    text = f"recovers when {target['recoverOp']} {with_unit(target.get('recoverThreshold'), target.get('unit'))}"
    return f"{text} for {target['recoverFor']}" if target.get("recoverFor") else text


def sparkline(evidence: Sequence[Any], threshold: Any, unit: str | None) -> str:
    """The evidence (time, value) as an inline SVG polyline, the threshold dashed; '' without two points."""
    points = [(float(p[0]), float(p[1])) for p in evidence if isinstance(p, (list, tuple)) and len(p) == 2]
    if len(points) < 2:
        return ""
    values = [v for _, v in points] + ([float(threshold)] if isinstance(threshold, (int, float)) else [])
    low, high = min(values), max(values)
    span = (high - low) or 1.0
    start, end = points[0][0], points[-1][0]
    width = (end - start) or 1.0

    def xy(t: float, v: float) -> str:
        x = 2 + (t - start) / width * (SPARK_WIDTH - 4)
        y = SPARK_HEIGHT - 3 - (v - low) / span * (SPARK_HEIGHT - 6)
        return f"{x:.1f},{y:.1f}"

    line = " ".join(xy(t, v) for t, v in points)
    rule = ""
    if isinstance(threshold, (int, float)):
        y = xy(start, float(threshold)).split(",")[1]
        rule = f'<line x1="0" x2="{SPARK_WIDTH}" y1="{y}" y2="{y}" stroke="#9b1c1c" stroke-dasharray="3 2"/>'
    title = f"{len(points)} points, {with_unit(points[0][1], unit)} -> {with_unit(points[-1][1], unit)}"
    return (
        f'<svg class="spark" width="{SPARK_WIDTH}" height="{SPARK_HEIGHT}" viewBox="0 0 {SPARK_WIDTH} {SPARK_HEIGHT}"'
        f' role="img" aria-label="{_e(title)}"><title>{_e(title)}</title>{rule}'
        f'<polyline fill="none" stroke="#1d4ed8" stroke-width="1.5" points="{line}"/></svg>'
    )


def _detail_of(record: Mapping[str, Any]) -> dict[str, Any]:
    merged: dict[str, Any] = {}
    for part in ("params", "plan", "result"):
        value = record.get(part)
        if isinstance(value, Mapping):
            merged.update(value)
    return merged


def _revision(value: Any) -> str:
    text = str(value)
    return text if not text.isdigit() else f"r{text}"


def action_text(record: Mapping[str, Any]) -> str:
    """One action with its detail: `rollback chat: r2 -> r1 (image vllm:0.6.3)`, `scale chat: floor 2 -> 3`,
    `shift_traffic chat: weights {stable: 100, canary: 0}`."""
    kind = str(record.get("type") or record.get("kind") or "action")
    detail = _detail_of(record)
    service = detail.get("service") or record.get("resource") or ""
    parts: list[str] = []
    if "from_revision" in detail or "to_revision" in detail:
        parts.append(f"{_revision(detail.get('from_revision', '?'))} -> {_revision(detail.get('to_revision', '?'))}")
    for key in ("image", "to_image"):
        if detail.get(key):
            parts.append(f"image {detail[key]}")
            break
    moved = detail.get("from"), detail.get("to")
    if isinstance(moved[0], Mapping) and isinstance(moved[1], Mapping):
        for name in sorted(set(moved[0]) | set(moved[1])):
            parts.append(f"{name} {moved[0].get(name, '-')} -> {moved[1].get(name, '-')}")
    elif moved[0] is not None or moved[1] is not None:
        parts.append(f"{moved[0]} -> {moved[1]}")
    if detail.get("weights"):
        parts.append(f"weights {detail['weights']}")
    for key, label in (("minReplicas", "floor"), ("min", "floor"), ("delta", "by"), ("max", "at most")):
        if key in detail and not isinstance(detail[key], Mapping):
            parts.append(f"{label} {detail[key]}")
    return f"{kind} {service}: {', '.join(parts)}" if parts else f"{kind} {service}".strip()


def _time(at: Any) -> str:
    if not isinstance(at, (int, float)):
        return "-"
    return datetime.datetime.fromtimestamp(float(at), datetime.UTC).strftime("%H:%M:%SZ")


def next_action_text(policy: Mapping[str, Any], target: Mapping[str, Any], kill: Any) -> str:
    if kill:
        return f"none while the kill switch is on (by {kill.get('by')}: {kill.get('reason')})"
    pause = policy.get("policyPause") or policy.get("paused")
    if pause:
        return f"none while the policy is paused (by {pause.get('by')}: {pause.get('reason')})"
    if policy.get("suspend"):
        return "none: the policy is suspended (spec.suspend)"
    cooldown = target.get("cooldownLeft")
    if isinstance(cooldown, (int, float)) and cooldown > 0:
        return f"cooldown {human_duration(cooldown)} (then, if it still breaches)"
    budget, used = target.get("budget"), target.get("budgetUsed")
    if isinstance(budget, int) and isinstance(used, int) and used >= budget:
        return f"none this hour: the action budget is spent ({used}/{budget})"
    return "at the next evaluation, if it still breaches"


def incidents_section(document: Mapping[str, Any]) -> str:
    decisions = {d.get("id"): d for d in document.get("decisions", []) if d.get("kind") == "fire"}
    kill = document.get("killSwitch")
    cards: list[str] = []
    for policy in document.get("policies", []):
        for target in policy.get("targets") or []:
            if target.get("phase") != "firing":
                continue
            cards.append(_card(policy, target, decisions.get(target.get("decisionId")) or {}, kill))
    if not cards:
        return '<h2>Open incidents</h2><p class="meta" id="no-incidents">none: nothing is firing</p>'
    return f'<h2>Open incidents</h2><div id="incidents">{"".join(cards)}</div>'


def _card(policy: Mapping[str, Any], target: Mapping[str, Any], decision: Mapping[str, Any], kill: Any) -> str:
    name = str(policy.get("name"))
    labels = target.get("target") or {}
    where = ",".join(f"{k}={v}" for k, v in sorted(labels.items())) if isinstance(labels, Mapping) else str(labels)
    unit = target.get("unit")
    decision_id = decision.get("id") or target.get("decisionId") or "DECISION"
    records = decision.get("action_records") or []
    actions = "".join(
        f'<li data-action="{_e(r.get("type"))}">{_e(action_text(r))}: <b data-status="{_e(r.get("status"))}">'
        f"{_e(r.get('status'))}</b>{' (dry run)' if r.get('dry_run') else ''}"
        f"{' · ' + _e(r.get('error')) if r.get('error') else ''}</li>"
        for r in records
    ) or "".join(
        f"<li>{_e(action_text({'type': a.get('type'), 'params': a.get('params')}))}: queued</li>"
        for a in decision.get("actions", [])
    )
    blamed = next(
        (str(_detail_of(r).get("rollout_revision")) for r in records if _detail_of(r).get("rollout_revision")), ""
    )
    blamed_text = (
        f"rollout {_e(_revision(blamed))} of {_e(where)} (the breach began in its attribution window)"
        if blamed and blamed != "none"
        else "none: no rollout in the attribution window"
    )
    since = target.get("firedAt") or decision.get("fired_at")
    paused = policy.get("policyPause")
    pause_badge = (
        f' <span class="phase paused" data-badge="policy-paused">policy paused by {_e(paused.get("by"))}: '
        f"{_e(paused.get('reason'))}</span>"
        if paused
        else ""
    )
    kill_badge = ' <span class="phase paused" data-badge="kill-switch">kill switch on</span>' if kill else ""
    resume = f"kubectl tailguard resume {name}" if paused else f'kubectl tailguard pause {name} --reason "..."'
    return (
        f'<section class="incident" data-incident="{_e(decision_id)}" data-policy="{_e(name)}">'
        f'<h3><span class="phase firing">firing</span> {_e(name)} / {_e(target.get("condition"))} on '
        f"{_e(where)}{pause_badge}{kill_badge}</h3>"
        f'<div class="why"><b>{_e(target.get("signal") or target.get("condition"))}</b> '
        f'<span data-value>{_e(with_unit(target.get("value"), unit))}</span> · '
        f'<span data-rule>{_e(condition_text(target))}</span> · since {_e(_time(since))}</div>'
        f"{sparkline(decision.get('evidence') or [], target.get('threshold'), unit)}"
        f'<dl><dt>action</dt><dd><ul class="actions">{actions or "<li>none</li>"}</ul></dd>'
        f"<dt>blamed</dt><dd data-blamed>{blamed_text}</dd>"
        f"<dt>ends when</dt><dd data-ends>{_e(recovery_text(target) or 'the condition stops holding')}</dd>"
        f"<dt>next action</dt><dd data-next>{_e(next_action_text(policy, target, kill))}</dd>"
        f"<dt>to stop it</dt><dd><code data-command=pause>{_e(resume)}</code><br>"
        f'<code data-command=abort>kubectl tailguard abort {_e(decision_id)} --reason "..."</code></dd></dl>'
        "</section>"
    )


INCIDENT_CSS = """
.incident{background:#fff;border-left:5px solid #dc2626;padding:.6rem .9rem;margin:0 0 .8rem;box-shadow:0 1px 2px #0002}
.incident h3{font-size:1rem;margin:0 0 .3rem}.incident .why{margin:.2rem 0 .4rem}
.incident dl{display:grid;grid-template-columns:7.5rem 1fr;gap:.2rem .6rem;margin:.4rem 0 0;font-size:.85rem}
.incident dt{color:#5b6570}.incident dd{margin:0}.incident code{background:#eef0f3;padding:.05rem .3rem}
.spark{display:block;margin:.2rem 0}
"""
