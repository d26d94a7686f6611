"""`tailguard`: validate rules, print the schema, run the controller, backtest, load, demo.

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
from collections.abc import Callable, Sequence
from pathlib import Path
from types import FrameType

from controller.core.policy import policy_json_schema
from controller.core.policy_files import PolicyError, load_policies, policy_paths

EXIT_OK = 0
EXIT_INVALID = 1
EXIT_CONFIG = 2

# Subcommands whose arguments belong to another module's own parser.
DELEGATED = {
    "backtest": ("controller.tools.backtest", "backtest_main", "replay policies over Prometheus history"),
    "load": ("serving.load", "main", "generate load against the serving tier"),
    "demo": ("serving.demo", "main", "run the end-to-end demo"),
    "train": ("predictors.train", "main", "train the SLA-breach model from Prometheus history"),
    "evaluate": ("predictors.evaluate", "main", "evaluate a trained SLA-breach model against baselines"),
    "dashboards": ("controller.tools.dashboards", "main", "generate the Grafana dashboards, or push them to Grafana"),
}

logger = logging.getLogger("tailguard.cli")


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="tailguard", description="Closed-loop SRE controller for LLM serving.")
    commands = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")

    rules = commands.add_parser("rules", help="validate policies, print their JSON Schema")
    rules_commands = rules.add_subparsers(dest="rules_command", required=True, metavar="SUBCOMMAND")
    validate = rules_commands.add_parser("validate", help="check policy files; every error as file:line: field")
    validate.add_argument("paths", nargs="+", metavar="PATH", help="policy files or directories")
    schema = rules_commands.add_parser("schema", help="print the policy JSON Schema")
    schema.add_argument("--output", "-o", type=Path, help="write it to this file instead of stdout")

    run = commands.add_parser("run", help="run the controller until SIGTERM/SIGINT")
    run.add_argument("--config", "-c", type=Path, required=True, help="controller configuration (YAML)")

    for name, (_module, _function, summary) in DELEGATED.items():
        commands.add_parser(name, help=summary, add_help=False)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    args_list = list(sys.argv[1:] if argv is None else argv)
    if args_list and args_list[0] in DELEGATED:
        return _delegate(args_list[0], args_list[1:])
    args = _parser().parse_args(args_list)
    if args.command == "rules" and args.rules_command == "validate":
        return validate_rules(args.paths)
    if args.command == "rules" and args.rules_command == "schema":
        return write_schema(args.output)
    if args.command == "run":
        return run_controller(args.config)
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


def validate_rules(paths: Sequence[str]) -> int:
    files = policy_paths(paths)
    if not files:
        print(f"no policy files (*.yaml, *.yml) under {', '.join(paths)}", file=sys.stderr)
        return EXIT_INVALID
    loaded, errors = load_policies(paths)
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


def _unknown_receivers(settings_receivers: Sequence[str], paths: Sequence[Path]) -> list[PolicyError]:
    """A notify action naming a receiver the configuration does not define would fail at 3 a.m.: refuse now."""
    loaded, _errors = load_policies(paths)
    problems: list[PolicyError] = []
    for entry in loaded:
        for index, condition in enumerate(entry.policy.conditions):
            branches = [(f"choose[{n}].actions", branch.actions) for n, branch in enumerate(condition.choose or [])]
            for kind, actions in (
                ("actions", condition.actions or []),
                ("recovery.actions", condition.recovery.actions),
                *branches,
            ):
                for position, action in enumerate(actions):
                    receiver = getattr(action, "receiver", None)
                    if action.type == "notify" and receiver not in settings_receivers:
                        known = ", ".join(sorted(settings_receivers)) or "none configured"
                        problems.append(
                            PolicyError(
                                entry.file,
                                entry.line,
                                f"conditions[{index}].{kind}[{position}].receiver",
                                f"unknown receiver {receiver!r} in policy {entry.policy.name}; "
                                f"expected one of: {known}",
                            )
                        )
    return problems


def run_controller(config: Path) -> int:
    """Build the controller from its configuration, serve until SIGTERM/SIGINT, stop cleanly."""
    from kubernetes.client import AppsV1Api
    from kubernetes.config import ConfigException
    from prometheus_client import CollectorRegistry

    from controller.adapters.annotations.grafana import (
        DecisionAnnotatingDispatcher,
        GrafanaAnnotator,
        GrafanaTokenError,
    )
    from controller.adapters.annotations.jsonl import FanoutAnnotator, JsonlAnnotator
    from controller.adapters.changes.tracker import build_change_tracker
    from controller.adapters.composite import CompositeDeployer
    from controller.adapters.lease.leader import LeaderElector
    from controller.adapters.metrics.prometheus import PrometheusSource, SourceConfigError
    from controller.adapters.notify.webhook import WebhookNotifier, decision_links
    from controller.adapters.rollback.argocd import ArgoCDDeployer
    from controller.adapters.stores.journal import Journal, JournalError
    from controller.adapters.stores.outbox import OutboxError
    from controller.adapters.tier.local_tier import LocalTierClient
    from controller.app.api import ControllerAPI
    from controller.app.cluster import (
        ClusterActuators,
        ClusterConfigError,
        build_cluster_actuators,
        build_leader_elector,
    )
    from controller.app.settings import SettingsError, WebhookTokenError, load_settings
    from controller.core.ports import Annotator, Deployer, TrafficRouter
    from controller.kit.clock import SystemClock
    from controller.loop.dispatcher import Actuators, Dispatcher
    from controller.loop.metrics import ControllerMetrics
    from controller.loop.runtime import Controller, PolicyLoadError, configure_logging
    from predictors.serving import PredictionProvider

    try:
        settings = load_settings(config)
    except SettingsError as invalid:
        for error in invalid.errors:
            print(error, file=sys.stderr)
        return EXIT_CONFIG
    configure_logging(settings.logFormat, settings.logLevel)
    try:
        webhook_token = settings.webhook_token()
    except WebhookTokenError as unreadable:
        print(f"{config}: {unreadable}", file=sys.stderr)
        return EXIT_CONFIG
    paths = settings.policy_paths()
    _loaded, policy_errors = load_policies(paths)
    policy_errors = policy_errors or _unknown_receivers(list(settings.receivers), paths)
    if policy_errors:
        for error in policy_errors:
            print(error, file=sys.stderr)
        return EXIT_CONFIG
    if webhook_token is None:
        logger.warning(
            "no `webhook` section in %s: POST /api/v1/alerts accepts anyone who can reach %s:%d "
            "(set webhook.bearerTokenFile or webhook.bearerTokenEnv)",
            config,
            settings.listen.host,
            settings.listen.port,
        )
    clock = SystemClock()
    metrics = ControllerMetrics(CollectorRegistry())
    try:
        settings.state_path().mkdir(parents=True, exist_ok=True)
        source = PrometheusSource(settings.prometheus, clock)
        journal = Journal(settings.journal_path())
    except (OSError, SourceConfigError, JournalError) as unusable:
        print(f"{config}: {unusable}", file=sys.stderr)
        return EXIT_CONFIG
    tier = (
        LocalTierClient(settings.tier.url, timeout=settings.tier.timeout, retries=settings.tier.retries, clock=clock)
        if settings.tier is not None
        else None
    )
    # Rollbacks go through Argo CD when it is configured (GitOps), else through the local serving tier.
    deployer: Deployer | None = tier
    if settings.argocd is not None:
        deployer = ArgoCDDeployer.from_settings(
            settings.argocd,
            clock=clock,
            record_path=settings.state_path() / "argocd-bad-revisions.json",
            decision_lookup=journal.decision,
            base_dir=settings.base_dir,
        )
    # The cluster (HPA scaling, route weights, the leader Lease): one ApiClient, built from `kubernetes`.
    cluster: ClusterActuators | None = None
    elector: LeaderElector | None = None
    try:
        if settings.kubernetes is not None:
            cluster = build_cluster_actuators(settings.kubernetes, clock, base_dir=settings.base_dir)
        if settings.leaderElection is not None:
            elector = build_leader_elector(
                settings.leaderElection,
                settings.kubernetes,
                clock,
                api_client=cluster.api_client if cluster is not None else None,
            )
    except ClusterConfigError as unreachable:
        print(f"{config}: {unreachable}", file=sys.stderr)
        journal.close()
        return EXIT_CONFIG
    try:
        tracker = (
            build_change_tracker(
                settings.changeTracking,
                clock=clock,
                argocd=settings.argocd,
                tier=tier,
                base_dir=settings.base_dir,
                apps_api=AppsV1Api(cluster.api_client) if cluster is not None else None,
            )
            if settings.changeTracking is not None
            else None
        )
    except (ValueError, ConfigException) as missing:
        print(f"{config}: changeTracking: {missing}", file=sys.stderr)
        journal.close()
        return EXIT_CONFIG
    annotations_path = settings.annotations_path()
    grafana_settings = settings.annotations.grafana if settings.annotations is not None else None
    grafana: GrafanaAnnotator | None = None
    if grafana_settings is not None:
        try:
            grafana = GrafanaAnnotator.from_settings(grafana_settings, clock, settings.path(grafana_settings.outbox))
        except (GrafanaTokenError, OutboxError) as unusable_grafana:
            print(f"{config}: annotations.grafana: {unusable_grafana}", file=sys.stderr)
            journal.close()
            return EXIT_CONFIG
    annotators: list[Annotator] = [JsonlAnnotator(annotations_path)] if annotations_path is not None else []
    if grafana is not None:
        annotators.append(grafana)
    # Rollbacks to Argo CD (or the tier), replica counts to the HPA (or the tier), weights to the routes (or the tier).
    router: TrafficRouter | None = cluster.router if cluster is not None and cluster.router is not None else tier
    scaler: Deployer | None = cluster.scaler if cluster is not None and cluster.scaler is not None else tier
    actuators = Actuators(
        deployer=CompositeDeployer(deployer, scaler),
        router=router,
        annotator=FanoutAnnotator(annotators) if len(annotators) > 1 else (annotators[0] if annotators else None),
        notifier=WebhookNotifier(settings.receivers, clock) if settings.receivers else None,
    )
    dispatcher = Dispatcher(
        journal, actuators, clock, settings.limits, links_for=lambda d: decision_links(settings.links, d, clock.now())
    )
    controller = Controller(
        policy_paths=paths,
        source=source,
        journal=journal,
        # Every decision also becomes a Grafana region (onset -> resolution) when Grafana is configured.
        dispatcher=DecisionAnnotatingDispatcher(dispatcher, grafana, journal) if grafana is not None else dispatcher,
        clock=clock,
        metrics=metrics,
        dry_run=settings.dryRun,
        reload_interval=settings.reloadInterval,
        change_tracker=tracker,
        change_window=settings.changeTracking.window if settings.changeTracking is not None else 0.0,
        rollout_annotator=grafana,
        predictions=PredictionProvider(settings.predictor_specs(), clock),
        leader=elector,
    )
    try:
        api = ControllerAPI(controller, settings.listen.host, settings.listen.port, webhook_token=webhook_token)
    except OSError as unbound:
        print(
            f"{config}: cannot listen on {settings.listen.host}:{settings.listen.port}: {unbound.strerror}",
            file=sys.stderr,
        )
        journal.close()
        return EXIT_CONFIG

    stop = threading.Event()

    def on_signal(number: int, _frame: FrameType | None) -> None:
        logger.info("received %s: stopping", signal.Signals(number).name)
        stop.set()

    previous = {sig: signal.signal(sig, on_signal) for sig in (signal.SIGTERM, signal.SIGINT)}
    try:
        if grafana is not None:
            grafana.start()
        if elector is not None:
            # One round now, so a sole replica leads from its first evaluation; then renew in the background.
            elector.run_once()
            elector.start(settings.leaderElection.retryPeriod if settings.leaderElection is not None else None)
        try:
            controller.start()
        except PolicyLoadError as invalid:  # the files changed between the check above and the start
            for error in invalid.errors:
                print(error, file=sys.stderr)
            return EXIT_CONFIG
        api.start()
        logger.info(
            "tailguard controller serving on %s (dry run: %s)",
            api.url,
            {None: "per policy", True: "forced on", False: "forced off"}[settings.dryRun],
        )
        while not stop.wait(1.0):
            pass
    finally:
        api.stop()
        controller.stop()
        if elector is not None:
            elector.stop()  # after the controller stopped acting: releases the Lease so the standby leads at once
        if cluster is not None:
            cluster.api_client.close()  # type: ignore[no-untyped-call]
        if grafana is not None:
            grafana.close()
        for sig, handler in previous.items():
            signal.signal(sig, handler)
    return EXIT_OK
