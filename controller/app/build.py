"""The composition root: `build(settings, stack)` turns the controller configuration into running parts.

Every edge (the Prometheus source, the journal, Argo CD, the cluster client, the Lease, Grafana, webhooks, the
HTTP API) is made here and nowhere else, and each one that holds a resource is registered on the caller's
`ExitStack` the moment it exists. A configuration that turns out to be unusable half-way raises `ConfigError`
(one sentence, naming the file and section); the stack then closes exactly what was opened, in reverse order.
`run_controller` (controller/app/cli.py) is the only caller: one `ConfigError` exit, one stack.
"""

from __future__ import annotations

import logging
import math
import sqlite3
from collections.abc import Callable, Mapping, Sequence
from contextlib import ExitStack
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from prometheus_client import CollectorRegistry

from controller.adapters.annotations.jsonl import FanoutAnnotator, JsonlAnnotator
from controller.adapters.annotations.settings import GrafanaTokenError
from controller.adapters.changes.tracker import ChangeTracker, build_change_tracker
from controller.adapters.metrics.prometheus import PrometheusSource, SourceConfigError
from controller.adapters.notify.webhook import WebhookNotifier, decision_links
from controller.adapters.rollback.argocd import ArgoCDRollback
from controller.adapters.stores.incidents import SqliteIncidentStore
from controller.adapters.stores.journal import Journal, JournalError
from controller.adapters.stores.outbox import OutboxError
from controller.adapters.tier.local_tier import LocalTierClient
from controller.app.api import ControllerAPI
from controller.app.extras import CLUSTER, ML, require
from controller.app.peer_auth import PeerKey
from controller.app.settings import ControllerSettings
from controller.app.status_page import dashboard_link
from controller.core.actions import ActionType
from controller.core.policy import Condition
from controller.core.policy_files import LoadedPolicy, PolicyError, load_policies
from controller.core.ports import (
    Annotator,
    ChangeTrackerPort,
    IncidentStorePort,
    NoticePayload,
    Notifier,
    NotifyRequest,
    RollbackPort,
    ScalePort,
    TrafficRouter,
)
from controller.core.unconfigured import ROLLBACK_MISSING, SCALE_MISSING, UnconfiguredRollback, UnconfiguredScale
from controller.kit.clock import SystemClock
from controller.kit.errors import ConfigError, StoreError
from controller.loop.adoption import Adoption
from controller.loop.annotating_dispatcher import DecisionAnnotatingDispatcher
from controller.loop.dispatcher import Actuators, Dispatcher
from controller.loop.evaluation import action_labels
from controller.loop.housekeeping import Housekeeper, Task
from controller.loop.incident_ports import incident_layer
from controller.loop.incidents import IncidentKeeper
from controller.loop.metrics import ControllerMetrics
from controller.loop.runtime import Controller
from predictors.serving import PredictionProvider

if TYPE_CHECKING:  # the cluster extra (kubernetes, grafana-client): imported where a section needs it
    from controller.adapters.annotations.grafana import GrafanaAnnotator
    from controller.adapters.lease.leader import LeaderElector
    from controller.adapters.lease.shards import ShardedElector
    from controller.adapters.policies.crd import CrdPolicySource
    from controller.app.cluster import ClusterActuators

logger = logging.getLogger("tailguard.cli")


class PolicyConfigError(ConfigError):
    """The policies cannot run with this configuration; each error is printed as file:line: field: message."""

    def __init__(self, errors: Sequence[PolicyError]) -> None:
        super().__init__("; ".join(str(error) for error in errors))
        self.errors = list(errors)


@dataclass
class Application:
    """The running parts `build` made; `start` starts them in order (their stops are on the stack)."""

    settings: ControllerSettings
    controller: Controller
    api: ControllerAPI
    grafana: GrafanaAnnotator | None
    elector: LeaderElector | ShardedElector | None
    housekeeper: Housekeeper | None = None

    def start(self, stack: ExitStack) -> None:
        if self.grafana is not None:
            self.grafana.start()
        if self.elector is not None:
            # One round now, so a sole replica leads from its first evaluation; then renew in the background.
            self.elector.run_once()
            election = self.settings.leaderElection
            self.elector.start(election.retryPeriod if election is not None else None)
        # The API and its probes first: /healthz answers while the rest starts (a Lease round, the resume of
        # unfinished actions), and /readyz says "not started" until the controller evaluates.
        self.api.start()
        self.controller.start()  # PolicyLoadError when the files changed since they were checked
        if self.housekeeper is not None:
            self.housekeeper.start()  # its first pass a minute later: startup never waits on a purge


def unknown_receivers(settings_receivers: Sequence[str], paths: Sequence[Path]) -> list[PolicyError]:
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


# What provides each action type that needs more than the always-present journal (notify: unknown_receivers).
_ACTUATOR_SECTIONS = {
    ActionType.ROLLBACK: "an `argocd` or `kubernetes.rollback` section (or `tier`)",
    ActionType.SCALE: "a `kubernetes.hpa` section (or `tier`)",
    ActionType.SHIFT_TRAFFIC: "a `kubernetes.traffic` section (or `tier`)",
}


def missing_actuators(settings: ControllerSettings, loaded: Sequence[LoadedPolicy]) -> list[PolicyError]:
    """An action no configured actuator can run would only fail when the incident comes: refuse the policy now.

    One error per policy and action type, naming the file, the type and the section that would provide it. A
    policy in dry run (its own flag, or `dryRun` here) calls no actuator and needs none.
    """
    kubernetes = settings.kubernetes
    tier = settings.tier is not None
    provided = {
        ActionType.ROLLBACK: settings.argocd is not None
        or (kubernetes is not None and kubernetes.rollback is not None)
        or tier,
        ActionType.SCALE: (kubernetes is not None and kubernetes.hpa is not None) or tier,
        ActionType.SHIFT_TRAFFIC: (kubernetes is not None and kubernetes.traffic is not None) or tier,
    }
    problems: list[PolicyError] = []
    for entry in loaded:
        policy = entry.policy
        if (settings.dryRun if settings.dryRun is not None else policy.dryRun) is True:
            continue
        wanted = {ActionType(action.type) for condition in policy.conditions for action in _every_action(condition)}
        problems.extend(_hpa_limit_problems(settings, entry))
        for kind in sorted(wanted & {k for k, ok in provided.items() if not ok}):
            problems.append(
                PolicyError(
                    entry.file,
                    entry.line,
                    "",
                    f"policy {policy.name} has a {kind.value} action, but no actuator for {kind.value} is "
                    f"configured: add {_ACTUATOR_SECTIONS[kind]} to the controller configuration",
                )
            )
    return problems


def _hpa_limit_problems(settings: ControllerSettings, entry: LoadedPolicy) -> list[PolicyError]:
    """A scale's `ceiling`/`metricTargets` need the HPA scaler, and bounds for each metric (kubernetes.hpa)."""
    hpa = settings.kubernetes.hpa if settings.kubernetes is not None else None
    problems: list[PolicyError] = []
    for condition in entry.policy.conditions:
        for action in _every_action(condition):
            if action.type != ActionType.SCALE.value or (action.ceiling is None and not action.metricTargets):
                continue
            name = entry.policy.name
            floor = any(getattr(action, mode) is not None for mode in ("replicas", "delta", "targetPerReplica"))
            if hpa is None and floor:
                continue  # the count moves (the local tier); there is no HPA ceiling or target to set
            if hpa is None:
                message = (
                    f"policy {name} has a scale action that sets an HPA's ceiling or metric targets, but no HPA "
                    "actuator is configured: add a `kubernetes.hpa` section to the controller configuration"
                )
                problems.append(PolicyError(entry.file, entry.line, "", message))
                continue
            for metric in sorted(set(action.metricTargets or {}) - set(hpa.metricTargets)):
                message = (
                    f"policy {name} sets the HPA metric target {metric!r}, which kubernetes.hpa.metricTargets "
                    "does not bound: add it there with its min and max"
                )
                problems.append(PolicyError(entry.file, entry.line, "", message))
    return problems


def _every_action(condition: Condition) -> list[Any]:
    return [*condition.all_actions(), *condition.recovery.actions]


def check_policies(settings: ControllerSettings) -> None:
    """The policy files load, name only configured receivers and have an actuator for every action type
    (PolicyConfigError otherwise)."""
    paths = settings.policy_paths()
    loaded, errors = load_policies(paths)
    errors = errors or unknown_receivers(list(settings.receivers), paths) or missing_actuators(settings, loaded)
    if errors:
        raise PolicyConfigError(errors)


def build(  # noqa: PLR0915 - the composition root open-codes every port's choice; issue 26 item 5 (a registry per port)
    settings: ControllerSettings, stack: ExitStack, *, webhook_token: str | None, new_journal: bool = False
) -> Application:
    """Every part of the controller from its settings; `ConfigError` names what is unusable (the caller
    prefixes the configuration file). `new_journal`: an empty or foreign file at the journal path is set aside
    for a new journal instead of refused (`tailguard run --new-journal`)."""
    if settings.predictors:
        require(ML, "predictors")  # the artifacts load with scikit-learn and skops
    clock = SystemClock()
    metrics = ControllerMetrics(CollectorRegistry())
    try:
        settings.state_path().mkdir(parents=True, exist_ok=True)
        source = PrometheusSource(settings.prometheus, clock)
        journal = Journal(settings.journal_path(), new_journal=new_journal, now=clock.now())
    except (OSError, SourceConfigError, JournalError) as unusable:
        raise ConfigError(str(unusable)) from unusable
    # Closed last (the controller's stop closes it too; closing twice is harmless).
    stack.callback(journal.close)
    tier = (
        LocalTierClient(settings.tier.url, timeout=settings.tier.timeout, retries=settings.tier.retries, clock=clock)
        if settings.tier is not None
        else None
    )
    # Rollbacks go through Argo CD when it is configured (GitOps), else through the local serving tier.
    rollback: RollbackPort = tier if tier is not None else UnconfiguredRollback(ROLLBACK_MISSING)
    notifier: Notifier | None = WebhookNotifier(settings.receivers, clock) if settings.receivers else None
    if settings.argocd is not None:
        rollback = ArgoCDRollback.from_settings(
            settings.argocd,
            clock=clock,
            record_path=settings.state_path() / "argocd-bad-revisions.json",
            base_dir=settings.base_dir,
            # Auto-sync switched off to roll back: every receiver hears it, so a human turns it back on.
            notice=_notify_receivers(notifier, list(settings.receivers), clock) if notifier is not None else None,
        )
    grafana = _grafana(settings, clock, stack)
    # The cluster (HPA scaling, route weights, the leader Lease): one ApiClient, built from `kubernetes`.
    cluster: ClusterActuators | None = None
    elector: LeaderElector | ShardedElector | None = None
    sharded: ShardedElector | None = None
    if settings.kubernetes is not None or settings.leaderElection is not None:
        require(CLUSTER, "kubernetes" if settings.kubernetes is not None else "leaderElection")
        # The cluster extra (kubernetes): imported only when a section needs it.
        from controller.adapters.lease.shards import ShardedElector
        from controller.app.cluster import build_cluster_actuators, build_leader_elector
    try:
        if settings.kubernetes is not None:
            cluster = build_cluster_actuators(
                settings.kubernetes, clock, base_dir=settings.base_dir, state_dir=settings.state_path()
            )
            stack.callback(cluster.api_client.close)
            if cluster.rollback is not None:
                if settings.argocd is not None:
                    raise ConfigError("kubernetes.rollback and argocd both roll back: configure one of them")
                # Rollbacks through Deployment revisions (and Helm-owned Deployments), instead of the tier.
                rollback = cluster.rollback
        if settings.leaderElection is not None:
            elector = build_leader_elector(
                settings.leaderElection,
                settings.kubernetes,
                clock,
                api_client=cluster.api_client if cluster is not None else None,
                # Each replica's journal records which shards it held when (a decision's shard is
                # shard_of(policy, shards)): controls rows "shard-acquired" / "shard-released".
                on_shard_change=_journal_shard_changes(journal, settings.leaderElection.resolved_identity(), clock),
            )
            # With shards (leaderElection.shards > 1): each policy is led through its shard's Lease.
            sharded = elector if isinstance(elector, ShardedElector) else None
            # After the controller stopped acting: releases the Lease so the standby leads at once (an elector
            # that never started holds nothing, so a configuration error never touches the Lease).
            stack.callback(_stop_if_running, elector)
    except ConfigError as unreachable:  # ClusterConfigError
        raise ConfigError(str(unreachable)) from unreachable
    tracker: ChangeTrackerPort | None = _change_tracker(settings, clock, tier, cluster)
    annotations_path = settings.annotations_path()
    annotators: list[Annotator] = [JsonlAnnotator(annotations_path)] if annotations_path is not None else []
    if grafana is not None:
        annotators.append(grafana)
    # Rollbacks to Argo CD (or the tier), replica counts to the HPA (or the tier), weights to the routes (or the tier).
    router: TrafficRouter | None = cluster.router if cluster is not None and cluster.router is not None else tier
    scale: ScalePort = (
        cluster.scaler
        if cluster is not None and cluster.scaler is not None
        else tier or (UnconfiguredScale(SCALE_MISSING))
    )
    annotator: Annotator | None = (
        FanoutAnnotator(annotators) if len(annotators) > 1 else (annotators[0] if annotators else None)
    )
    # A port left out answers with its "not configured" failure (controller/core/unconfigured.py).
    unconfigured = Actuators()
    actuators = Actuators(
        rollback=rollback,
        scale=scale,
        router=router if router is not None else unconfigured.router,
        annotator=annotator if annotator is not None else unconfigured.annotator,
        notifier=notifier if notifier is not None else unconfigured.notifier,
        # A scale's ceiling and metric targets: the HPA scaler only.
        limits=cluster.scaler if cluster is not None else None,
    )
    # Incidents: one per service scope, in TailguardIncidents (every replica reads them) or in the journal's file;
    # rollbacks, scales, shifts and the change feed go through them (controller/loop/incident_ports.py).
    keeper = IncidentKeeper(_incident_store(settings, cluster, stack), clock)
    layer = incident_layer(keeper, actuators, tracker)
    actuators, tracker = layer.actuators, layer.change_tracker
    # Actions run on per-service workers, outside the evaluations (a rollback waiting on a sync holds neither its
    # policy's evaluations nor another service's actions); a replica that lost the Lease leaves them journaled.
    dispatcher = Dispatcher(
        journal,
        actuators,
        clock,
        settings.limits,
        on_action=lambda record: metrics.record_action(*action_labels(record)),
        links_for=lambda d: decision_links(settings.links, d, clock.now()),
        workers=True,
        may_act=elector.is_leader if elector is not None and sharded is None else None,
        # Sharded: an action runs only while this replica holds its policy's shard Lease.
        may_act_for=sharded.leads if sharded is not None else None,
    )
    # TailguardPolicy custom resources: listed now (their policies load with the files), then watched; the leader
    # writes their status.
    policy_paths = settings.policy_paths()
    crd_source: CrdPolicySource | None = None
    if cluster is not None and settings.kubernetes is not None and settings.kubernetes.policies is not None:
        # The cluster extra (kubernetes): imported only with a kubernetes.policies section.
        from controller.adapters.policies.crd import CrdPolicySource

        crd_source = CrdPolicySource(
            cluster.api_client,
            settings.kubernetes.policies.namespace,
            settings.state_path() / "crd-policies",
            clock,
            journal=journal,
            # Sharded: the holder of shard 0 writes the policies' status (one writer).
            is_leader=(lambda: sharded.leads_shard(0))
            if sharded is not None
            else (elector.is_leader if elector is not None else (lambda: True)),
            check=lambda loaded: missing_actuators(settings, loaded),
            events=settings.kubernetes.events,
            status_interval=settings.kubernetes.policies.statusInterval,
        )
        crd_source.start()
        stack.callback(crd_source.stop)
        policy_paths = [*policy_paths, crd_source.directory]
    controller = Controller(
        policy_paths=policy_paths,
        source=source,
        journal=journal,
        # Every decision also becomes a Grafana region (onset -> resolution) when Grafana is configured.
        dispatcher=DecisionAnnotatingDispatcher(layer.dispatcher(dispatcher), grafana, journal)
        if grafana is not None
        else layer.dispatcher(dispatcher),
        clock=clock,
        metrics=metrics,
        dry_run=settings.dryRun,
        reload_interval=settings.reloadInterval,
        change_tracker=tracker,
        change_window=settings.changeTracking.window if settings.changeTracking is not None else 0.0,
        rollout_annotator=grafana,
        predictions=PredictionProvider(settings.predictor_specs(), clock),
        leader=elector,
        # A hot reload that brings in an action with no actuator is a reload error (the last good set runs on).
        policy_check=lambda loaded: missing_actuators(settings, loaded),
        action_workers=dispatcher,
        # Pauses and the kill switch survive a restart in the journal (and a leader change in the Lease).
        controls_store=journal,
        open_incidents=keeper.incidents,
    )
    stack.callback(controller.stop)
    # An action's deadline is its policy's (limits.actionDeadline, default 3 intervals): looked up when it is
    # planned, so a reload's change applies to the next decision.
    if elector is not None and not isinstance(elector, ShardedElector):
        # The unfinished actions travel in the Lease: published once planned, adopted by a successor (with
        # sharding each shard's Lease carries action times only; adoption there is not built yet).
        leader = elector
        leader.attach_pending(Adoption(journal, dispatcher.planner, clock))
        dispatcher.on_planned = lambda _policy: leader.publish()
    dispatcher.planner.deadline_for = lambda name: (
        policy.action_deadline() if (policy := controller.policies().get(name)) is not None else None
    )
    keeper.bind(controller.policies)  # the escalation ladders of the loaded policies
    if crd_source is not None:
        # A changed TailguardPolicy (e.g. `spec.suspend: true`) is loaded at once, not at the next periodic reload.
        crd_source.on_change = lambda: controller.reload() if controller.running else None
    # Hourly: journal retention (decisions and their finished actions older than journalRetention, then an
    # incremental vacuum) and the Grafana outbox's delivered entries. Stopped before the outbox and journal close.
    housekeeper = Housekeeper(_retention_tasks(settings, journal, grafana, keeper.store), clock)
    stack.callback(housekeeper.stop)
    # Replica-to-replica trust: the replicas' own key (else derived from the token inside the API), and which Lease
    # URL is a replica's (the holder's pod of this Deployment, on the API's port).
    peer_secret = settings.peer_secret()
    peers = None
    if elector is not None and sharded is None and settings.leaderElection is not None:
        # The cluster extra (kubernetes): imported with the leaderElection section, as the elector was.
        from controller.app.cluster import build_peer_check

        assert not isinstance(elector, ShardedElector)
        peers = build_peer_check(elector, settings.leaderElection, clock, settings.listen.port)
    try:
        api = ControllerAPI(
            controller,
            settings.listen.host,
            settings.listen.port,
            webhook_token=webhook_token,
            # A standby answers alerts with 503 (Alertmanager retries, through the Service, on the leader).
            leader=elector,
            standby_retry_after=math.ceil(settings.leaderElection.retryPeriod) if settings.leaderElection else 2,
            status_links=dashboard_link(settings.links.grafanaUrl, settings.links.dashboardUid),
            forward_timeout=settings.leaderElection.forwardTimeout if settings.leaderElection else 5.0,
            peer_key=PeerKey(peer_secret) if peer_secret is not None else None,
            peers=peers,
        )
    except OSError as unbound:
        where = f"{settings.listen.host}:{settings.listen.port}"
        raise ConfigError(f"cannot listen on {where}: {unbound.strerror}") from unbound
    stack.callback(api.stop)
    if peers is not None and peers.port == 0:
        peers.port = api.port  # `listen` port 0 (tests): the port the replicas' API was given
    if elector is not None and not isinstance(elector, ShardedElector) and settings.leaderElection is not None:
        # One view across replicas: the leader publishes where its API answers (the bound port: 0 picks one).
        # Sharded replicas each lead their own shards: there is no one leader to forward to, each answers itself.
        advertised = settings.leaderElection.advertised_url(api.port)
        if advertised is not None:
            elector.advertise(advertised)
    return Application(settings, controller, api, grafana, elector, housekeeper)


def _incident_store(
    settings: ControllerSettings, cluster: ClusterActuators | None, stack: ExitStack | None = None
) -> IncidentStorePort:
    incidents = settings.kubernetes.incidents if settings.kubernetes is not None else None
    if cluster is not None and incidents is not None:
        # The cluster extra (kubernetes): imported only with a kubernetes.incidents section.
        from kubernetes import client as k8s

        from controller.adapters.stores.incident_resources import KubernetesIncidentStore

        return KubernetesIncidentStore(k8s.CustomObjectsApi(cluster.api_client), incidents.namespace)
    try:
        store = SqliteIncidentStore(settings.journal_path())
    except StoreError as unusable:
        raise ConfigError(str(unusable)) from unusable
    if stack is not None:
        stack.callback(store.close)  # after the controller stopped (callbacks run last-in first-out)
    return store


def _retention_tasks(
    settings: ControllerSettings,
    journal: Journal,
    grafana: GrafanaAnnotator | None,
    incidents: IncidentStorePort | None = None,
) -> list[Task]:
    retention = settings.journalRetention
    tasks: list[Task] = [("journal retention", lambda now: journal.purge(now, retention).to_json())]
    if isinstance(incidents, SqliteIncidentStore):
        # Ended incidents as long as the journal keeps decisions; each service's latest stays (its ledger).
        tasks.append(("incident retention", lambda now: {"deleted": incidents.purge(now - retention)}))
    if grafana is not None:
        outbox = grafana.outbox
        tasks.append(("grafana outbox retention", lambda now: outbox.purge(now - retention)))
    return tasks


def _change_tracker(
    settings: ControllerSettings, clock: SystemClock, tier: LocalTierClient | None, cluster: ClusterActuators | None
) -> ChangeTracker | None:
    tracking = settings.changeTracking
    if tracking is None:
        return None
    config_errors: tuple[type[Exception], ...] = (ValueError,)
    apps_api = None
    if "kubernetes" in tracking.sources:
        require(CLUSTER, "changeTracking.sources kubernetes")
        # The cluster extra (kubernetes): imported only when a Deployment source is configured.
        from kubernetes.client import AppsV1Api
        from kubernetes.config import ConfigException

        config_errors = (ValueError, ConfigException)
        apps_api = AppsV1Api(cluster.api_client) if cluster is not None else None
    try:
        return build_change_tracker(
            tracking, clock=clock, argocd=settings.argocd, tier=tier, base_dir=settings.base_dir, apps_api=apps_api
        )
    except config_errors as missing:
        raise ConfigError(f"changeTracking: {missing}") from missing


def _grafana(settings: ControllerSettings, clock: SystemClock, stack: ExitStack) -> GrafanaAnnotator | None:
    grafana_settings = settings.annotations.grafana if settings.annotations is not None else None
    if grafana_settings is None:
        return None
    require(CLUSTER, "annotations.grafana")
    # The cluster extra (grafana-client): imported only with an annotations.grafana section.
    from controller.adapters.annotations.grafana import GrafanaAnnotator

    try:
        grafana = GrafanaAnnotator.from_settings(grafana_settings, clock, settings.path(grafana_settings.outbox))
    except (GrafanaTokenError, OutboxError) as unusable:
        raise ConfigError(f"annotations.grafana: {unusable}") from unusable
    # Closed after the elector released the Lease and before the journal (its outbox is its own file).
    stack.callback(grafana.close)
    return grafana


def _notify_receivers(
    notifier: Notifier, receivers: Sequence[str], clock: SystemClock
) -> Callable[[str, Mapping[str, Any]], None]:
    """The Argo CD rollback's notice (auto-sync disabled) as a notification to every configured receiver."""

    def notice(text: str, detail: Mapping[str, Any]) -> None:
        key = f"notice:auto-sync-disabled:{detail.get('application', '')}:{clock.now():.0f}"
        for receiver in receivers:
            notifier.notify(NotifyRequest(receiver, NoticePayload(text, detail), key))

    return notice


def _stop_if_running(elector: LeaderElector | ShardedElector) -> None:
    if elector.running:
        elector.stop()


def _journal_shard_changes(journal: Journal, identity: str, clock: SystemClock) -> Callable[[str, int, str], None]:
    def record(event: str, index: int, reason: str) -> None:
        # On stop the controller closes the journal first and the elector runs until it has released its shards
        # (so that no action can start after the journal closed): those last changes are logged, not journaled.
        if journal.closed:
            logger.info("shard-%d %s while stopping (the journal is closed): %s", index, event, reason)
            return
        try:
            journal.record_control(None, f"shard-{event}", f"shard-{index}", identity, reason, clock.now())
        except sqlite3.ProgrammingError:  # closed between the check and the write
            logger.info("shard-%d %s while stopping (the journal is closed): %s", index, event, reason)

    return record
