"""Operate a running controller: `tailguard status|pause|resume|abort|incidents|logs` (also `kubectl tailguard ...`).

    tailguard status    [WHERE] [--watch [SECONDS]] [--output table|json]
    tailguard status    --journal FILE [--output table|json]          (offline: the journal's states and decisions)
    tailguard pause     POLICY | --all  [WHERE] [--by WHO] --reason WHY
    tailguard resume    POLICY | --all  [WHERE] [--by WHO] [--reason WHY]
    tailguard abort     DECISION        [WHERE] [--by WHO] --reason WHY
    tailguard incidents [WHERE] [--all] [--output table|json]       (open incidents: fired, not yet resolved)
    tailguard logs      [--tail N]                                   (the leader pod's log; through the cluster)

WHERE: `--url URL` (or $TAILGUARD_URL) for direct access, e.g. http://127.0.0.1:9464 after
`kubectl -n tailguard port-forward svc/tailguard 9464`; without either, the Kubernetes API's service proxy with your
kubeconfig (`--kubeconfig`, `--context`, `-n/--namespace` tailguard, `--service` tailguard, `--port` 9464:
controller/app/reach.py). `--token-file F`: the controller's bearer token; through the cluster it is read from the
Secret tailguard-alertmanager when your RBAC allows.

Exit codes: 0 done; 1 the controller refused or could not be reached (one line says why and what to try; an abort
of a decision that had already finished, or of an unknown one, too); 2 the command line.
`tailguard status` also says whether the controller can see (controller/core/source_health.py): exit 3 a source is
degraded (some queries fail), 4 a source is blind (every query fails; the first lines say since when, why and which
policies).
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

from tailguard.controller.adapters.stores.incidents import SqliteIncidentStore
from tailguard.controller.adapters.stores.journal import Journal, JournalError
from tailguard.controller.app.reach import (
    DEFAULT_NAMESPACE,
    DEFAULT_PORT,
    DEFAULT_SERVICE,
    URL_ENV,
    ControllerAddress,
    OperateError,
    call,
    resolve,
)
from tailguard.controller.core.controls import MAX_ABORT_REASON
from tailguard.controller.core.status_view import incident_status, journal_policy_status

EXIT_OK = 0
EXIT_FAILED = 1
EXIT_USAGE = 2
EXIT_DEGRADED = 3  # `tailguard status`: a source fails some queries
EXIT_BLIND = 4  # `tailguard status`: a source fails every query: the controller sees nothing there


def _connection(parser: argparse.ArgumentParser, *, journal: bool) -> None:
    where = parser.add_mutually_exclusive_group()
    where.add_argument(
        "--url", help=f"the controller's API, e.g. http://127.0.0.1:{DEFAULT_PORT} (default: ${URL_ENV}, else the "
        "service proxy of your kubeconfig)",
    )  # fmt: skip
    if journal:
        where.add_argument("--journal", type=Path, help="read a journal file instead of a running controller")
    parser.add_argument("--token-file", type=Path, help="the controller's bearer token (its webhook token)")
    cluster = parser.add_argument_group("through the cluster (no --url)")
    cluster.add_argument("--kubeconfig", default=None, help="kubeconfig file (default: $KUBECONFIG, ~/.kube/config)")
    cluster.add_argument("--context", default=None, help="kubeconfig context (default: the current one)")
    cluster.add_argument("--namespace", "-n", default=DEFAULT_NAMESPACE, help="the controller's namespace")
    cluster.add_argument("--service", default=DEFAULT_SERVICE, help="the controller's Service")
    cluster.add_argument("--port", default=DEFAULT_PORT, help="the Service's port (name or number)")


def _address(args: argparse.Namespace) -> ControllerAddress:
    return resolve(
        url=args.url,
        token_file=args.token_file,
        kubeconfig=args.kubeconfig,
        context=args.context,
        namespace=args.namespace,
        service=args.service,
        port=str(args.port),
    )


def fetch_status(address: ControllerAddress | str, token: str | None = None) -> dict[str, Any]:
    if isinstance(address, str):
        address = ControllerAddress(address.rstrip("/"), token)
    value = call(address, "GET", "/api/v1/status")
    if not isinstance(value, dict):
        raise OperateError(f"{address.where}: the status is not a JSON object")
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


def health_exit(document: Mapping[str, Any]) -> int:
    """The exit code `tailguard status` gives a status document: 4 when a source is blind, 3 when degraded."""
    status = (document.get("health") or {}).get("status")
    return {"blind": EXIT_BLIND, "degraded": EXIT_DEGRADED}.get(str(status), EXIT_OK)


def format_status(document: Mapping[str, Any]) -> str:
    lines: list[str] = []
    for source in (document.get("health") or {}).get("sources", []):
        # First: whether the controller can see (a blind source is why every phase below may be old).
        if source.get("status") != "up":
            lines.append(str(source.get("summary")))
    if lines:
        lines.append("")
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


def status_main(argv: Sequence[str], *, prog: str = "tailguard status") -> int:
    parser = argparse.ArgumentParser(prog=prog, description="what the controller is doing now")
    _connection(parser, journal=True)
    parser.add_argument("--output", "-o", choices=("table", "json"), default="table")
    parser.add_argument(
        "--watch", nargs="?", type=float, const=5.0, default=None, metavar="SECONDS", help="refresh until Ctrl-C"
    )
    parser.add_argument("--count", type=int, default=None, help=argparse.SUPPRESS)  # refreshes, for tests
    args = parser.parse_args(list(argv))
    shown = 0
    address: ControllerAddress | None = None
    try:
        if args.journal is None:
            address = _address(args)
        while True:
            if args.journal is not None:
                document = journal_status(args.journal)
            else:
                document = fetch_status(address if address is not None else _address(args))
            if args.output == "json":
                sys.stdout.write(json.dumps(document, indent=2, sort_keys=True) + "\n")
            else:
                if args.watch is not None and sys.stdout.isatty():
                    sys.stdout.write("\x1b[H\x1b[2J")
                sys.stdout.write(format_status(document))
            sys.stdout.flush()
            shown += 1
            if args.watch is None or (args.count is not None and shown >= args.count):
                return health_exit(document)
            time.sleep(max(0.1, args.watch))
    except OperateError as failed:
        print(f"{prog}: {failed}", file=sys.stderr)
        return EXIT_FAILED
    except KeyboardInterrupt:
        return EXIT_OK


def _control_main(verb: str, argv: Sequence[str], prog: str) -> int:
    parser = argparse.ArgumentParser(prog=prog, description=f"{verb} a policy, or every policy")
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
        answer = call(_address(args), "POST", path, body)
    except OperateError as failed:
        print(f"{prog}: {failed}", file=sys.stderr)
        return EXIT_FAILED
    print(f"{verb}d {'every policy' if args.all else args.policy} (by {answer['control']['by']})")
    return EXIT_OK


def pause_main(argv: Sequence[str], *, prog: str = "tailguard pause") -> int:
    return _control_main("pause", argv, prog)


def resume_main(argv: Sequence[str], *, prog: str = "tailguard resume") -> int:
    return _control_main("resume", argv, prog)


def abort_main(argv: Sequence[str], *, prog: str = "tailguard abort") -> int:
    parser = argparse.ArgumentParser(
        prog=prog,
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
    path = f"/api/v1/decisions/{quote(args.decision, safe='')}/abort"
    try:
        body = {"by": by, "reason": args.reason}
        answer = call(_address(args), "POST", path, body, accept=(200, 202))
    except OperateError as failed:
        print(f"{prog}: {failed}", file=sys.stderr)
        return EXIT_FAILED
    state = "in flight: stops at its next step" if answer.get("state") == "in_flight" else "cancelled"
    print(f"aborted {args.decision} ({state}; by {answer.get('by')}): {answer.get('message')}")
    for action in answer.get("actions", []):
        print(f"  {action.get('type')} on {action.get('resource')}: {action.get('status')}")
    return EXIT_OK
