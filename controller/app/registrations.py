"""The registry of each port (controller/app/registry.py) and the built-in adapters: one registry line each.

| port | registry | adapters, in the order they are chosen |
|---|---|---|
| rollback | `ROLLBACK` | `kubernetes.rollback` (Deployments) or `argocd` (never both), `tier` (fallback) |
| scale | `SCALE` | `kubernetes.hpa` (the HPA floor), `tier` (fallback) |
| a scale's ceiling and metric targets | `SCALE_LIMITS` | `kubernetes.hpa` |
| shift_traffic | `TRAFFIC` | `kubernetes.traffic` (HTTPRoute / VirtualService weights), `tier` (fallback) |
| notify | `NOTIFY` | `receivers` (webhooks) |
| annotate | `ANNOTATIONS` | `annotations` (JSONL) and `annotations.grafana`, fanned out |

A factory that needs the cluster extra (kubernetes, grafana-client) imports its adapter inside the factory, with a
comment: the configuration loads, and a configuration without such a section runs, without the extra. The Kubernetes
actuators share the connection `build()` makes from the `kubernetes` section (`BuildContext.cluster`).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING, Any

from tailguard.controller.adapters.annotations.jsonl import FanoutAnnotator, JsonlAnnotator
from tailguard.controller.adapters.annotations.settings import AnnotationSettings, GrafanaSettings, GrafanaTokenError
from tailguard.controller.adapters.argocd.settings import ArgoCDSettings
from tailguard.controller.adapters.notify.webhook import WebhookNotifier, WebhookReceiver
from tailguard.controller.adapters.rollback.argocd import ArgoCDRollback
from tailguard.controller.adapters.rollback.settings import RollbackSettings
from tailguard.controller.adapters.scale.settings import HpaSettings
from tailguard.controller.adapters.stores.outbox import OutboxError
from tailguard.controller.adapters.tier.local_tier import LocalTierClient
from tailguard.controller.adapters.tier.settings import TierSettings
from tailguard.controller.adapters.traffic.settings import TrafficSettings
from tailguard.controller.app.extras import CLUSTER, require
from tailguard.controller.app.registry import Adapter, BuildContext, PortRegistry, Section
from tailguard.controller.core.ports import (
    Annotator,
    NoticePayload,
    Notifier,
    NotifyRequest,
    RollbackPort,
    ScaleLimitsPort,
    ScalePort,
    TrafficRouter,
)
from tailguard.controller.kit.errors import ConfigError

if TYPE_CHECKING:  # the cluster extra: imported by the factories that need it
    from tailguard.controller.adapters.annotations.grafana import GrafanaAnnotator
    from tailguard.controller.adapters.rollback.deployment import DeploymentRollback
    from tailguard.controller.adapters.scale.hpa import HpaScaler
    from tailguard.controller.adapters.traffic.routes import HttpRouteRouter, VirtualServiceRouter

ROLLBACK: PortRegistry[RollbackPort] = PortRegistry("rollback", verb="roll back", exclusive=True)
SCALE: PortRegistry[ScalePort] = PortRegistry("scale", verb="scale", exclusive=True)
SCALE_LIMITS: PortRegistry[ScaleLimitsPort] = PortRegistry("scale limits")
TRAFFIC: PortRegistry[TrafficRouter] = PortRegistry("shift_traffic", verb="shift traffic", exclusive=True)
NOTIFY: PortRegistry[Notifier] = PortRegistry("notify")
ANNOTATIONS: PortRegistry[Annotator] = PortRegistry("annotate", combine=FanoutAnnotator)
REGISTRIES: tuple[PortRegistry[Any], ...] = (ROLLBACK, SCALE, SCALE_LIMITS, TRAFFIC, NOTIFY, ANNOTATIONS)

# The sections (declared in controller/app/settings.py and cluster_settings.py with these models, each model
# beside its adapter).
TIER = Section[TierSettings]("tier", TierSettings, "local serving tier (rollback, scale, traffic)")
ARGOCD = Section[ArgoCDSettings]("argocd", ArgoCDSettings, "Argo CD: rollback of the mapped applications")
RECEIVERS = Section[Mapping[str, WebhookReceiver]]("receivers", dict[str, WebhookReceiver], "notify receivers")
ANNOTATIONS_FILE = Section[AnnotationSettings]("annotations", AnnotationSettings, "the JSONL annotations file")
GRAFANA = Section[GrafanaSettings]("annotations.grafana", GrafanaSettings, "annotations in Grafana")
HPA = Section[HpaSettings]("kubernetes.hpa", HpaSettings, "scale actions through HorizontalPodAutoscalers")
ROUTES = Section[TrafficSettings]("kubernetes.traffic", TrafficSettings, "shift_traffic through route weights")
DEPLOYMENTS = Section[RollbackSettings]("kubernetes.rollback", RollbackSettings, "rollback of Deployment revisions")


def tier_client(context: BuildContext) -> LocalTierClient | None:
    """The one client of the local tier (rollback, scale, traffic and change tracking share it)."""
    tier = TIER.of(context.settings)
    if tier is None:
        return None
    return context.once(
        "tier", lambda: LocalTierClient(tier.url, timeout=tier.timeout, retries=tier.retries, clock=context.clock)
    )


def grafana_annotator(context: BuildContext) -> GrafanaAnnotator | None:
    """The Grafana annotator (`annotations.grafana`): an annotator, the decisions' regions, the rollouts' marks."""
    grafana = GRAFANA.of(context.settings)
    return context.once("grafana", lambda: _grafana(grafana, context)) if grafana is not None else None


def _grafana(settings: GrafanaSettings, context: BuildContext) -> GrafanaAnnotator:
    require(CLUSTER, "annotations.grafana")
    # The cluster extra (grafana-client): imported only with an annotations.grafana section.
    from tailguard.controller.adapters.annotations.grafana import GrafanaAnnotator

    try:
        grafana = GrafanaAnnotator.from_settings(settings, context.clock, context.path(settings.outbox))
    except (GrafanaTokenError, OutboxError) as unusable:
        raise ConfigError(f"annotations.grafana: {unusable}") from unusable
    # Closed after the elector released the Lease and before the journal (its outbox is its own file).
    context.stack.callback(grafana.close)
    return grafana


def _tier(_tier_settings: TierSettings, context: BuildContext) -> LocalTierClient:
    client = tier_client(context)
    assert client is not None  # chosen only when the section is there
    return client


def _argocd(argocd: ArgoCDSettings, context: BuildContext) -> ArgoCDRollback:
    notifier = context.port(NOTIFY)
    return ArgoCDRollback.from_settings(
        argocd,
        clock=context.clock,
        record_path=context.state_file("argocd-bad-revisions.json"),
        base_dir=context.base_dir,
        # Auto-sync switched off to roll back: every receiver hears it, so a human turns it back on.
        notice=_notify_receivers(notifier, context) if isinstance(notifier, WebhookNotifier) else None,
    )


def _notify_receivers(notifier: WebhookNotifier, context: BuildContext) -> Callable[[str, Mapping[str, Any]], None]:
    """The Argo CD rollback's notice (auto-sync disabled) as a notification to every configured receiver."""
    receivers, clock = list(notifier.receivers), context.clock

    def notice(text: str, detail: Mapping[str, Any]) -> None:
        key = f"notice:auto-sync-disabled:{detail.get('application', '')}:{clock.now():.0f}"
        for receiver in receivers:
            notifier.notify(NotifyRequest(receiver, NoticePayload(text, detail), key))

    return notice


def hpa_scaler(hpa: HpaSettings, context: BuildContext) -> HpaScaler:
    """The HPA scaler (`kubernetes.hpa`): the scale port and the scale limits port, one object."""
    return context.once("hpa", lambda: _new_hpa_scaler(hpa, context))


def _new_hpa_scaler(hpa: HpaSettings, context: BuildContext) -> HpaScaler:
    cluster = context.require_cluster(HPA.path)
    # The cluster extra (kubernetes): imported only with a kubernetes.hpa section.
    from kubernetes import client as k8s

    from tailguard.controller.adapters.scale.hpa import HpaBounds, HpaScaler, HpaTarget

    return HpaScaler(
        k8s.AutoscalingV2Api(cluster.api_client),
        clock=context.clock,
        bounds=HpaBounds(
            max_replicas=hpa.maxReplicas,
            allow_below_human_floor=hpa.allowBelowHumanFloor,
            min_replicas=hpa.minReplicas,
            metric_targets={name: (b.min, b.max) for name, b in hpa.metricTargets.items()},
        ),
        targets={
            service: HpaTarget(ref.namespace or cluster.namespace, ref.name) for service, ref in hpa.targets.items()
        },
        namespace=cluster.namespace,
        timeout=cluster.timeout,
        retry=cluster.retry,
        events=cluster.events,
    )


def route_router(traffic: TrafficSettings, context: BuildContext) -> HttpRouteRouter | VirtualServiceRouter:
    cluster = context.require_cluster(ROUTES.path)
    # The cluster extra (kubernetes): imported only with a kubernetes.traffic section.
    from kubernetes import client as k8s

    from tailguard.controller.adapters.traffic.routes import HttpRouteRouter, Ramp, RouteRef, VirtualServiceRouter

    router_class = HttpRouteRouter if traffic.kind == "httproute" else VirtualServiceRouter
    return router_class(
        k8s.CustomObjectsApi(cluster.api_client),
        clock=context.clock,
        routes={
            service: RouteRef(ref.namespace or cluster.namespace, ref.name) for service, ref in traffic.routes.items()
        },
        namespace=cluster.namespace,
        ramp=Ramp(tuple(traffic.ramp.steps), traffic.ramp.hold) if traffic.ramp is not None else None,
        timeout=cluster.timeout,
        retry=cluster.retry,
        events=cluster.events,
    )


def deployment_rollback(rollback: RollbackSettings, context: BuildContext) -> DeploymentRollback:
    cluster = context.require_cluster(DEPLOYMENTS.path)
    # The cluster extra (kubernetes): imported only with a kubernetes.rollback section.
    from kubernetes import client as k8s

    from tailguard.controller.adapters.rollback.deployment import DeploymentRef, DeploymentRollback, RollbackRecord

    return DeploymentRollback(
        k8s.AppsV1Api(cluster.api_client),
        k8s.CoreV1Api(cluster.api_client) if rollback.helm else None,
        clock=context.clock,
        targets={
            service: DeploymentRef(ref.namespace or cluster.namespace, ref.name)
            for service, ref in rollback.deployments.items()
        },
        namespace=cluster.namespace,
        helm=rollback.helm,
        record=RollbackRecord(context.state_file("deployment-rollbacks.json")),
        timeout=cluster.timeout,
        retry=cluster.retry,
        events=cluster.events,
    )


def _grafana_entry(_grafana_settings: GrafanaSettings, context: BuildContext) -> GrafanaAnnotator:
    grafana = grafana_annotator(context)
    assert grafana is not None  # chosen only when the section is there
    return grafana


# The registry lines. The order is the choice: the first configured one answers its port.
DEPLOYMENT_ROLLBACK = ROLLBACK.register(Adapter("deployment", DEPLOYMENTS, deployment_rollback))
ARGOCD_ROLLBACK = ROLLBACK.register(Adapter("argocd", ARGOCD, _argocd))
TIER_ROLLBACK = ROLLBACK.register(Adapter("tier", TIER, _tier, fallback=True))
HPA_SCALER = SCALE.register(Adapter("hpa", HPA, hpa_scaler))
TIER_SCALE = SCALE.register(Adapter("tier", TIER, _tier, fallback=True))
HPA_LIMITS = SCALE_LIMITS.register(Adapter("hpa", HPA, hpa_scaler))
ROUTE_ROUTER = TRAFFIC.register(Adapter("routes", ROUTES, route_router))
TIER_TRAFFIC = TRAFFIC.register(Adapter("tier", TIER, _tier, fallback=True))
WEBHOOKS = NOTIFY.register(Adapter("webhook", RECEIVERS, lambda receivers, c: WebhookNotifier(receivers, c.clock)))
JSONL = ANNOTATIONS.register(Adapter("jsonl", ANNOTATIONS_FILE, lambda a, c: JsonlAnnotator(c.path(a.path))))
GRAFANA_ANNOTATOR = ANNOTATIONS.register(Adapter("grafana", GRAFANA, _grafana_entry))
