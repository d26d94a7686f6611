"""`tailguard report --decision ID --journal FILE [--config controller.yaml] [--out DIR]`: the incident report
(controller/tools/incident_report.py: incident.md, incident.png, incident.json) for any journaled incident.

From the journal: the decision's fire (policy, condition, target, onset, fire time, threshold, evidence), its
resolve, and its actions (a rollback's finish time, its target revision and the rollout it blamed). With
`--config`, the signal's series around the incident from the configuration's Prometheus (the policy's own query,
from 10 minutes before the onset to 5 minutes after the resolution), else the evidence alone. The rollout's time is
not in the journal: `--rollout-at T` (epoch seconds or RFC3339) names it, with the source the report then states.

Exit codes: 0 written; 1 the decision is not in the journal or Prometheus could not answer; 2 the command line.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from tailguard.controller.adapters.metrics.prometheus import PrometheusSource
from tailguard.controller.adapters.stores.journal import Journal, JournalError
from tailguard.controller.app.settings import SettingsError, load_settings
from tailguard.controller.core.model import target_key
from tailguard.controller.core.policy_files import load_policies
from tailguard.controller.core.signals import render_signal_queries
from tailguard.controller.kit.cli_args import UsageError, parse_time
from tailguard.controller.kit.clock import SystemClock
from tailguard.controller.kit.errors import InputError
from tailguard.controller.tools.incident_report import IncidentTimeline, write_report

EXIT_OK = 0
EXIT_FAILED = 1
EXIT_USAGE = 2
BEFORE_ONSET_SECONDS = 600.0
AFTER_RESOLUTION_SECONDS = 300.0


class ReportError(InputError):
    """One line: what is missing and what to try."""


def _rollback_of(records: Sequence[Any]) -> tuple[float | None, str | None, str | None]:
    """(finished at, to revision, blamed revision) of the decision's rollback, if it has one."""
    for record in records:
        if record.type.value != "rollback":
            continue
        detail = {**(record.params or {}), **(record.plan or {}), **(record.result or {})}
        to = detail.get("to_revision")
        blamed = detail.get("rollout_revision")
        return (
            record.finished_at,
            (f"r{to}" if str(to).isdigit() else str(to)) if to is not None else None,
            (f"r{blamed}" if str(blamed).isdigit() else str(blamed)) if blamed not in (None, "none") else None,
        )
    return None, None, None


def _series(config: Path, fire: dict[str, Any], end: float) -> tuple[list[tuple[float, float]], str]:
    settings = load_settings(config)
    loaded, errors = load_policies([str(path) for path in settings.policy_paths()])
    policy = next((entry.policy for entry in loaded if entry.policy.name == fire["policy"]), None)
    if policy is None:
        problem = f"; {errors[0]}" if errors else ""
        raise ReportError(f"{config}: no policy named {fire['policy']!r} among its policies{problem}")
    condition = next(c for c in policy.conditions if c.name == fire["condition"])
    query = render_signal_queries(policy).get(condition.signal)
    if query is None:
        raise ReportError(f"{fire['policy']}/{condition.signal} is a prediction signal: no series to plot")
    start = float(fire["onset"]) - BEFORE_ONSET_SECONDS
    step = max(1.0, (end - start) / 600)
    with PrometheusSource(settings.prometheus, SystemClock()) as source:
        answer = source.range(query, policy.targets.groupBy, start, end, step)
    if answer.error is not None:
        raise ReportError(f"Prometheus could not answer {condition.signal}'s query: {answer.error}")
    samples = answer.series.get(target_key(fire["target"]), {})
    return sorted(samples.items()), condition.signal


def build_timeline(
    journal_path: Path, decision_id: str, config: Path | None, rollout_at: float | None, rollout_source: str | None
) -> IncidentTimeline:
    if not journal_path.exists():
        raise ReportError(f"{journal_path}: no such journal")
    try:
        with Journal(journal_path) as journal:
            fire = journal.decision(decision_id, "fire")
            resolve = journal.decision(decision_id, "resolve")
            records = journal.actions_for(decision_id)
    except JournalError as unusable:
        raise ReportError(str(unusable)) from None
    if fire is None:
        raise ReportError(
            f"no fired decision {decision_id!r} in {journal_path} (list them: tailguard status --journal "
            f"{journal_path}, or kubectl tailguard incidents --all)"
        )
    rollback_at, rollback_to, blamed = _rollback_of(records)
    resolved_at = resolve.get("resolved_at") if resolve is not None else None
    evidence = tuple((float(at), float(value)) for at, value in fire.get("evidence", []))
    series: list[tuple[float, float]] = list(evidence)
    signal = str(fire["condition"])
    if config is not None:
        end = (resolved_at or rollback_at or float(fire["at"])) + AFTER_RESOLUTION_SECONDS
        series, signal = _series(config, fire, end)
    target = ",".join(f"{k}={v}" for k, v in sorted(dict(fire.get("target") or {}).items())) or "(all)"
    return IncidentTimeline(
        policy=str(fire["policy"]),
        condition=str(fire["condition"]),
        service=target,
        threshold_seconds=float(fire["threshold"]),
        series=series,
        rollout_at=rollout_at,
        rollout_revision=blamed,
        onset_at=fire.get("onset"),
        fired_at=fire.get("fired_at") or fire.get("at"),
        rollback_at=rollback_at,
        rollback_to=rollback_to,
        resolved_at=resolved_at,
        decision_id=decision_id,
        notes=(f"reason: {fire.get('reason')}",) if fire.get("reason") else (),
        rollout_source=rollout_source if rollout_at is not None else None,
        evidence=evidence,
        signal=signal,
    )


def report_main(argv: Sequence[str]) -> int:
    parser = argparse.ArgumentParser(
        prog="tailguard report", description="write the incident report of a journaled decision"
    )
    parser.add_argument("--decision", required=True, metavar="ID", help="the decision id (a fire)")
    parser.add_argument("--journal", required=True, type=Path, help="the controller's journal (journal.db)")
    parser.add_argument("--config", type=Path, default=None, help="controller.yaml: plot the signal from Prometheus")
    parser.add_argument("--rollout-at", default=None, metavar="T", help="the rollout's time (epoch or RFC3339)")
    parser.add_argument(
        "--rollout-source", default="given on the command line (--rollout-at)", help="what stamped --rollout-at"
    )
    parser.add_argument("--out", type=Path, default=Path("incident-report"), help="directory for the report")
    args = parser.parse_args(list(argv))
    try:
        rollout_at = parse_time(args.rollout_at, "--rollout-at") if args.rollout_at is not None else None
    except UsageError as bad:
        parser.error(str(bad))
    try:
        timeline = build_timeline(args.journal, args.decision, args.config, rollout_at, args.rollout_source)
    except (ReportError, SettingsError) as failed:
        message = "; ".join(str(e) for e in failed.errors) if isinstance(failed, SettingsError) else str(failed)
        print(f"tailguard report: {message}", file=sys.stderr)
        return EXIT_FAILED
    paths = write_report(timeline, args.out)
    print(f"wrote {paths['markdown']}, {paths['png']}, {paths['json']}")
    return EXIT_OK
