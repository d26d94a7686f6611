"""Rollback of a plain Deployment, and of a Helm release through its Deployment: the `RollbackPort` without Argo CD.

rollback(service, rollout_revision) is what `kubectl rollout undo deployment/<name>` does
(k8s.io/kubectl/pkg/polymorphichelpers/rollback.go, DeploymentRollbacker), with tailguard's choice of revision:

* the Deployment's ReplicaSets (owned by it, `deployment.kubernetes.io/revision`) are its history; the bad revision
  is the one the breach is attributed to (`rollout_revision`), else the current one; the target is the newest
  revision before it whose pod template (its `pod-template-hash`) was never recorded as bad;
* a paused Deployment is refused (as kubectl does); a target whose template the Deployment already runs is done;
* one JSON patch, as kubectl sends it: `replace /spec/template` with the target ReplicaSet's template (its
  `pod-template-hash` label removed) and `replace /metadata/annotations` with the Deployment's own
  `deployment.kubernetes.io/revision` (and the other annotations kubectl skips) plus the target ReplicaSet's other
  annotations; tailguard adds `kubernetes.io/change-cause` (what it did and why), `tailguard.io/rolled-back-at`
  (the deployment controller copies it onto the ReplicaSet it revives, so the change tracker dates the rollback)
  and the idempotency key (`tailguard.io/action-keys`). A `test` of the resourceVersion guards the patch: if the
  Deployment changed in between, nothing is written; it is read again at once and the plan's precondition checked
  on what it shows (up to `CONFLICT_REREADS` times; a Deployment that keeps changing is a transient failure).
  The deployment controller then bumps the revived ReplicaSet to the next revision, exactly as after kubectl.

Helm. A Deployment Helm installed (`meta.helm.sh/release-name`) is detected, read only, through its release
Secrets (`sh.helm.release.v1.<release>.v<N>`, labels `owner=helm,name=<release>`; their `release` payload is the
base64 of the gzipped release JSON). With `helm: true` the target must be the Deployment of a previous Helm
revision (newest first, whose template a ReplicaSet still holds and is before the bad revision), and tailguard
acts through the Deployment only: it never applies a chart, so nothing is half-applied. The outcome records the
Helm revision restored and that Helm's history now differs (Helm still reports its own deployed revision): a human
runs `helm rollback <release> <revision>` (or fixes the values) to reconcile. No Helm revision whose Deployment a
ReplicaSet still holds: FAILED, nothing written.

Plan, then act. `plan_rollback` names the rollback (the Deployment, from/bad/to revision and their pod template
hashes); the dispatcher journals it before `rollback(plan=...)` acts, and a resume acts on the same plan: the
Deployment already running the target's template is done (`already_done`), one running neither the plan's
from-template nor its target was changed by someone else (WORLD_CHANGED, nothing written). The bad template is
written to the record file before the patch. All failures come back as an `ActionOutcome`.
"""

from __future__ import annotations

import base64
import datetime
import gzip
import json
import logging
import os
import threading
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml
from kubernetes import client as k8s

from tailguard.controller.adapters.kube.action_keys import ANNOTATION_KEYS, recorded_keys, with_key
from tailguard.controller.adapters.kube.calls import KubeError, kube_call
from tailguard.controller.adapters.kube.events import EventRecorder, ObjectRef
from tailguard.controller.core.ports import (
    AbortSignal,
    ActionOutcome,
    Clock,
    OutcomeStatus,
    RollbackPlan,
    RollbackRequest,
)
from tailguard.controller.kit.http import RetryPolicy

log = logging.getLogger(__name__)

REVISION = "deployment.kubernetes.io/revision"
CHANGE_CAUSE = "kubernetes.io/change-cause"
HASH_LABEL = "pod-template-hash"
HELM_RELEASE = "meta.helm.sh/release-name"
# The deployment controller copies it onto the ReplicaSet the rollback revives; the change tracker
# (controller/adapters/changes/tracker.py, which cannot import this module: adapters import no sibling in a circle)
# dates the rollback by it.
ROLLED_BACK_AT = "tailguard.io/rolled-back-at"
# A patch refused with 409 (its resourceVersion test failed) is read again and re-checked this many times in one
# attempt; a Deployment that keeps changing is then a transient failure (the dispatcher backs off and tries again).
CONFLICT_REREADS = 5
# The annotations kubectl's undo keeps from the Deployment instead of taking them from the ReplicaSet.
ANNOTATIONS_TO_SKIP = frozenset(
    {
        "kubectl.kubernetes.io/last-applied-configuration",
        REVISION,
        "deployment.kubernetes.io/revision-history",
        "deployment.kubernetes.io/desired-replicas",
        "deployment.kubernetes.io/max-replicas",
        "deprecated.deployment.rollback.to",
    }
)


@dataclass(frozen=True)
class DeploymentRef:
    namespace: str
    name: str


class RollbackRecord:
    """tailguard's record of the pod templates it rolled back from, per Deployment (JSON, written atomically before
    the patch; in memory without a path): never a rollback target again."""

    def __init__(self, path: Path | None = None) -> None:
        self.path = path
        self._lock = threading.Lock()
        self._data: dict[str, Any] = {"bad": {}}
        if path is not None and path.exists():
            loaded = json.loads(path.read_text(encoding="utf-8"))
            if isinstance(loaded, dict):
                self._data = {"bad": dict(loaded.get("bad", {}))}

    def bad(self, deployment: str) -> set[str]:
        with self._lock:
            return set(self._data["bad"].get(deployment, {}))

    def record_bad(self, deployment: str, template_hash: str, revision: Any, key: str, at: float) -> None:
        with self._lock:
            entry = {"revision": revision, "at": at, "idempotency_key": key}
            self._data["bad"].setdefault(deployment, {})[template_hash] = entry
            self._save()

    def _save(self) -> None:
        if self.path is None:
            return
        self.path.parent.mkdir(parents=True, exist_ok=True)
        scratch = self.path.with_suffix(self.path.suffix + ".tmp")
        scratch.write_text(json.dumps(self._data, sort_keys=True, default=str), encoding="utf-8")
        os.replace(scratch, self.path)


@dataclass(frozen=True)
class Revision:
    """One ReplicaSet of the Deployment: its revision number, template hash, template (hash label kept)."""

    number: int
    hash: str
    template: dict[str, Any]
    annotations: dict[str, str]
    name: str
    # When it began to run: its creation, or a rollback that revived it (tailguard's `rolled-back-at`), if later.
    since: float | None = None


def template_without_hash(template: Mapping[str, Any]) -> dict[str, Any]:
    """The pod template as the Deployment carries it: the ReplicaSet's `pod-template-hash` label removed."""
    copied = json.loads(json.dumps(template))
    labels = (copied.get("metadata") or {}).get("labels")
    if isinstance(labels, dict):
        labels.pop(HASH_LABEL, None)
    return dict(copied)


def containers_fingerprint(template: Mapping[str, Any]) -> list[tuple[str, str, tuple[str, ...], tuple[str, ...]]]:
    """What a Helm manifest's Deployment and a ReplicaSet are compared by (the server defaults the rest)."""
    spec = template.get("spec") or {}
    return sorted(
        (
            str(c.get("name")),
            str(c.get("image")),
            tuple(str(a) for a in c.get("command") or []),
            tuple(str(a) for a in c.get("args") or []),
        )
        for c in spec.get("containers") or []
    )


def decode_helm_release(data: str) -> dict[str, Any]:
    """A Helm 3 release Secret's `data.release`: base64 (the API's) of base64 of gzipped JSON."""
    raw = base64.b64decode(base64.b64decode(data))
    if raw[:2] == b"\x1f\x8b":
        raw = gzip.decompress(raw)
    decoded: dict[str, Any] = json.loads(raw)
    return decoded


def helm_deployment_template(release: Mapping[str, Any], name: str) -> dict[str, Any] | None:
    """The pod template of the Deployment `name` in a release's rendered manifest (None: not in it)."""
    for document in yaml.safe_load_all(str(release.get("manifest") or "")):
        if not isinstance(document, dict) or document.get("kind") != "Deployment":
            continue
        if (document.get("metadata") or {}).get("name") == name:
            template = (document.get("spec") or {}).get("template")
            return dict(template) if isinstance(template, dict) else None
    return None


class DeploymentRollback:
    """`RollbackPort` for Deployments (and Helm releases through their Deployment), `kubectl rollout undo` style."""

    def __init__(
        self,
        apps: k8s.AppsV1Api,
        core: k8s.CoreV1Api | None,
        *,
        clock: Clock,
        targets: Mapping[str, DeploymentRef] | None = None,
        namespace: str = "default",
        helm: bool = False,
        record: RollbackRecord | None = None,
        timeout: float = 5.0,
        retry: RetryPolicy | None = None,
        events: EventRecorder | None = None,
    ) -> None:
        self.apps = apps
        self.core = core
        self.clock = clock
        self.targets = dict(targets or {})
        self.namespace = namespace
        self.helm = helm
        self.record = record or RollbackRecord()
        self.timeout = timeout
        self.retry = retry or RetryPolicy()
        self.events = events

    def target(self, service: str) -> DeploymentRef:
        return self.targets.get(service) or DeploymentRef(self.namespace, service)

    def _serial(self, obj: Any) -> dict[str, Any]:
        serialised: dict[str, Any] = self.apps.api_client.sanitize_for_serialization(obj)
        return serialised

    # -- reads -----------------------------------------------------------------------------------------------

    def _deployment(self, ref: DeploymentRef) -> dict[str, Any] | KubeError:
        found = kube_call(
            lambda: self.apps.read_namespaced_deployment(ref.name, ref.namespace, _request_timeout=self.timeout),
            what=f"reading Deployment {ref.namespace}/{ref.name}",
            clock=self.clock,
            retry=self.retry,
        )
        return found if isinstance(found, KubeError) else self._serial(found)

    def _revisions(self, ref: DeploymentRef, deployment: Mapping[str, Any]) -> list[Revision] | KubeError:
        match = ((deployment.get("spec") or {}).get("selector") or {}).get("matchLabels") or {}
        selector = ",".join(f"{key}={value}" for key, value in sorted(match.items()))
        listed = kube_call(
            lambda: self.apps.list_namespaced_replica_set(
                ref.namespace, label_selector=selector, _request_timeout=self.timeout
            ),
            what=f"listing the ReplicaSets of Deployment {ref.namespace}/{ref.name}",
            clock=self.clock,
            retry=self.retry,
        )
        if isinstance(listed, KubeError):
            return listed
        uid = (deployment.get("metadata") or {}).get("uid")
        revisions: list[Revision] = []
        for item in self._serial(listed).get("items") or []:
            meta = item.get("metadata") or {}
            owners = meta.get("ownerReferences") or []
            if not any(o.get("kind") == "Deployment" and o.get("uid") == uid and o.get("controller") for o in owners):
                continue
            annotations = dict(meta.get("annotations") or {})
            number = str(annotations.get(REVISION, ""))
            template = dict((item.get("spec") or {}).get("template") or {})
            labels = (template.get("metadata") or {}).get("labels") or {}
            if number.isdigit():
                hash_ = str(labels.get(HASH_LABEL) or (meta.get("labels") or {}).get(HASH_LABEL) or meta.get("name"))
                since = _latest(meta.get("creationTimestamp"), annotations.get(ROLLED_BACK_AT))
                revisions.append(Revision(int(number), hash_, template, annotations, str(meta.get("name")), since))
        return sorted(revisions, key=lambda r: r.number)

    def _helm_templates(self, ref: DeploymentRef, release: str) -> list[tuple[int, str, dict[str, Any]]] | KubeError:
        """(Helm revision, status, the Deployment's template) of every revision of `release`, newest first."""
        if self.core is None:
            return []
        core = self.core
        listed = kube_call(
            lambda: core.list_namespaced_secret(
                ref.namespace, label_selector=f"owner=helm,name={release}", _request_timeout=self.timeout
            ),
            what=f"listing the Helm release Secrets of {ref.namespace}/{release}",
            clock=self.clock,
            retry=self.retry,
        )
        if isinstance(listed, KubeError):
            return listed
        found: list[tuple[int, str, dict[str, Any]]] = []
        for secret in self._serial(listed).get("items") or []:
            labels = (secret.get("metadata") or {}).get("labels") or {}
            payload = (secret.get("data") or {}).get("release")
            version = str(labels.get("version", ""))
            if not payload or not version.isdigit():
                continue
            try:
                template = helm_deployment_template(decode_helm_release(str(payload)), ref.name)
            except (ValueError, OSError, yaml.YAMLError) as unreadable:
                log.warning("Helm release %s v%s is unreadable: %s", release, version, unreadable)
                continue
            if template is not None:
                found.append((int(version), str(labels.get("status", "")), template))
        return sorted(found, key=lambda entry: -entry[0])

    # -- RollbackPort ----------------------------------------------------------------------------------------

    def plan_rollback(self, service: str, *, rollout_revision: str | None = None) -> RollbackPlan | ActionOutcome:
        """The rollback to make, journaled by the dispatcher before acting: the Deployment, `from_revision` (what
        runs now), `bad_revision` (the attributed rollout, else the current one), `to_revision`, and their pod
        template hashes; with Helm, the Helm revision restored and that Helm's history will differ."""
        ref = self.target(service)
        where = f"Deployment {ref.namespace}/{ref.name}"
        deployment = self._deployment(ref)
        if isinstance(deployment, KubeError):
            return deployment.outcome({"deployment": where})
        if (deployment.get("spec") or {}).get("paused"):
            return ActionOutcome(
                OutcomeStatus.FAILED, {"deployment": where}, f"{where}: you cannot rollback a paused deployment", False
            )
        revisions = self._revisions(ref, deployment)
        if isinstance(revisions, KubeError):
            return revisions.outcome({"deployment": where})
        planned = self._plan(ref, where, deployment, revisions, rollout_revision)
        if isinstance(planned, ActionOutcome):
            return planned
        return RollbackPlan.from_json({"service": service, **planned})

    def rollback(self, request: RollbackRequest, abort: AbortSignal | None = None) -> ActionOutcome:
        """Make the planned rollback (None: plan it now): done when the Deployment already runs the target's
        template, world-changed (nothing written) when it runs neither the plan's `from_revision` nor its target."""
        service, idempotency_key = request.service, request.idempotency_key
        ref = self.target(service)
        where = f"Deployment {ref.namespace}/{ref.name}"
        deployment = self._deployment(ref)
        if isinstance(deployment, KubeError):
            return deployment.outcome({"deployment": where})
        meta = deployment.get("metadata") or {}
        if idempotency_key in recorded_keys(meta.get("annotations")):
            return ActionOutcome(OutcomeStatus.SUCCEEDED, {"deployment": where, "replayed": True})
        planned = request.plan or self.plan_rollback(service, rollout_revision=request.rollout_revision)
        if isinstance(planned, ActionOutcome):
            return planned
        # The plan's JSON (what the journal holds) is the detail of every outcome below.
        plan = planned.to_json()
        conflicts: list[str] = []
        for _ in range(CONFLICT_REREADS):
            if conflicts:
                # A 409 (the resourceVersion test failed: the Deployment changed since the read; nothing was
                # written): read again and check the plan's precondition on what is there now.
                deployment = self._deployment(ref)
                if isinstance(deployment, KubeError):
                    return deployment.outcome({"deployment": where, "conflicts": conflicts})
            outcome = self._checked_patch(ref, where, deployment, plan, idempotency_key)
            if not isinstance(outcome, KubeError):
                return outcome if not conflicts else _with(outcome, conflicts=conflicts)
            conflicts.append(outcome.message)
            log.info("%s: conflict %d while rolling back (%s); reading it again", where, len(conflicts), outcome)
        error = f"{where} kept changing while tailguard rolled it back ({len(conflicts)} conflicts); nothing written"
        return ActionOutcome(OutcomeStatus.FAILED, {"deployment": where, **plan, "conflicts": conflicts}, error, True)

    def _checked_patch(
        self, ref: DeploymentRef, where: str, deployment: Mapping[str, Any], plan: Mapping[str, Any], key: str
    ) -> ActionOutcome | KubeError:
        """The plan's precondition on `deployment` as read (it runs the plan's from-template), then the patch that
        tests its resourceVersion; a KubeError only for a conflict (nothing written: read again)."""
        if key in recorded_keys((deployment.get("metadata") or {}).get("annotations")):
            return ActionOutcome(OutcomeStatus.SUCCEEDED, {"deployment": where, "replayed": True})
        if (deployment.get("spec") or {}).get("paused"):
            return ActionOutcome(
                OutcomeStatus.FAILED, {"deployment": where}, f"{where}: you cannot rollback a paused deployment", False
            )
        revisions = self._revisions(ref, deployment)
        if isinstance(revisions, KubeError):
            return revisions.outcome({"deployment": where})
        running = _running(revisions, deployment)
        detail: dict[str, Any] = {"deployment": where, **plan, "running_revision": running.number if running else None}
        if running is not None and running.hash == plan["to_hash"]:
            # The world already shows the target (a resume after the patch landed, or someone did it): done.
            return ActionOutcome(OutcomeStatus.SUCCEEDED, {**detail, "already_done": True, "replayed": False})
        if running is None or running.hash != plan["from_hash"]:
            reason = f"{where} runs neither revision {plan['from_revision']} nor {plan['to_revision']} any more"
            reason += ": changed by someone else since the plan; not rolled back"
            return ActionOutcome(OutcomeStatus.WORLD_CHANGED, {**detail, "reason": reason}, reason)
        target = next((r for r in revisions if r.hash == plan["to_hash"]), None)
        if target is None:
            error = f"{where}: the ReplicaSet of revision {plan['to_revision']} ({plan['to_hash']}) is gone"
            return ActionOutcome(OutcomeStatus.FAILED, detail, error, False)
        self.record.record_bad(where, str(plan["bad_hash"]), plan["bad_revision"], key, self.clock.now())
        return self._patch(ref, where, deployment, target, plan, key)

    def _plan(
        self,
        ref: DeploymentRef,
        where: str,
        deployment: Mapping[str, Any],
        revisions: Sequence[Revision],
        rollout_revision: str | None,
    ) -> dict[str, Any] | ActionOutcome:
        if not revisions:
            return ActionOutcome(OutcomeStatus.FAILED, {"deployment": where}, f"{where}: no rollout history found")
        current = str(((deployment.get("metadata") or {}).get("annotations") or {}).get(REVISION, revisions[-1].number))
        bad_number = str(rollout_revision) if rollout_revision is not None else current
        bad = next((r for r in revisions if str(r.number) == bad_number), None)
        if bad is None:
            error = f"{where}: unable to find revision {bad_number} in its history"
            return ActionOutcome(OutcomeStatus.FAILED, {"deployment": where}, error, False)
        known_bad = self.record.bad(where) | {bad.hash}
        candidates = [r for r in reversed(revisions) if r.number < bad.number and r.hash not in known_bad]
        running = _running(revisions, deployment)
        if running is None:
            error = f"{where}: no ReplicaSet holds the running pod template (a rollout in progress?)"
            return ActionOutcome(OutcomeStatus.FAILED, {"deployment": where}, error, True)
        plan: dict[str, Any] = {
            "deployment": where,
            "from_revision": running.number,
            "from_hash": running.hash,
            "bad_revision": bad.number,
            "bad_hash": bad.hash,
        }
        if running.since is not None:
            plan["from_deployed_at"] = running.since  # a rollout after a decision: not the world it saw
        release = str(((deployment.get("metadata") or {}).get("annotations") or {}).get(HELM_RELEASE) or "")
        if release and self.helm:
            helm = self._helm_templates(ref, release)
            if isinstance(helm, KubeError):
                return helm.outcome({"deployment": where})
            deployed = next((version for version, status, _t in helm if status == "deployed"), None)
            chosen: tuple[int, Revision] | None = None
            for version, _status, template in helm:
                fingerprint = containers_fingerprint(template)
                match = next((r for r in candidates if containers_fingerprint(r.template) == fingerprint), None)
                if match is not None:
                    chosen = (version, match)
                    break
            if chosen is None:
                error = (
                    f"{where}: no earlier Helm revision of release {release!r} has its Deployment in a ReplicaSet "
                    f"before revision {bad.number}; nothing written (run `helm rollback {release}`)"
                )
                return ActionOutcome(OutcomeStatus.FAILED, {"deployment": where, "helm_release": release}, error)
            version, target = chosen
            plan["helm"] = {
                "release": release,
                "deployed_revision": deployed,
                "restored_revision": version,
                "history_differs": deployed != version,
                "note": (
                    f"rolled back through the Deployment; Helm still records revision {deployed} as deployed: "
                    f"run `helm rollback {release} {version}` (or fix the values) to reconcile its history"
                    if deployed != version
                    else "the Deployment now matches Helm's deployed revision"
                ),
            }
        else:
            if not candidates:
                error = f"{where}: no revision before {bad.number} that is not recorded as bad"
                return ActionOutcome(OutcomeStatus.SKIPPED, {"deployment": where, **plan}, error)
            target = candidates[0]
            if release:
                plan["helm"] = {
                    "release": release,
                    "history_differs": True,
                    "note": f"Helm owns this Deployment; its release history now differs: reconcile it with "
                    f"`helm rollback {release}` or the chart's values",
                }
        plan.update({"to_revision": target.number, "to_hash": target.hash})
        return plan

    def _patch(
        self,
        ref: DeploymentRef,
        where: str,
        deployment: Mapping[str, Any],
        target: Revision,
        plan: Mapping[str, Any],
        key: str,
    ) -> ActionOutcome | KubeError:
        meta = deployment.get("metadata") or {}
        current = dict(meta.get("annotations") or {})
        # kubectl: the Deployment's own skipped annotations, then the target ReplicaSet's others.
        annotations = {k: v for k, v in current.items() if k in ANNOTATIONS_TO_SKIP}
        annotations.update({k: v for k, v in target.annotations.items() if k not in ANNOTATIONS_TO_SKIP})
        now = datetime.datetime.fromtimestamp(self.clock.now(), datetime.UTC)
        annotations[CHANGE_CAUSE] = (
            f"tailguard rollback of revision {plan['bad_revision']} to revision {target.number} ({key})"
        )
        annotations[ROLLED_BACK_AT] = now.strftime("%Y-%m-%dT%H:%M:%SZ")
        annotations = with_key({**annotations, **_keys_of(current)}, key)
        patch: list[dict[str, Any]] = [
            {"op": "test", "path": "/metadata/resourceVersion", "value": meta.get("resourceVersion")},
            {"op": "replace", "path": "/spec/template", "value": template_without_hash(target.template)},
            {
                "op": "replace" if "annotations" in meta else "add",
                "path": "/metadata/annotations",
                "value": annotations,
            },
        ]
        written = kube_call(
            lambda: self.apps.patch_namespaced_deployment(
                ref.name,
                ref.namespace,
                patch,
                _content_type="application/json-patch+json",
                _request_timeout=self.timeout,
            ),
            what=f"patching {where}",
            clock=self.clock,
            retry=RetryPolicy(attempts=1),  # one attempt: the dispatcher retries, and its retry reads first
        )
        detail = {"deployment": where, **plan, "change_cause": annotations[CHANGE_CAUSE], "replayed": False}
        if isinstance(written, KubeError):
            if written.status == 422:
                # A failed `test` is a 422 (Invalid) when the resourceVersion moved; any other 422 is a bad patch.
                again = self._deployment(ref)
                version = (again.get("metadata") or {}).get("resourceVersion") if isinstance(again, dict) else None
                if version is None or version == meta.get("resourceVersion"):
                    return written.outcome(detail)
            if written.status in (409, 422):
                # The resourceVersion test failed: the Deployment changed since it was read; nothing was written.
                # The caller reads it again and checks the plan's precondition on what it finds.
                changed = f"{where} changed while tailguard rolled it back ({written.message})"
                return KubeError(changed, written.status, True)
            return written.outcome(detail)
        if self.events is not None:
            self.events.record(
                ObjectRef("apps/v1", "Deployment", ref.namespace, ref.name),
                "TailguardRollback",
                f"tailguard: {annotations[CHANGE_CAUSE]}",
                key=key,
            )
        log.info("%s rolled back from revision %s to %s", where, plan["bad_revision"], target.number)
        return ActionOutcome(OutcomeStatus.SUCCEEDED, detail)


def _latest(*stamps: Any) -> float | None:
    """The latest of RFC 3339 times (None when none is readable)."""
    parsed = []
    for stamp in stamps:
        if isinstance(stamp, str) and stamp:
            try:
                parsed.append(datetime.datetime.fromisoformat(stamp).timestamp())
            except ValueError:
                continue
    return max(parsed) if parsed else None


def _with(outcome: ActionOutcome, **extra: Any) -> ActionOutcome:
    return ActionOutcome(outcome.status, {**outcome.detail, **extra}, outcome.error, outcome.transient)


def _running(revisions: Sequence[Revision], deployment: Mapping[str, Any]) -> Revision | None:
    """The ReplicaSet whose template the Deployment runs (kubectl's equalIgnoreHash)."""
    template = template_without_hash((deployment.get("spec") or {}).get("template") or {})
    return next((r for r in reversed(revisions) if template_without_hash(r.template) == template), None)


def _keys_of(annotations: Mapping[str, str]) -> dict[str, str]:
    """The idempotency-key annotation of the Deployment (kept across the annotation replace)."""
    return {ANNOTATION_KEYS: annotations[ANNOTATION_KEYS]} if ANNOTATION_KEYS in annotations else {}
