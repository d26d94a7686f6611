"""`tailguard`: validate rules, print the schema, run the controller, backtest, ... (the serving lab adds its `load`
and `demo`: serving/cli.py, the installed command).

Exit codes: 0 success; 1 `rules validate` found errors (or a delegated command
failed); 2 the configuration or the policies are unusable, or the command line
is wrong. Bad input is reported as `file:line: field: message`, never as a
traceback.
"""

from __future__ import annotations

import argparse
import importlib
import json
import logging
import signal
import sys
import threading
from collections.abc import Callable, Mapping, Sequence
from contextlib import ExitStack
from pathlib import Path
from types import FrameType
from typing import NamedTuple

import yaml

from tailguard.controller.adapters.policies.crd_schema import policy_manifest
from tailguard.controller.app.build import PolicyConfigError, build, check_policies
from tailguard.controller.app.kubectl_plugin import version
from tailguard.controller.app.logging_setup import configure_logging
from tailguard.controller.app.query_check import ParserUnavailable, prometheus_errors, promtool_errors, promtool_path
from tailguard.controller.app.settings import SettingsError, WebhookTokenError, load_settings
from tailguard.controller.core.policy import policy_json_schema
from tailguard.controller.core.policy_files import LoadedPolicy, PolicyError, load_policies, policy_paths
from tailguard.controller.kit.errors import ConfigError
from tailguard.controller.kit.gc_tuning import tune_for_long_running
from tailguard.controller.loop.policy_set import PolicyLoadError

EXIT_OK = 0
EXIT_INVALID = 1
EXIT_CONFIG = 2

# Subcommands whose arguments belong to another module's own parser.
DELEGATED = {
    "backtest": ("tailguard.controller.app.ml_commands", "backtest_main", "replay policies over Prometheus history"),
    "train": (
        "tailguard.controller.app.ml_commands",
        "train_main",
        "train the SLA-breach model from Prometheus history",
    ),
    "evaluate": (
        "tailguard.controller.app.ml_commands",
        "evaluate_main",
        "evaluate a trained SLA-breach model against baselines",
    ),
    "dashboards": (
        "tailguard.controller.tools.dashboards",
        "main",
        "generate the Grafana dashboards, or push them to Grafana",
    ),
    "status": (
        "tailguard.controller.app.operate",
        "status_main",
        "what a running controller (or a journal) is doing now",
    ),
    "pause": (
        "tailguard.controller.app.operate",
        "pause_main",
        "pause a policy (or --all: the kill switch) of a controller",
    ),
    "resume": ("tailguard.controller.app.operate", "resume_main", "resume a paused policy (or --all)"),
    "abort": (
        "tailguard.controller.app.operate",
        "abort_main",
        "stop a decision's actions (a ramp or sync wait in flight)",
    ),
    "incidents": ("tailguard.controller.app.kubectl_plugin", "incidents_main", "open incidents of a controller"),
    "logs": ("tailguard.controller.app.kubectl_plugin", "logs_main", "the leader pod's log (through the cluster)"),
    "completion": ("tailguard.controller.app.kubectl_plugin", "completion_main", "print shell completion code"),
    "report": ("tailguard.controller.app.report_command", "report_main", "the incident report of a journaled decision"),
}


class Command(NamedTuple):
    """A command another package adds to `tailguard` (the serving lab's `demo` and `load`, serving/cli.py): its
    entry point takes the arguments after the command's name; `summary` is its line in `tailguard --help`. Passed
    in, not named by a string, so the import that brings it is one the layer contracts see."""

    run: Callable[[list[str]], int]
    summary: str


logger = logging.getLogger("tailguard.cli")


def _parser(added: Mapping[str, Command] | None = None) -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="tailguard", description="Closed-loop SRE controller for LLM serving.")
    parser.add_argument("--version", action="version", version=f"%(prog)s {version()}")
    commands = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")

    rules = commands.add_parser("rules", help="validate policies, print their JSON Schema")
    rules_commands = rules.add_subparsers(dest="rules_command", required=True, metavar="SUBCOMMAND")
    validate = rules_commands.add_parser("validate", help="check policy files; every error as file:line: field")
    validate.add_argument("paths", nargs="+", metavar="PATH", help="policy files or directories")
    parser_check = validate.add_mutually_exclusive_group()
    parser_check.add_argument(
        "--prometheus",
        metavar="URL",
        default=None,
        help="parse every rendered query with this Prometheus (default: promtool, which must then be on PATH)",
    )
    parser_check.add_argument(
        "--skip-promql",
        action="store_true",
        help="do not parse the rendered queries (without promtool or --prometheus, validate fails instead)",
    )
    schema = rules_commands.add_parser("schema", help="print the policy JSON Schema")
    schema.add_argument("--output", "-o", type=Path, help="write it to this file instead of stdout")
    to_cr = rules_commands.add_parser(
        "to-cr", help="print policy files as TailguardPolicy manifests (migrating from ConfigMap policies)"
    )
    to_cr.add_argument("paths", nargs="+", metavar="PATH", help="policy files or directories")
    to_cr.add_argument("--namespace", "-n", required=True, help="the namespace kubernetes.policies watches")

    run = commands.add_parser("run", help="run the controller until SIGTERM/SIGINT")
    run.add_argument("--config", "-c", type=Path, required=True, help="controller configuration (YAML)")
    run.add_argument(
        "--new-journal",
        action="store_true",
        help="when the journal path holds an empty file or one that is not a tailguard journal, set it aside and "
        "start a new journal (without it, such a file is refused)",
    )

    for name, (_module, _function, summary) in DELEGATED.items():
        commands.add_parser(name, help=summary, add_help=False)
    for name, command in (added or {}).items():
        commands.add_parser(name, help=command.summary, add_help=False)
    return parser


def main(argv: Sequence[str] | None = None, commands: Mapping[str, Command] | None = None) -> int:
    """`tailguard ARGV`; `commands`: the commands another package adds (the installed `tailguard` is
    serving/cli.py's, which adds the lab's `demo` and `load`)."""
    added = dict(commands or {})
    args_list = list(sys.argv[1:] if argv is None else argv)
    if args_list and args_list[0] in added:
        return int(added[args_list[0]].run(args_list[1:]) or 0)
    if args_list and args_list[0] in DELEGATED:
        return _delegate(args_list[0], args_list[1:])
    args = _parser(added).parse_args(args_list)
    if args.command == "rules" and args.rules_command == "validate":
        return validate_rules(args.paths, prometheus=args.prometheus, skip_promql=args.skip_promql)
    if args.command == "rules" and args.rules_command == "schema":
        return write_schema(args.output)
    if args.command == "rules" and args.rules_command == "to-cr":
        return policies_to_manifests(args.paths, args.namespace)
    if args.command == "run":
        return run_controller(args.config, new_journal=args.new_journal)
    raise AssertionError(f"unhandled command {args.command}")  # argparse only accepts the commands above


def _delegate(command: str, argv: list[str]) -> int:
    module_name, function_name, _summary = DELEGATED[command]
    try:
        module = importlib.import_module(module_name)
    except ModuleNotFoundError as missing:
        if missing.name is not None and module_name.startswith(missing.name):
            print(
                f"tailguard {command}: not available in this installation ({module_name} is missing)",
                file=sys.stderr,
            )
            return EXIT_CONFIG
        raise
    entry: Callable[[list[str]], int] = getattr(module, function_name)
    return int(entry(argv) or 0)


def validate_rules(paths: Sequence[str], prometheus: str | None = None, *, skip_promql: bool = False) -> int:
    """Schema and references of every policy, then every rendered signal query through the real Prometheus
    parser (`--prometheus URL`, else promtool on PATH). Neither available: exit 2 saying how to get one; the check
    is skipped only when `--skip-promql` says so (a note on stderr), never silently."""
    files = policy_paths(paths)
    if not files:
        print(f"no policy files (*.yaml, *.yml) under {', '.join(paths)}", file=sys.stderr)
        return EXIT_INVALID
    loaded, errors = load_policies(paths)
    if skip_promql:
        print("skipped the PromQL parser check (--skip-promql)", file=sys.stderr)
    else:
        try:
            errors = [*errors, *_parser_errors(loaded, prometheus)]
        except ParserUnavailable as unavailable:
            if prometheus is not None:  # asked for and not usable: the command line cannot be honoured
                print(f"--prometheus {prometheus}: {unavailable}", file=sys.stderr)
            else:
                print(
                    f"cannot check PromQL: {unavailable}; install promtool or pass --prometheus URL "
                    "(or --skip-promql to validate without the parser check)",
                    file=sys.stderr,
                )
            return EXIT_CONFIG
    for error in errors:
        print(error, file=sys.stderr)
    if errors:
        print(
            f"{len(errors)} error(s) in {len({e.file for e in errors})} of {len(files)} file(s)",
            file=sys.stderr,
        )
        return EXIT_INVALID
    print(f"ok: {len(loaded)} policies in {len(files)} file(s)")
    return EXIT_OK


def _parser_errors(loaded: Sequence[LoadedPolicy], prometheus: str | None) -> list[PolicyError]:
    if prometheus is not None:
        return prometheus_errors(loaded, prometheus)
    promtool = promtool_path()
    if promtool is None:
        raise ParserUnavailable("promtool is not on PATH and no --prometheus URL was given")
    return promtool_errors(loaded, promtool)


def policies_to_manifests(paths: Sequence[str], namespace: str) -> int:
    """Every policy of `paths` (validated first: an invalid one is an error, never a manifest) as a TailguardPolicy
    manifest on stdout, `---` between them: `tailguard rules to-cr rules/ -n tailguard | kubectl apply -f -`."""
    loaded, errors = load_policies(policy_paths(paths))
    for error in errors:
        print(error, file=sys.stderr)
    if errors:
        return EXIT_INVALID
    manifests: list[dict[str, object]] = []
    for file in sorted({entry.file for entry in loaded}):
        text = Path(file).read_text(encoding="utf-8")
        for document in yaml.safe_load_all(text):
            if isinstance(document, dict) and document.get("kind", "Policy") == "Policy" and "name" in document:
                manifests.append(policy_manifest(document, namespace))
    sys.stdout.write(yaml.safe_dump_all(manifests, sort_keys=False))
    return EXIT_OK


def write_schema(output: Path | None) -> int:
    text = json.dumps(policy_json_schema(), indent=2, sort_keys=True) + "\n"
    if output is None:
        sys.stdout.write(text)
        return EXIT_OK
    try:
        output.parent.mkdir(parents=True, exist_ok=True)
        output.write_text(text, encoding="utf-8")
    except OSError as unwritable:
        print(f"{output}: cannot write the schema: {unwritable.strerror or unwritable}", file=sys.stderr)
        return EXIT_CONFIG
    print(f"wrote {output}", file=sys.stderr)
    return EXIT_OK


def run_controller(config: Path, *, new_journal: bool = False) -> int:
    """Build the controller from its configuration, serve until SIGTERM/SIGINT, stop cleanly.

    One exit for an unusable configuration: everything raises `ConfigError` (one sentence, file and section),
    and the `ExitStack` closes what was opened, in reverse order, on every path.
    """
    try:
        settings = load_settings(config)
    except SettingsError as invalid:
        for error in invalid.errors:
            print(error, file=sys.stderr)
        return EXIT_CONFIG
    configure_logging(settings.logFormat, settings.logLevel)
    tune_for_long_running()  # the evaluation's states all survive: see controller/kit/gc_tuning.py
    stop = threading.Event()

    def on_signal(number: int, _frame: FrameType | None) -> None:
        logger.info("received %s: stopping", signal.Signals(number).name)
        stop.set()

    try:
        with ExitStack() as stack:
            anonymous = settings.anonymous_control_error()
            if anonymous is not None:
                raise ConfigError(anonymous)
            webhook_token = settings.webhook_token()
            check_policies(settings)
            if webhook_token is None:
                logger.warning(
                    "no `webhook` section in %s: alerts, pause/resume, abort, decisions and status answer only "
                    "requests from this machine (loopback, %s:%d); set webhook.bearerTokenFile or "
                    "webhook.bearerTokenEnv to serve them to others",
                    config,
                    settings.listen.host,
                    settings.listen.port,
                )
            application = build(settings, stack, webhook_token=webhook_token, new_journal=new_journal)
            previous = {sig: signal.signal(sig, on_signal) for sig in (signal.SIGTERM, signal.SIGINT)}
            for sig, handler in previous.items():
                stack.callback(signal.signal, sig, handler)
            application.start(stack)
            logger.info(
                "tailguard controller serving on %s (dry run: %s)",
                application.api.url,
                {None: "per policy", True: "forced on", False: "forced off"}[settings.dryRun],
            )
            while not stop.wait(1.0):
                pass
    except (PolicyConfigError, PolicyLoadError) as invalid:  # PolicyLoadError: the files changed since the check
        for error in invalid.errors:
            print(error, file=sys.stderr)
        return EXIT_CONFIG
    except (ConfigError, WebhookTokenError) as unusable:
        print(f"{config}: {unusable}", file=sys.stderr)
        return EXIT_CONFIG
    return EXIT_OK
