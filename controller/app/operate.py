"""Operate a running controller: `tailguard status`, `tailguard pause`, `tailguard resume`, `tailguard abort`.

    tailguard status  --url URL [--token-file F] [--watch [SECONDS]] [--output table|json]
    tailguard status  --journal FILE [--output table|json]           (offline: the journal's states and decisions)
    tailguard pause   POLICY | --all  --url URL [--token-file F] [--by WHO] --reason WHY
    tailguard resume  POLICY | --all  --url URL [--token-file F] [--by WHO] [--reason WHY]
    tailguard abort   DECISION        --url URL [--token-file F] [--by WHO] --reason WHY

Exit codes: 0 done; 1 the controller refused or could not be reached (the message says why; an abort of a decision
that had already finished, or of an unknown one, too); 2 the command line.
A control is journaled by the controller with who (`--by`, default the local user) and why (`--reason`).
"""

from __future__ import annotations

import argparse
import getpass
import json
import sys
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any
from urllib.parse import quote

import requests

from controller.adapters.stores.incidents import SqliteIncidentStore
from controller.adapters.stores.journal import Journal, JournalError
from controller.core.controls import MAX_ABORT_REASON
from controller.core.status_view import incident_status, journal_policy_status
from controller.kit.errors import TailguardError

EXIT_OK = 0
EXIT_FAILED = 1
EXIT_USAGE = 2
TIMEOUT_SECONDS = 10.0


class OperateError(TailguardError):
    """The controller refused a request or could not be reached."""


def _connection(parser: argparse.ArgumentParser, *, journal: bool) -> None:
    where = parser.add_mutually_exclusive_group(required=True)
    where.add_argument("--url", help="the controller's API, e.g. http://tailguard.tailguard.svc:8080")
    if journal:
        where.add_argument("--journal", type=Path, help="read a journal file instead of a running controller")
    parser.add_argument("--token-file", type=Path, help="the bearer token (the controller's webhook token)")


def _token(path: Path | None) -> str | None:
    if path is None:
        return None
    try:
        return path.read_text(encoding="utf-8").strip() or None
    except OSError as unreadable:
        raise OperateError(f"{path}: cannot read the token: {unreadable.strerror or unreadable}") from None


def _request(
    method: str, url: str, token: str | None, body: Mapping[str, Any] | None = None, *, accept: Sequence[int] = (200,)
) -> Any:
    headers = {"Authorization": f"Bearer {token}"} if token else {}
    try:
        answer = requests.request(method, url, headers=headers, json=body, timeout=TIMEOUT_SECONDS)
    except requests.RequestException as failure:
        raise OperateError(f"{url}: {type(failure).__name__}: {failure}") from None
    try:
        value = answer.json()
    except ValueError:
        value = {"error": answer.text[:200]}
    if answer.status_code not in accept:
        error = value.get("error") if isinstance(value, dict) else None
        raise OperateError(f"{url}: HTTP {answer.status_code}: {error or value}")
    return value


def fetch_status(url: str, token: str | None) -> dict[str, Any]:
    value = _request("GET", url.rstrip("/") + "/api/v1/status", token)
    if not isinstance(value, dict):
        raise OperateError(f"{url}: the status is not a JSON object")
    return value


def journal_status(path: Path, decisions: int = 20) -> dict[str, Any]:
    if not path.exists():
        raise OperateError(f"{path}: no such journal")
    try:
        with Journal(path) as journal:
            controls = journal.load_controls()
            now = time.time()
            policies = [
                journal_policy_status(name, state, controls, now)
                for name in journal.policy_names()
                if (state := journal.load_state(name)) is not None
            ]
            killed = controls.killed
            return {
                "version": 1,
                "now": now,
                "leader": None,
                "killSwitch": killed.to_json() if killed is not None else None,
                "policies": policies,
                "decisions": journal.recent_decisions(decisions),
                "controls": journal.recent_controls(20),
                "links": {},
                "incidents": _journal_incidents(path),
            }
    except JournalError as unusable:
        raise OperateError(str(unusable)) from None


def _journal_incidents(path: Path) -> list[dict[str, Any]]:
    """The open incidents the journal's file holds (a run without `kubernetes.incidents`)."""
    store = SqliteIncidentStore(path)
    try:
        return [incident_status(incident) for incident in store.incidents(open_only=True)]
    finally:
        store.close()


def _fmt(value: Any) -> str:
    if value is None:
        return "-"
    if isinstance(value, float):
        return f"{value:.4g}"
    return str(value)


def _target(labels: Any) -> str:
    if isinstance(labels, Mapping):
        return ",".join(f"{k}={v}" for k, v in sorted(labels.items())) or "(all)"
    if isinstance(labels, list):
        return ",".join(f"{pair[0]}={pair[1]}" for pair in labels) or "(all)"
    return str(labels)


def _table(rows: Sequence[Sequence[str]]) -> str:
    widths = [max(len(row[i]) for row in rows) for i in range(len(rows[0]))]
    return "\n".join("  ".join(cell.ljust(width) for cell, width in zip(row, widths, strict=True)).rstrip()
                     for row in rows)  # fmt: skip


def format_status(document: Mapping[str, Any]) -> str:
    lines: list[str] = []
    kill = document.get("killSwitch")
    if kill:
        lines.append(f"KILL SWITCH: every policy paused by {kill.get('by')}: {kill.get('reason')}")
        lines.append("")
    rows = [["POLICY", "CONDITION", "TARGET", "PHASE", "VALUE", "THRESHOLD", "STREAK", "COOLDOWN", "STATE"]]
    for policy in document.get("policies", []):
        paused = policy.get("paused")
        state = f"paused by {paused.get('by')}" if paused else "suspended" if policy.get("suspend") else "active"
        if policy.get("dryRun"):
            state += ", dry run"
        for target in policy.get("targets") or [{}]:
            threshold = f"{target.get('op') or ''} {_fmt(target.get('threshold'))}".strip() if target else "-"
            rows.append(
                [
                    str(policy.get("name")),
                    str(target.get("condition", "-")),
                    _target(target.get("target", {})) if target else "-",
                    str(target.get("phase", "-")),
                    _fmt(target.get("value")),
                    threshold,
                    _fmt(target.get("streak")),
                    f"{_fmt(target.get('cooldownLeft'))}s" if target.get("cooldownLeft") else "-",
                    state,
                ]
            )
    lines.append(_table(rows))
    decisions = document.get("decisions", [])
    lines.append("")
    lines.append("LAST DECISIONS")
    drows = [["AT", "KIND", "POLICY", "CONDITION", "TARGET", "VALUE", "ACTIONS", "REASON"]]
    for decision in decisions[:10]:
        at = decision.get("at")
        when = time.strftime("%Y-%m-%d %H:%M:%S", time.gmtime(at)) if isinstance(at, (int, float)) else "-"
        actions = ",".join(
            f"{record.get('kind', record.get('type', '?'))}:{record.get('status')}"
            for record in decision.get("action_records", [])
        )
        drows.append(
            [
                when,
                str(decision.get("kind")),
                str(decision.get("policy")),
                str(decision.get("condition")),
                _target(decision.get("target", [])),
                _fmt(decision.get("value")),
                actions or "-",
                str(decision.get("reason", ""))[:60],
            ]
        )
    lines.append(_table(drows) if len(drows) > 1 else "(none)")
    lines.append("")
    lines.append("OPEN INCIDENTS")
    irows = [["INCIDENT", "SERVICE", "PHASE", "CAUSE", "ACTION", "STAGE", "NEXT"]]
    for incident in document.get("incidents", []):
        irows.append(
            [
                str(incident.get("id")),
                str(incident.get("service")),
                str(incident.get("phase")),
                str(incident.get("cause") or "-"),
                str(incident.get("action") or "-"),
                str(incident.get("stage", 0)),
                str(incident.get("next") or "-"),
            ]
        )
    lines.append(_table(irows) if len(irows) > 1 else "(none)")
    return "\n".join(lines) + "\n"


def status_main(argv: Sequence[str]) -> int:
    parser = argparse.ArgumentParser(prog="tailguard status", description="what the controller is doing now")
    _connection(parser, journal=True)
    parser.add_argument("--output", "-o", choices=("table", "json"), default="table")
    parser.add_argument(
        "--watch", nargs="?", type=float, const=5.0, default=None, metavar="SECONDS", help="refresh until Ctrl-C"
    )
    parser.add_argument("--count", type=int, default=None, help=argparse.SUPPRESS)  # refreshes, for tests
    args = parser.parse_args(list(argv))
    shown = 0
    try:
        while True:
            if args.journal is not None:
                document = journal_status(args.journal)
            else:
                document = fetch_status(args.url, _token(args.token_file))
            if args.output == "json":
                sys.stdout.write(json.dumps(document, indent=2, sort_keys=True) + "\n")
            else:
                if args.watch is not None and sys.stdout.isatty():
                    sys.stdout.write("\x1b[H\x1b[2J")
                sys.stdout.write(format_status(document))
            sys.stdout.flush()
            shown += 1
            if args.watch is None or (args.count is not None and shown >= args.count):
                return EXIT_OK
            time.sleep(max(0.1, args.watch))
    except OperateError as failed:
        print(f"tailguard status: {failed}", file=sys.stderr)
        return EXIT_FAILED
    except KeyboardInterrupt:
        return EXIT_OK


def _control_main(verb: str, argv: Sequence[str]) -> int:
    parser = argparse.ArgumentParser(prog=f"tailguard {verb}", description=f"{verb} a policy, or every policy")
    parser.add_argument("policy", nargs="?", metavar="POLICY")
    parser.add_argument("--all", action="store_true", help=f"{verb} every policy (the global kill switch)")
    _connection(parser, journal=False)
    parser.add_argument("--by", default=None, help="who (journaled; default: the local user name)")
    parser.add_argument("--reason", default="", help="why (journaled)")
    args = parser.parse_args(list(argv))
    if (args.policy is None) == (not args.all):
        parser.error("name one POLICY or --all")
    if verb == "pause" and not args.reason.strip():
        parser.error("--reason is required: say why (it is journaled with the pause)")
    path = "/api/v1/" + (verb if args.all else f"policies/{args.policy}/{verb}")
    try:
        by = args.by or getpass.getuser()
    except (KeyError, OSError):
        by = "unknown"
    try:
        body = {"by": by, "reason": args.reason}
        answer = _request("POST", args.url.rstrip("/") + path, _token(args.token_file), body)
    except OperateError as failed:
        print(f"tailguard {verb}: {failed}", file=sys.stderr)
        return EXIT_FAILED
    print(f"{verb}d {'every policy' if args.all else args.policy} (by {answer['control']['by']})")
    return EXIT_OK


def pause_main(argv: Sequence[str]) -> int:
    return _control_main("pause", argv)


def resume_main(argv: Sequence[str]) -> int:
    return _control_main("resume", argv)


def abort_main(argv: Sequence[str]) -> int:
    parser = argparse.ArgumentParser(
        prog="tailguard abort",
        description="stop a decision's actions: a traffic ramp or an Argo CD sync wait in flight stops at its next "
        "step; its queued or deferred actions never run",
    )
    parser.add_argument("decision", metavar="DECISION", help="the decision id (tailguard status, /api/v1/decisions)")
    _connection(parser, journal=False)
    parser.add_argument("--by", default=None, help="who (journaled; default: the local user name)")
    parser.add_argument("--reason", default="", help="why (required; journaled)")
    args = parser.parse_args(list(argv))
    if not args.decision.strip() or "/" in args.decision:
        parser.error(f"DECISION must be a decision id, got {args.decision!r}")
    if not args.reason.strip():
        parser.error("--reason is required: say why (it is journaled with the abort)")
    if len(args.reason.strip()) > MAX_ABORT_REASON:
        parser.error(f"--reason is {len(args.reason.strip())} characters; at most {MAX_ABORT_REASON}")
    try:
        by = args.by or getpass.getuser()
    except (KeyError, OSError):
        by = "unknown"
    url = f"{args.url.rstrip('/')}/api/v1/decisions/{quote(args.decision, safe='')}/abort"
    try:
        body = {"by": by, "reason": args.reason}
        answer = _request("POST", url, _token(args.token_file), body, accept=(200, 202))
    except OperateError as failed:
        print(f"tailguard abort: {failed}", file=sys.stderr)
        return EXIT_FAILED
    state = "in flight: stops at its next step" if answer.get("state") == "in_flight" else "cancelled"
    print(f"aborted {args.decision} ({state}; by {answer.get('by')}): {answer.get('message')}")
    for action in answer.get("actions", []):
        print(f"  {action.get('type')} on {action.get('resource')}: {action.get('status')}")
    return EXIT_OK
