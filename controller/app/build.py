"""The composition root: `build(settings, stack)` turns the controller configuration into running parts.

Every edge (the Prometheus source, the journal, the cluster client, the Lease, the HTTP API) is made here and
nowhere else; the actuators, annotators and notifiers come from their ports' registries
(controller/app/registrations.py: which section selects which adapter, and its factory). Each part that holds a
resource is registered on the caller's `ExitStack` the moment it exists. A configuration that turns out to be
unusable half-way raises `ConfigError` (one sentence, naming the file and section); the stack then closes exactly
what was opened, in reverse order. `run_controller` (controller/app/cli.py) is the only caller: one `ConfigError`
exit, one stack.
"""

from __future__ import annotations

import logging
import math
import sqlite3
from collections.abc import Callable, Sequence
from contextlib import ExitStack
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from prometheus_client import CollectorRegistry

from tailguard.controller.adapters.changes.tracker import ChangeTracker, build_change_tracker
from tailguard.controller.adapters.metrics.prometheus import PrometheusSource, SourceConfigError
from tailguard.controller.adapters.notify.webhook import decision_links
from tailguard.controller.adapters.stores.incidents import SqliteIncidentStore
from tailguard.controller.adapters.stores.journal import Journal, JournalError
from tailguard.controller.adapters.tier.local_tier import LocalTierClient
from tailguard.controller.app.api import ControllerAPI
from tailguard.controller.app.extras import CLUSTER, ML, require
from tailguard.controller.app.peer_auth import PeerKey
from tailguard.controller.app.registrations import (
    ANNOTATIONS,
    NOTIFY,
    ROLLBACK,
    SCALE,
    SCALE_LIMITS,
    TRAFFIC,
    grafana_annotator,
    tier_client,
)
from tailguard.controller.app.registry import BuildContext, ClusterConnection, PortRegistry
from tailguard.controller.app.settings import ControllerSettings
from tailguard.controller.app.status_page import dashboard_link
from tailguard.controller.core.actions import ActionType
from tailguard.controller.core.policy import Condition
from tailguard.controller.core.policy_files import LoadedPolicy, PolicyError, load_policies
from tailguard.controller.core.ports import ChangeTrackerPort, IncidentStorePort
from tailguard.controller.kit.clock import SystemClock
from tailguard.controller.kit.errors import ConfigError, StoreError
from tailguard.controller.loop.adoption import Adoption
from tailguard.controller.loop.annotating_dispatcher import DecisionAnnotatingDispatcher
from tailguard.controller.loop.dispatcher import Actuators, Dispatcher
from tailguard.controller.loop.embedding import embed_dispatcher
from tailguard.controller.loop.evaluation import action_labels
from tailguard.controller.loop.housekeeping import Housekeeper, Task
from tailguard.controller.loop.incidents import IncidentKeeper
from tailguard.controller.loop.metrics import ControllerMetrics
from tailguard.controller.loop.runtime import Controller
from tailguard.predictors.serving import PredictionProvider

if TYPE_CHECKING:  # the cluster extra (kubernetes, grafana-client): imported where a section needs it
    from tailguard.controller.adapters.annotations.grafana import GrafanaAnnotator
    from tailguard.controller.adapters.lease.leader import LeaderElector
    from tailguard.controller.adapters.lease.shards import ShardedElector
    from tailguard.controller.adapters.policies.crd import CrdPolicySource

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
_ACTUATOR_REGISTRIES: dict[ActionType, PortRegistry[Any]] = {
    ActionType.ROLLBACK: ROLLBACK,
    ActionType.SCALE: SCALE,
    ActionType.SHIFT_TRAFFIC: TRAFFIC,
}


def missing_actuators(settings: ControllerSettings, loaded: Sequence[LoadedPolicy]) -> list[PolicyError]:
    """An action no configured actuator can run would only fail when the incident comes: refuse the policy now.

    One error per policy and action type, naming the file, the type and the sections that would provide it (its
    port's registry, controller/app/registrations.py). A policy in dry run (its own flag, or `dryRun` here) calls
    no actuator and needs none.
    """
    provided = {kind: registry.provided(settings) for kind, registry in _ACTUATOR_REGISTRIES.items()}
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
                    f"configured: add {_ACTUATOR_REGISTRIES[kind].hint()} to the controller configuration",
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


def build(
    settings: ControllerSettings, stack: ExitStack, *, webhook_token: str | None, new_journal: bool = False
) -> Application:
    """Every part of the controller from its settings; `ConfigError` names what is unusable (the caller
    prefixes the configuration file). `new_journal`: an empty or foreign file at the journal path is set aside
    for a new journal instead of refused (`tailguard run --new-journal`). Which adapter answers each port is the
    registries' choice (controller/app/registrations.py)."""
    if settings.predictors:
        require(ML, "predictors")  # the artifacts load with scikit-learn and skops
    clock = SystemClock()
    metrics = ControllerMetrics(CollectorRegistry())
    source, journal = _source_and_journal(settings, clock, stack, new_journal)
    context = BuildContext(settings, clock, settings.base_dir, settings.state_path(), stack)
    grafana = grafana_annotator(context)
    # The cluster (the actuators' connection, the leader Lease): one ApiClient, built from `kubernetes`.
    context.cluster, lease = _cluster(settings, clock, journal, stack)
    elector, sharded = lease.elector, lease.sharded
    tracker: ChangeTrackerPort | None = _change_tracker(settings, clock, tier_client(context), context.cluster)
    # Incidents: one per service scope, in TailguardIncidents (every replica reads them) or in the journal's file;
    # rollbacks, scales, shifts and the change feed go through them (controller/loop/incident_ports.py).
    keeper = IncidentKeeper(_incident_store(settings, context.cluster, stack), clock)
    actuators = _actuators(context)
    # Actions run on per-service workers, outside the evaluations (a rollback waiting on a sync holds neither its
    # policy's evaluations nor another service's actions); a replica that lost the Lease leaves them journaled.
    # The chain (incident layer, journal-first dispatcher) is the one every embedding program wires
    # (controller/loop/embedding.py).
    embedded = embed_dispatcher(
        journal,
        actuators,
        clock,
        settings.limits,
        incidents=keeper,
        change_tracker=tracker,
        on_action=lambda record: metrics.record_action(*action_labels(record)),
        links_for=lambda d: decision_links(settings.links, d, clock.now()),
        workers=True,
        may_act=elector.is_leader if elector is not None and sharded is None else None,
        # Sharded: an action runs only while this replica holds its policy's shard Lease.
        may_act_for=sharded.leads if sharded is not None else None,
    )
    dispatcher, tracker = embedded.dispatcher, embedded.change_tracker
    # TailguardPolicy custom resources: listed now (their policies load with the files), then watched; the leader
    # writes their status.
    crd_source = _crd_policies(settings, clock, context.cluster, journal, elector, sharded, stack)
    policy_paths = settings.policy_paths() + ([crd_source.directory] if crd_source is not None else [])
    controller = Controller(
        policy_paths=policy_paths,
        source=source,
        journal=journal,
        # Every decision also becomes a Grafana region (onset -> resolution) when Grafana is configured.
        dispatcher=DecisionAnnotatingDispatcher(embedded.port, grafana, journal)
        if grafana is not None
        else embedded.port,
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
    if lease.single is not None:
        # The unfinished actions travel in the Lease: published once planned, adopted by a successor (with
        # sharding each shard's Lease carries action times only; adoption there is not built yet).
        _attach_adoption(lease.single, journal, dispatcher, clock)
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
    api = _api(settings, controller, lease, clock, webhook_token, stack)
    return Application(settings, controller, api, grafana, elector, housekeeper)


def _source_and_journal(
    settings: ControllerSettings, clock: SystemClock, stack: ExitStack, new_journal: bool
) -> tuple[PrometheusSource, Journal]:
    try:
        settings.state_path().mkdir(parents=True, exist_ok=True)
        source = PrometheusSource(settings.prometheus, clock)
        journal = Journal(settings.journal_path(), new_journal=new_journal, now=clock.now())
    except (OSError, SourceConfigError, JournalError) as unusable:
        raise ConfigError(str(unusable)) from unusable
    # Closed last (the controller's stop closes it too; closing twice is harmless).
    stack.callback(journal.close)
    return source, journal


def _actuators(context: BuildContext) -> Actuators:
    """One port per action type, each its registry's choice; a port left out answers with its "not configured"
    failure (controller/core/unconfigured.py)."""
    unconfigured = Actuators()
    return Actuators(
        rollback=context.port(ROLLBACK) or unconfigured.rollback,
        scale=context.port(SCALE) or unconfigured.scale,
        router=context.port(TRAFFIC) or unconfigured.router,
        annotator=context.port(ANNOTATIONS) or unconfigured.annotator,
        notifier=context.port(NOTIFY) or unconfigured.notifier,
        # A scale's ceiling and metric targets: the HPA scaler only.
        limits=context.port(SCALE_LIMITS),
    )


@dataclass(frozen=True)
class Leadership:
    """The Lease elector of `leaderElection` (None without it), as the sharded one (with `shards` > 1) or the one
    leader's (`single`)."""

    elector: LeaderElector | ShardedElector | None = None
    sharded: ShardedElector | None = None
    single: LeaderElector | None = None


def _cluster(
    settings: ControllerSettings, clock: SystemClock, journal: Journal, stack: ExitStack
) -> tuple[ClusterConnection | None, Leadership]:
    """The connection of the `kubernetes` section (the actuators' ApiClient and Event recorder), and the Lease
    elector of `leaderElection` (with shards: also as the sharded elector each policy is led through)."""
    if settings.kubernetes is None and settings.leaderElection is None:
        return None, Leadership()
    require(CLUSTER, "kubernetes" if settings.kubernetes is not None else "leaderElection")
    # The cluster extra (kubernetes): imported only when a section needs it.
    from tailguard.controller.adapters.lease.shards import ShardedElector
    from tailguard.controller.app.cluster import build_leader_elector, connect

    cluster: ClusterConnection | None = None
    elector: LeaderElector | ShardedElector | None = None
    try:
        if settings.kubernetes is not None:
            cluster = connect(settings.kubernetes, clock, base_dir=settings.base_dir)
            stack.callback(cluster.api_client.close)
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
            # After the controller stopped acting: releases the Lease so the standby leads at once (an elector
            # that never started holds nothing, so a configuration error never touches the Lease).
            stack.callback(_stop_if_running, elector)
    except ConfigError as unreachable:  # ClusterConfigError
        raise ConfigError(str(unreachable)) from unreachable
    if isinstance(elector, ShardedElector):
        return cluster, Leadership(elector, sharded=elector)
    return cluster, Leadership(elector, single=elector)


def _crd_policies(
    settings: ControllerSettings,
    clock: SystemClock,
    cluster: ClusterConnection | None,
    journal: Journal,
    elector: LeaderElector | ShardedElector | None,
    sharded: ShardedElector | None,
    stack: ExitStack,
) -> CrdPolicySource | None:
    """The TailguardPolicy source of `kubernetes.policies`, started (None without the section)."""
    if cluster is None or settings.kubernetes is None or settings.kubernetes.policies is None:
        return None
    # The cluster extra (kubernetes): imported only with a kubernetes.policies section.
    from tailguard.controller.adapters.policies.crd import CrdPolicySource

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
    return crd_source


def _attach_adoption(elector: LeaderElector, journal: Journal, dispatcher: Dispatcher, clock: SystemClock) -> None:
    elector.attach_pending(Adoption(journal, dispatcher.planner, clock))
    dispatcher.on_planned = lambda _policy: elector.publish()


def _api(
    settings: ControllerSettings,
    controller: Controller,
    lease: Leadership,
    clock: SystemClock,
    webhook_token: str | None,
    stack: ExitStack,
) -> ControllerAPI:
    """The HTTP API, listening; with one leader (not sharded) a standby forwards to the leader's API, whose URL
    the leader publishes."""
    # Replica-to-replica trust: the replicas' own key (else derived from the token inside the API), and which Lease
    # URL is a replica's (the holder's pod of this Deployment, on the API's port).
    peer_secret = settings.peer_secret()
    single = lease.single
    peers = None
    if single is not None and settings.leaderElection is not None:
        # The cluster extra (kubernetes): imported with the leaderElection section, as the elector was.
        from tailguard.controller.app.cluster import build_peer_check

        peers = build_peer_check(single, settings.leaderElection, clock, settings.listen.port)
    try:
        api = ControllerAPI(
            controller,
            settings.listen.host,
            settings.listen.port,
            webhook_token=webhook_token,
            # A standby answers alerts with 503 (Alertmanager retries, through the Service, on the leader).
            leader=lease.elector,
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
    if single is not None and settings.leaderElection is not None:
        # One view across replicas: the leader publishes where its API answers (the bound port: 0 picks one).
        # Sharded replicas each lead their own shards: there is no one leader to forward to, each answers itself.
        advertised = settings.leaderElection.advertised_url(api.port)
        if advertised is not None:
            single.advertise(advertised)
    return api


def _incident_store(
    settings: ControllerSettings, cluster: ClusterConnection | None, stack: ExitStack | None = None
) -> IncidentStorePort:
    incidents = settings.kubernetes.incidents if settings.kubernetes is not None else None
    if cluster is not None and incidents is not None:
        # The cluster extra (kubernetes): imported only with a kubernetes.incidents section.
        from kubernetes import client as k8s

        from tailguard.controller.adapters.stores.incident_resources import KubernetesIncidentStore

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
    settings: ControllerSettings, clock: SystemClock, tier: LocalTierClient | None, cluster: ClusterConnection | None
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
