"""`kubectl tailguard`: the operator commands as a kubectl plugin (an executable named `kubectl-tailguard` on PATH).

    kubectl tailguard status                          # through the Kubernetes API's service proxy (your kubeconfig)
    kubectl tailguard pause p99-rollback --reason "INC-7: investigating"
    kubectl tailguard resume p99-rollback
    kubectl tailguard abort DECISION --reason "rolling forward instead"
    kubectl tailguard incidents                       # open incidents: fired, not yet resolved
    kubectl tailguard logs --tail 50                  # the leader pod's log
    kubectl tailguard status --url http://127.0.0.1:9464   # direct (or TAILGUARD_URL), e.g. after a port-forward
    kubectl tailguard completion bash > /etc/bash_completion.d/kubectl-tailguard
    kubectl tailguard --version

status, pause, resume and abort are controller/app/operate.py's commands; incidents reads `/api/v1/decisions`
(the newest decision of each policy, condition and target: a `fire` is an open incident until its `resolve`);
logs finds the leader in the Lease `tailguard-leader` (its holder is the pod's name) and reads that pod's log.
Completion: argcomplete (`completion bash|zsh|fish` prints the shell code for `kubectl-tailguard` and
`tailguard`); kubectl >= 1.26 completes a plugin through an executable `kubectl_complete-tailguard`, which
`completion kubectl` prints.
"""

from __future__ import annotations

import argparse
import datetime
import json
import sys
from collections.abc import Callable, Mapping, Sequence
from importlib import metadata
from typing import Any
from urllib.parse import quote

from tailguard.controller.app import operate
from tailguard.controller.app.reach import (
    DEFAULT_NAMESPACE,
    OperateError,
    call,
    load_kube_access,
    send,
)

EXIT_OK = 0
EXIT_FAILED = 1
EXIT_USAGE = 2
PROG = "kubectl tailguard"
LEASE_NAME = "tailguard-leader"  # deploy/base/controller.yaml leaderElection.leaseName
CONTAINER = "controller"  # deploy/base/deployment.yaml
DECISIONS_READ = 500

# The commands and their one-line help (each parses its own arguments; the top-level parser below repeats their
# options only for --help and completion).
COMMANDS: dict[str, str] = {
    "status": "what the controller is doing now (policies, targets, last decisions)",
    "pause": "pause a policy (or --all: the kill switch)",
    "resume": "resume a paused policy (or --all)",
    "abort": "stop a decision's actions (a ramp or sync wait in flight)",
    "incidents": "open incidents (fired, not yet resolved); --all: recent ones too",
    "logs": "the leader pod's log",
    "completion": "print shell completion code (bash, zsh, fish, kubectl)",
}


def version() -> str:
    try:
        return metadata.version("tailguard")
    except metadata.PackageNotFoundError:
        return "unknown (not installed)"


def _parser(prog: str) -> argparse.ArgumentParser:
    """The top-level parser (for --help, --version and completion); each command parses its own arguments."""
    parser = argparse.ArgumentParser(
        prog=prog,
        description="Operate the tailguard controller from your laptop: through the Kubernetes API's service proxy "
        "with your kubeconfig (RBAC: get/create on services/proxy in the controller's namespace), or directly "
        "with --url / TAILGUARD_URL.",
        epilog="examples:\n  "
        + "\n  ".join(
            line.strip() for line in (__doc__ or "").splitlines()[2:11] if line.strip().startswith("kubectl tailguard")
        ),
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--version", action="version", version=f"%(prog)s {version()}")
    commands = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)
    for name, summary in COMMANDS.items():
        sub = commands.add_parser(name, help=summary, add_help=False)
        if name in ("pause", "resume"):
            sub.add_argument("policy", nargs="?")
            sub.add_argument("--all", action="store_true")
            sub.add_argument("--reason")
        if name == "abort":
            sub.add_argument("decision")
            sub.add_argument("--reason")
        if name == "completion":
            sub.add_argument("shell", choices=("bash", "zsh", "fish", "kubectl"))
        if name == "logs":
            for option in ("--kubeconfig", "--context", "--namespace", "--lease", "--tail"):
                sub.add_argument(option)
        elif name != "completion":
            for option in ("--url", "--token-file", "--kubeconfig", "--context", "--namespace", "--service", "--port"):
                sub.add_argument(option)
            if name in ("status", "incidents"):
                sub.add_argument("--output", "-o", choices=("table", "json"))
            if name != "incidents" and name != "status":
                sub.add_argument("--by")
    return parser


def main(argv: Sequence[str] | None = None, *, prog: str = PROG) -> int:
    args = list(sys.argv[1:] if argv is None else argv)
    parser = _parser(prog)
    _autocomplete(parser)
    if not args or args[0] in ("-h", "--help", "--version") or args[0] not in (*COMMANDS, "__complete"):
        parser.parse_args(args)  # prints help, the version, or the usage error (exit 0 or 2)
        return EXIT_USAGE
    command, rest = args[0], args[1:]
    if command == "__complete":  # kubectl's plugin completion (kubectl_complete-tailguard)
        sys.stdout.write("".join(f"{candidate}\n" for candidate in complete(rest)) + f":{NO_FILE_COMPLETION}\n")
        return EXIT_OK
    runners: dict[str, Callable[[Sequence[str]], int]] = {
        "status": lambda a: operate.status_main(a, prog=f"{prog} status"),
        "pause": lambda a: operate.pause_main(a, prog=f"{prog} pause"),
        "resume": lambda a: operate.resume_main(a, prog=f"{prog} resume"),
        "abort": lambda a: operate.abort_main(a, prog=f"{prog} abort"),
        "incidents": lambda a: incidents_main(a, prog=f"{prog} incidents"),
        "logs": lambda a: logs_main(a, prog=f"{prog} logs"),
        "completion": lambda a: completion_main(a, prog=f"{prog} completion"),
    }
    return runners[command](rest)


def _autocomplete(parser: argparse.ArgumentParser) -> None:
    """Answer a shell's completion request (argcomplete sets _ARGCOMPLETE) and exit; otherwise nothing."""
    try:
        import argcomplete
    except ModuleNotFoundError:  # completion is a convenience: the commands work without it
        return
    argcomplete.autocomplete(parser)


# -- incidents -------------------------------------------------------------------------------------------------


def open_incidents(decisions: Sequence[Mapping[str, Any]]) -> list[dict[str, Any]]:
    """Of decisions newest first: each (policy, condition, target) whose newest fire/resolve is a fire."""
    seen: set[str] = set()
    found: list[dict[str, Any]] = []
    for decision in decisions:
        if decision.get("kind") not in ("fire", "resolve"):
            continue
        key = json.dumps([decision.get("policy"), decision.get("condition"), decision.get("target")], sort_keys=True)
        if key in seen:
            continue
        seen.add(key)
        if decision.get("kind") == "fire":
            found.append(dict(decision))
    return found


def _when(at: Any) -> str:
    if not isinstance(at, (int, float)):
        return "-"
    return datetime.datetime.fromtimestamp(float(at), datetime.UTC).strftime("%Y-%m-%d %H:%M:%SZ")


def format_incidents(incidents: Sequence[Mapping[str, Any]], *, resolved: Sequence[Mapping[str, Any]] = ()) -> str:
    rows = [["SINCE", "POLICY", "CONDITION", "TARGET", "VALUE", "ACTIONS", "DECISION"]]
    for incident in incidents:
        actions = ",".join(
            f"{record.get('type', '?')}:{record.get('status')}" for record in incident.get("action_records", [])
        )
        rows.append(
            [
                _when(incident.get("fired_at") or incident.get("at")),
                str(incident.get("policy")),
                str(incident.get("condition")),
                operate._target(incident.get("target", {})),
                operate._fmt(incident.get("value")),
                actions or "-",
                str(incident.get("id")),
            ]
        )
    lines = ["OPEN INCIDENTS", operate._table(rows) if len(rows) > 1 else "(none)"]
    if resolved:
        done = [["RESOLVED", "POLICY", "CONDITION", "TARGET", "DECISION"]]
        for decision in resolved:
            done.append(
                [
                    _when(decision.get("resolved_at") or decision.get("at")),
                    str(decision.get("policy")),
                    str(decision.get("condition")),
                    operate._target(decision.get("target", {})),
                    str(decision.get("id")),
                ]
            )
        lines += ["", "RECENTLY RESOLVED", operate._table(done)]
    return "\n".join(lines) + "\n"


def incidents_main(argv: Sequence[str], *, prog: str = "tailguard incidents") -> int:
    parser = argparse.ArgumentParser(prog=prog, description="open incidents: decisions that fired and did not resolve")
    operate._connection(parser, journal=False)
    parser.add_argument("--all", action="store_true", help="the recently resolved ones too")
    parser.add_argument("--output", "-o", choices=("table", "json"), default="table")
    args = parser.parse_args(list(argv))
    try:
        decisions = call(operate._address(args), "GET", f"/api/v1/decisions?limit={DECISIONS_READ}")
    except OperateError as failed:
        print(f"{prog}: {failed}", file=sys.stderr)
        return EXIT_FAILED
    if not isinstance(decisions, list):
        print(f"{prog}: the controller's decisions are not a JSON list", file=sys.stderr)
        return EXIT_FAILED
    incidents = open_incidents(decisions)
    resolved = [d for d in decisions if d.get("kind") == "resolve"][:10] if args.all else []
    if args.output == "json":
        sys.stdout.write(json.dumps({"open": incidents, "resolved": resolved}, indent=2, sort_keys=True) + "\n")
    else:
        sys.stdout.write(format_incidents(incidents, resolved=resolved))
    return EXIT_OK


# -- logs ------------------------------------------------------------------------------------------------------


def logs_main(argv: Sequence[str], *, prog: str = "tailguard logs") -> int:
    parser = argparse.ArgumentParser(
        prog=prog,
        description="the leader pod's log (the holder of the Lease tailguard-leader); needs get on leases and "
        "pods/log in the controller's namespace",
    )
    parser.add_argument("--kubeconfig", default=None)
    parser.add_argument("--context", default=None)
    parser.add_argument("--namespace", "-n", default=DEFAULT_NAMESPACE)
    parser.add_argument("--lease", default=LEASE_NAME, help="the leader's Lease (leaderElection.leaseName)")
    parser.add_argument("--tail", type=int, default=100, help="lines from the end (default 100)")
    args = parser.parse_args(list(argv))
    try:
        kube = load_kube_access(args.kubeconfig, args.context, args.namespace, "", "")
        namespace = quote(args.namespace, safe="")
        lease_path = f"/apis/coordination.k8s.io/v1/namespaces/{namespace}/leases/{quote(args.lease, safe='')}"
        lease = send("GET", kube.api_url(lease_path), kube, {}, None)
        if lease.status_code != 200:
            raise OperateError(
                f"cannot read the Lease {args.namespace}/{args.lease} (HTTP {lease.status_code}): is tailguard "
                f"running there with leader election? (-n NAMESPACE, --lease NAME)"
            )
        holder = (lease.json().get("spec") or {}).get("holderIdentity")
        if not holder:
            raise OperateError(f"the Lease {args.namespace}/{args.lease} has no holder: no leader right now")
        log_path = (
            f"/api/v1/namespaces/{namespace}/pods/{quote(holder, safe='')}/log?container={CONTAINER}"
            f"&tailLines={max(1, args.tail)}"
        )
        answer = send("GET", kube.api_url(log_path), kube, {}, None)
        if answer.status_code != 200:
            raise OperateError(
                f"cannot read the log of the leader pod {args.namespace}/{holder} (HTTP {answer.status_code}): "
                f"check `kubectl auth can-i get pods/log -n {args.namespace}`"
            )
    except OperateError as failed:
        print(f"{prog}: {failed}", file=sys.stderr)
        return EXIT_FAILED
    sys.stderr.write(f"# leader: {args.namespace}/{holder}\n")
    sys.stdout.write(answer.text if answer.text.endswith("\n") or not answer.text else answer.text + "\n")
    return EXIT_OK


# -- completion ------------------------------------------------------------------------------------------------

KUBECTL_COMPLETE = """#!/bin/sh
# kubectl >= 1.26 runs `kubectl_complete-tailguard ARGS... PARTIAL` to complete `kubectl tailguard ARGS... PARTIAL`
# (one candidate a line, then `:DIRECTIVE`): put this file on PATH, executable, next to kubectl-tailguard.
exec kubectl-tailguard __complete "$@"
"""
NO_FILE_COMPLETION = 4  # cobra's ShellCompDirectiveNoFileComp


def complete(words: Sequence[str]) -> list[str]:
    """Candidates for the last of `words` (the word being typed), given the ones before it."""
    *before, partial = list(words) or [""]
    parser = _parser(PROG)
    if not before:
        return sorted(name for name in COMMANDS if name.startswith(partial))
    subparsers = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
    command = subparsers.choices.get(before[0])
    if command is None:
        return []
    for action in command._actions:
        if before[-1] in action.option_strings and action.choices:
            return sorted(str(choice) for choice in action.choices if str(choice).startswith(partial))
        if not action.option_strings and action.choices and len(before) == 1:
            return sorted(str(choice) for choice in action.choices if str(choice).startswith(partial))
    options = [option for action in command._actions for option in action.option_strings if option.startswith("--")]
    return sorted(option for option in options if option.startswith(partial)) if partial.startswith("-") else []


def completion_main(argv: Sequence[str], *, prog: str = "kubectl tailguard completion") -> int:
    parser = argparse.ArgumentParser(
        prog=prog,
        description="shell completion: `eval \"$(kubectl-tailguard completion bash)\"` in ~/.bashrc; `kubectl` prints "
        "kubectl_complete-tailguard for `kubectl tailguard <TAB>`",
    )
    parser.add_argument("shell", choices=("bash", "zsh", "fish", "kubectl"))
    args = parser.parse_args(list(argv))
    if args.shell == "kubectl":
        sys.stdout.write(KUBECTL_COMPLETE)
        return EXIT_OK
    try:
        from argcomplete.shell_integration import shellcode
    except ModuleNotFoundError:
        print(f"{prog}: argcomplete is not installed (pip install argcomplete)", file=sys.stderr)
        return EXIT_FAILED
    sys.stdout.write(shellcode(["kubectl-tailguard", "tailguard"], shell=args.shell))
    return EXIT_OK


def plugin_main() -> int:
    """The `kubectl-tailguard` console script."""
    return main()


if __name__ == "__main__":
    sys.exit(main())
