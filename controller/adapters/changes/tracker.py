"""The change tracker: which rollouts happened, from the systems that make them.

A `ChangeSource` lists rollouts since a time; the `ChangeTracker` asks every source
once per evaluation and turns a failing source into data (`ChangeFeed.errors`), so a
change source outage makes attribution "unknown" and never breaks an evaluation.

Sources:
* `ArgoCDHistorySource`: an Argo CD application's `status.history` (one rollout per entry after the first;
  the diff is that of the Helm parameters, which is where the vLLM engine arguments live in our charts).
* `TierRevisionSource`: the local serving tier's revisions (GET /api/v1/services/{svc}/revisions); the diff is
  `tailguard.serving.tier.profiles.profile_diff` of the two engine profiles.
* `KubernetesDeploymentSource`: Deployment revisions as their ReplicaSets record them
  (`deployment.kubernetes.io/revision`); the diff is that of the vLLM container's command-line flags. A rollback
  (kubectl's or tailguard's) revives an old ReplicaSet as the next revision; tailguard's is dated by its
  `tailguard.io/rolled-back-at` annotation (copied from the Deployment), others by the ReplicaSet's creation.
"""

from __future__ import annotations

import itertools
import logging
from collections.abc import Callable, Iterable, Mapping, Sequence
from datetime import datetime
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field

from tailguard.controller.adapters.argocd.client import ArgoCDClient, ArgoCDError, HistoryEntry, history_of, read_token
from tailguard.controller.adapters.argocd.settings import ArgoCDApp, ArgoCDSettings
from tailguard.controller.core.attribution import ChangeFeed, Rollout
from tailguard.controller.core.policy import Duration
from tailguard.controller.core.ports import ChangeSource, Clock, TierReader
from tailguard.controller.kit.errors import SourceError

log = logging.getLogger(__name__)

__all__ = [
    "ArgoCDHistorySource",
    "ChangeSourceError",
    "ChangeTracker",
    "ChangeTrackingSettings",
    "KubernetesDeploymentSource",
    "Rollout",
    "TierRevisionSource",
    "args_diff",
    "build_change_tracker",
    "parse_vllm_args",
]

REVISION_ANNOTATION = "deployment.kubernetes.io/revision"
# Written by a tailguard Deployment rollback (controller/adapters/rollback/deployment.py); the deployment controller
# copies it onto the ReplicaSet the rollback revives, whose creationTimestamp is that of its first rollout.
ROLLED_BACK_AT = "tailguard.io/rolled-back-at"


class ChangeSourceError(SourceError):
    """A change source could not be read; the tracker records it as data."""


class ChangeTracker:
    def __init__(self, sources: Sequence[ChangeSource]) -> None:
        self.sources = list(sources)

    def rollouts(self, since: float) -> ChangeFeed:
        found: list[Rollout] = []
        errors: list[str] = []
        for source in self.sources:
            try:
                found.extend(rollout for rollout in source.rollouts(since) if rollout.at >= since)
            except ChangeSourceError as failed:
                errors.append(f"{source.name}: {failed}")
            except Exception as failed:  # a source bug must not stop the evaluation: it is a source error
                log.exception("change source %s raised", source.name)
                errors.append(f"{source.name}: {type(failed).__name__}: {failed}")
        for error in errors:
            log.warning("change source error (attribution will say unknown): %s", error)
        return ChangeFeed(tuple(sorted(found, key=lambda r: (r.at, r.source, r.revision))), tuple(errors))


def parse_time(value: Any) -> float | None:
    """RFC 3339 (`2024-05-01T12:00:00Z`) or a datetime -> epoch seconds; None when absent or unreadable."""
    if isinstance(value, datetime):
        return value.timestamp()
    if not isinstance(value, str) or not value:
        return None
    try:
        return datetime.fromisoformat(value).timestamp()
    except ValueError:
        return None


def _changes(before: Mapping[str, Any], after: Mapping[str, Any]) -> dict[str, dict[str, Any]]:
    return {
        key: {"from": before.get(key), "to": after.get(key)}
        for key in sorted(set(before) | set(after))
        if before.get(key) != after.get(key)
    }


# -- Argo CD ------------------------------------------------------------------------------------------------


def helm_parameters(entry: HistoryEntry) -> dict[str, Any]:
    helm = entry.source.get("helm") or {}
    return {str(p.get("name")): p.get("value") for p in helm.get("parameters") or [] if isinstance(p, Mapping)}


class ArgoCDHistorySource:
    name = "argocd"

    def __init__(
        self,
        client: ArgoCDClient,
        apps: Mapping[str, ArgoCDApp],
        engine_args: Callable[[HistoryEntry], Mapping[str, Any]] = helm_parameters,
    ) -> None:
        self.client = client
        self.apps = dict(apps)
        self.engine_args = engine_args

    def rollouts(self, since: float) -> list[Rollout]:
        found: list[Rollout] = []
        for service, app in sorted(self.apps.items()):
            try:
                body = self.client.get_app(app.name, app.appNamespace)
            except ArgoCDError as failed:
                raise ChangeSourceError(str(failed)) from failed
            history = history_of(body)
            for previous, entry in itertools.pairwise(history):
                at = parse_time(entry.deployed_at)
                if at is None or at < since or entry.revision == previous.revision:
                    continue
                found.append(
                    Rollout(
                        labels={"service": service, "application": app.name},
                        revision=entry.revision,
                        previous_revision=previous.revision,
                        at=at,
                        source=self.name,
                        diff=_changes(self.engine_args(previous), self.engine_args(entry)),
                    )
                )
        return found


# -- local serving tier -------------------------------------------------------------------------------------


class TierRevisionSource:
    name = "tier"

    def __init__(self, tier: TierReader, services: Sequence[str] | None = None) -> None:
        self.tier = tier
        self.services = list(services) if services is not None else None

    def rollouts(self, since: float) -> list[Rollout]:
        try:
            services = self.services or [str(s["name"]) for s in self.tier.services() if "name" in s]
            listed = {service: self.tier.revisions(service) for service in services}
        except Exception as failed:  # TierError and friends: the tier client raises on failed reads
            raise ChangeSourceError(str(failed)) from failed
        found: list[Rollout] = []
        for service, revisions in listed.items():
            ordered = sorted(revisions, key=lambda r: int(r.get("revision", 0)))
            for previous, current in itertools.pairwise(ordered):
                at = current.get("created_at")
                if not isinstance(at, (int, float)) or at < since:
                    continue
                # The tier diffs its own profiles (serving/tier/server.py revisions_answer): null when it could not.
                diff = current.get("profile_diff")
                if not isinstance(diff, dict):  # an unreadable profile is still a rollout, without a diff
                    log.warning("tier %s revision %s: profile diff unavailable", service, current.get("version"))
                    diff = {}
                found.append(
                    Rollout(
                        labels={"service": service, "version": str(current.get("version", ""))},
                        revision=str(current.get("version") or f"r{current.get('revision')}"),
                        previous_revision=str(previous.get("version") or f"r{previous.get('revision')}"),
                        at=float(at),
                        source=self.name,
                        diff=diff,
                    )
                )
        return found


# -- Kubernetes Deployments ---------------------------------------------------------------------------------


def parse_vllm_args(args: Iterable[str]) -> dict[str, Any]:
    """`--max-num-seqs 64 --enable-prefix-caching --kv-cache-dtype=fp8` -> {max_num_seqs: "64", ...: True}."""
    parsed: dict[str, Any] = {}
    tokens = list(args)
    index = 0
    while index < len(tokens):
        token = tokens[index]
        index += 1
        if not token.startswith("--"):
            continue
        name, equals, value = token[2:].partition("=")
        key = name.replace("-", "_")
        if equals:
            parsed[key] = value
        elif index < len(tokens) and not tokens[index].startswith("--"):
            parsed[key] = tokens[index]
            index += 1
        else:
            parsed[key] = True
    return parsed


def args_diff(before: Iterable[str], after: Iterable[str]) -> dict[str, dict[str, Any]]:
    return _changes(parse_vllm_args(before), parse_vllm_args(after))


class KubernetesDeploymentSource:
    """Deployment revisions from their ReplicaSets (`AppsV1Api.list_namespaced_replica_set`)."""

    name = "kubernetes"

    def __init__(
        self,
        apps_api: Any,
        namespace: str,
        *,
        label_selector: str = "",
        service_label: str = "app.kubernetes.io/name",
        container: str | None = None,
        timeout: float = 10.0,
    ) -> None:
        self.api = apps_api
        self.namespace = namespace
        self.label_selector = label_selector
        self.service_label = service_label
        self.container = container
        self.timeout = timeout

    def _args(self, replica_set: Any) -> list[str]:
        containers = list(replica_set.spec.template.spec.containers or [])
        chosen = next((c for c in containers if c.name == self.container), containers[0] if containers else None)
        if chosen is None:
            return []
        return [*(chosen.command or []), *(chosen.args or [])]

    def rollouts(self, since: float) -> list[Rollout]:
        try:
            listed = self.api.list_namespaced_replica_set(
                self.namespace, label_selector=self.label_selector, _request_timeout=self.timeout
            )
        except Exception as failed:  # ApiException, urllib3 errors: the source is unreadable now
            status = getattr(failed, "status", None)
            raise ChangeSourceError(
                f"listing ReplicaSets in {self.namespace!r}: {f'HTTP {status}: ' if status else ''}"
                f"{getattr(failed, 'reason', None) or type(failed).__name__}"
            ) from failed
        by_deployment: dict[str, list[tuple[int, Any]]] = {}
        for replica_set in listed.items or []:
            meta = replica_set.metadata
            owner = next((o.name for o in meta.owner_references or [] if o.kind == "Deployment"), None)
            revision = (meta.annotations or {}).get(REVISION_ANNOTATION)
            if owner is None or revision is None or not str(revision).isdigit():
                continue
            by_deployment.setdefault(owner, []).append((int(revision), replica_set))
        found: list[Rollout] = []
        for deployment, entries in sorted(by_deployment.items()):
            entries.sort(key=lambda pair: pair[0])
            for (previous_number, previous), (number, current) in itertools.pairwise(entries):
                at = parse_time(current.metadata.creation_timestamp)
                revived = parse_time((current.metadata.annotations or {}).get(ROLLED_BACK_AT))
                if at is not None and revived is not None and revived > at:
                    at = revived  # a rollback revived an old ReplicaSet: the rollout happened then
                if at is None or at < since:
                    continue
                labels = dict(current.metadata.labels or {})
                found.append(
                    Rollout(
                        labels={
                            "service": labels.get(self.service_label, deployment),
                            "deployment": deployment,
                            "namespace": self.namespace,
                        },
                        revision=str(number),
                        previous_revision=str(previous_number),
                        at=at,
                        source=self.name,
                        diff=args_diff(self._args(previous), self._args(current)),
                    )
                )
        return found


# -- configuration ------------------------------------------------------------------------------------------


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class KubernetesChangeSettings(_Strict):
    namespace: str = Field(min_length=1, description="namespace of the serving Deployments")
    labelSelector: str = Field(default="", description="which ReplicaSets to read, e.g. app.kubernetes.io/part-of=llm")
    serviceLabel: str = Field(default="app.kubernetes.io/name", description="the label that names the service")
    container: str | None = Field(default=None, description="the vLLM container (default: the first)")
    timeout: float = Field(default=10.0, gt=0)


class ChangeTrackingSettings(_Strict):
    """`changeTracking:` in the controller configuration."""

    sources: list[Literal["argocd", "tier", "kubernetes"]] = Field(
        min_length=1, description="where rollouts are read from (argocd needs `argocd:`, tier needs `tier:`)"
    )
    window: Duration = Field(
        default=3600.0, description="how far back rollouts are read, at least (policies' attribution windows extend it)"
    )
    kubernetes: KubernetesChangeSettings | None = None


def _token_reader(token_file: str | None, token_env: str | None) -> Callable[[], str | None]:
    """Read at each call, so a rotated token (a re-mounted Secret) is picked up without a restart."""
    return lambda: read_token(token_file, token_env)


def build_change_tracker(
    settings: ChangeTrackingSettings,
    *,
    clock: Clock,
    argocd: ArgoCDSettings | None = None,
    tier: TierReader | None = None,
    apps_api: Any = None,
    base_dir: Any = None,
) -> ChangeTracker:
    """The tracker the configuration asks for; ValueError names a source whose settings are missing."""
    sources: list[ChangeSource] = []
    for name in settings.sources:
        if name == "argocd":
            if argocd is None:
                raise ValueError("changeTracking.sources lists argocd, but there is no `argocd:` section")
            token_file = argocd.tokenFile
            if token_file is not None and base_dir is not None:
                from pathlib import Path

                candidate = Path(token_file)
                token_file = str(candidate if candidate.is_absolute() else Path(base_dir) / candidate)
            client = ArgoCDClient(
                argocd.url,
                clock=clock,
                token=_token_reader(token_file, argocd.tokenEnv),
                timeout=argocd.timeout,
                retries=argocd.retries,
            )
            sources.append(ArgoCDHistorySource(client, argocd.apps))
        elif name == "tier":
            if tier is None:
                raise ValueError("changeTracking.sources lists tier, but there is no `tier:` section")
            sources.append(TierRevisionSource(tier))
        else:
            if settings.kubernetes is None:
                raise ValueError("changeTracking.sources lists kubernetes, but changeTracking.kubernetes is missing")
            if apps_api is None:
                # The cluster extra (kubernetes): imported only for a kubernetes source built here (no apps_api).
                from kubernetes import client as k8s_client
                from kubernetes import config as k8s_config

                try:
                    k8s_config.load_incluster_config()  # type: ignore[no-untyped-call]
                except k8s_config.ConfigException:
                    k8s_config.load_kube_config()  # type: ignore[no-untyped-call]
                apps_api = k8s_client.AppsV1Api()
            k8s = settings.kubernetes
            sources.append(
                KubernetesDeploymentSource(
                    apps_api,
                    k8s.namespace,
                    label_selector=k8s.labelSelector,
                    service_label=k8s.serviceLabel,
                    container=k8s.container,
                    timeout=k8s.timeout,
                )
            )
    return ChangeTracker(sources)
