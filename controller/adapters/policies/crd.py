"""TailguardPolicy custom resources as a source of policies, and their live status (the leader writes it).

Why the kubernetes client's `watch.Watch` and not kopf: the controller already has its own loop (scheduling,
leadership, the journal); it needs only the policy documents and a place to publish what it knows. kopf would
bring a second event loop, its own leadership (peering) and handler retries beside ours.

Policies: list, then watch from the list's resourceVersion; a 410 Gone (the history was compacted) re-lists;
any other failure retries after a bounded backoff (0.5 s doubling to `backoff_max`). Each valid custom resource
is written as one policy file into `directory`, which the controller reads beside its own policy paths (a changed
file calls `on_change`, the controller's reload, at once; the periodic reload is the fallback): so a CR's
policy runs exactly as the same document in a file would,
and a deleted CR removes its file. A CR whose spec the controller refuses (what the schema cannot say: the fields
of each action type, references between signals and conditions, an action no actuator is configured for) keeps
its last good file, and the refusal goes into its status (`invalid`: "field: reason", `Degraded`).

Status (`status` subresource, only while this replica leads): every `status_interval` seconds, built from the
journal (the committed engine state and the recent decisions), written only when it changed since the last
write, and for each policy only once this replica has evaluated it as leader (a new leader never replaces the
previous leader's status with its own empty or stale journal); a 409 Conflict re-reads the object and retries.
Kubernetes Events on the CR: every fire, resolve and
action outcome (once each, from the decisions journaled after the source started).
"""

from __future__ import annotations

import hashlib
import logging
import os
import threading
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, cast

import yaml
from kubernetes import client as k8s
from kubernetes import watch as k8s_watch
from kubernetes.client.exceptions import ApiException

from tailguard.controller.adapters.policies.crd_schema import GROUP, KIND, PLURAL, VERSION
from tailguard.controller.core.actions import MUTATING_ACTIONS
from tailguard.controller.core.engine import PolicyState
from tailguard.controller.core.limits import BUDGET_WINDOW_SECONDS
from tailguard.controller.core.model import target_labels
from tailguard.controller.core.policy_files import LoadedPolicy, PolicyError, parse_policy_text
from tailguard.controller.core.ports import Clock, JournalPort

logger = logging.getLogger("tailguard.policies.crd")

WATCH_TIMEOUT_SECONDS = 300
WATCH_READ_MARGIN_SECONDS = 30
STATUS_CONFLICT_RETRIES = 3
# ActionType is a StrEnum: journaled action types compare equal to its members
_MUTATING_TYPES = frozenset(str(t) for t in MUTATING_ACTIONS)


@dataclass
class _Entry:
    """What the source knows of one custom resource."""

    name: str  # metadata.name
    generation: int
    policy: str | None = None  # the running policy's name (None: never valid)
    good_generation: int | None = None
    invalid: tuple[str, ...] = ()
    suspend: bool = False
    written_status: dict[str, Any] | None = None
    evented: set[tuple[str, ...]] = field(default_factory=set)


def _iso(at: float | None) -> str | None:
    return None if at is None else datetime.fromtimestamp(at, UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def policy_document(obj: dict[str, Any]) -> dict[str, Any]:
    """The policy document of a custom resource: its spec, apiVersion/kind filled in, name = metadata.name
    unless spec.name."""
    spec = dict(obj.get("spec") or {})
    return {
        "apiVersion": spec.pop("apiVersion", "tailguard.io/v1alpha1"),
        "kind": spec.pop("kind", "Policy"),
        "name": spec.pop("name", obj["metadata"]["name"]),
        **spec,
    }


class CrdPolicySource:
    """Watches TailguardPolicy objects of one namespace into policy files; writes their status as leader."""

    def __init__(
        self,
        api_client: k8s.ApiClient,
        namespace: str,
        directory: Path,
        clock: Clock,
        *,
        journal: JournalPort | None = None,
        is_leader: Callable[[], bool] = lambda: True,
        check: Callable[[Sequence[LoadedPolicy]], Sequence[PolicyError]] | None = None,
        events: bool = True,
        status_interval: float = 10.0,
        backoff_max: float = 30.0,
        watch_timeout: int = WATCH_TIMEOUT_SECONDS,
    ) -> None:
        self._api = k8s.CustomObjectsApi(api_client)
        self._core = k8s.CoreV1Api(api_client)
        self._namespace = namespace
        self.directory = directory
        self._clock = clock
        self._journal = journal
        self._is_leader = is_leader
        self._check = check
        self._events = events
        self._status_interval = status_interval
        self._backoff_max = backoff_max
        self._watch_timeout = watch_timeout
        self._lock = threading.Lock()
        self._entries: dict[str, _Entry] = {}
        self._stop = threading.Event()
        self._threads: list[threading.Thread] = []
        self._watch: k8s_watch.Watch | None = None
        self._started_at = clock.now()
        self.relists = 0
        self.status_writes = 0
        # When this replica's current leadership began (the status loop sets it): until it has evaluated a
        # policy as leader, that policy's status is left as the previous leader wrote it, never replaced by this
        # replica's own journal (empty on a standby that never led, stale on one that led long ago).
        self._leading_since: float | None = None
        # Called (from the watch thread) after a policy file changed: the controller reloads at once, so a
        # `spec.suspend: true` stops the next action without waiting for the periodic reload (build.py sets it).
        self.on_change: Callable[[], object] | None = None
        directory.mkdir(parents=True, exist_ok=True)

    # ----- lifecycle ------------------------------------------------------------------------------

    def start(self) -> None:
        """The first list happens here (its policies are on disk before the controller loads), then the watch
        and the status writer run on their own threads."""
        resource_version = self._relist_quietly()
        self._threads = [
            threading.Thread(
                target=self._watch_loop, args=(resource_version,), name="tailguard-crd-watch", daemon=True
            ),
            threading.Thread(target=self._status_loop, name="tailguard-crd-status", daemon=True),
        ]
        for thread in self._threads:
            thread.start()

    def stop(self) -> None:
        self._stop.set()
        watch = self._watch
        if watch is not None:
            watch.stop()  # type: ignore[no-untyped-call]
        for thread in self._threads:
            thread.join(timeout=5)

    # ----- policies -------------------------------------------------------------------------------

    def _file(self, name: str) -> Path:
        return self.directory / f"{self._namespace}.{name}.yaml"

    def relist(self) -> str:
        """List every TailguardPolicy, apply each, drop the files of those gone; the list's resourceVersion."""
        listed = cast(dict[str, Any], self._api.list_namespaced_custom_object(GROUP, VERSION, self._namespace, PLURAL))
        names = set()
        for obj in listed.get("items", []):
            names.add(obj["metadata"]["name"])
            self.apply(obj)
        with self._lock:
            gone = [name for name in self._entries if name not in names]
        for name in gone:
            self.delete(name)
        self.relists += 1
        return str(listed.get("metadata", {}).get("resourceVersion", ""))

    def _relist_quietly(self) -> str:
        try:
            return self.relist()
        except Exception as failed:  # noqa: BLE001 - the watch loop retries with backoff
            logger.warning("listing TailguardPolicies in %s failed: %s", self._namespace, failed)
            return ""

    def apply(self, obj: dict[str, Any]) -> _Entry:
        """Validate one object's policy; write its file when valid, else keep the last good one and say why."""
        name = obj["metadata"]["name"]
        generation = int(obj["metadata"].get("generation", 1))
        spec = obj.get("spec") or {}
        file = f"{KIND}/{self._namespace}/{name}"
        text = yaml.safe_dump(policy_document(obj), sort_keys=False)
        loaded, errors = parse_policy_text(text, file)
        if not errors and self._check is not None:
            errors = list(self._check(loaded))
        with self._lock:
            entry = self._entries.setdefault(name, _Entry(name=name, generation=generation))
            entry.generation = generation
            entry.suspend = bool(spec.get("suspend", False))
            if errors:
                entry.invalid = tuple(f"spec.{e.field}: {e.message}" if e.field else e.message for e in errors)
                logger.error(
                    "TailguardPolicy %s/%s refused (the last good version runs): %s",
                    self._namespace,
                    name,
                    "; ".join(entry.invalid),
                )
                return entry
            entry.invalid = ()
            entry.policy = loaded[0].policy.name
            entry.good_generation = generation
        target = self._file(name)
        content = f"# from {file} generation {generation}\n{text}"
        try:
            if target.read_text(encoding="utf-8") == content:
                return entry  # a status write or a metadata change: the policy is the same, nothing to reload
        except OSError:
            pass
        temporary = target.with_suffix(".tmp")
        temporary.write_text(content, encoding="utf-8")
        os.replace(temporary, target)
        self._changed()
        return entry

    def _changed(self) -> None:
        if self.on_change is None:
            return
        try:
            self.on_change()
        except Exception:  # the periodic reload picks the change up anyway
            logger.exception("reloading after a TailguardPolicy change failed")

    def delete(self, name: str) -> None:
        with self._lock:
            self._entries.pop(name, None)
        self._file(name).unlink(missing_ok=True)
        self._changed()

    def _watch_loop(self, resource_version: str) -> None:
        failures = 0
        while not self._stop.is_set():
            try:
                if not resource_version:
                    resource_version = self.relist()
                self._watch = k8s_watch.Watch()  # type: ignore[no-untyped-call]
                for event in self._watch.stream(  # type: ignore[no-untyped-call]
                    self._api.list_namespaced_custom_object,
                    GROUP,
                    VERSION,
                    self._namespace,
                    PLURAL,
                    resource_version=resource_version,
                    timeout_seconds=self._watch_timeout,
                    # Each read of the stream: the server ends the watch after timeoutSeconds, so a read waiting
                    # longer than that (plus a margin) is a dead connection; the watch is then re-opened.
                    _request_timeout=(5, self._watch_timeout + WATCH_READ_MARGIN_SECONDS),
                ):
                    if self._stop.is_set():
                        return
                    kind, obj = event["type"], event["object"]
                    if kind == "ERROR":
                        if obj.get("code") == 410:
                            resource_version = ""  # re-list
                            break
                        raise ApiException(status=obj.get("code"), reason=obj.get("message"))
                    resource_version = obj["metadata"].get("resourceVersion", resource_version)
                    if kind == "DELETED":
                        self.delete(obj["metadata"]["name"])
                    elif kind in ("ADDED", "MODIFIED"):
                        self.apply(obj)
                failures = 0
            except ApiException as failed:
                if failed.status == 410:  # "too old resource version": the history is gone, list again
                    resource_version = ""
                    continue
                failures += 1
                self._backoff(failures, failed)
            except Exception as failed:  # noqa: BLE001 - a dropped connection, a malformed event: retry, boundedly
                failures += 1
                self._backoff(failures, failed)

    def _backoff(self, failures: int, failed: BaseException) -> None:
        delay = min(self._backoff_max, 0.5 * 2 ** (failures - 1))
        logger.warning("watching TailguardPolicies failed (%s); retrying in %.1fs", failed, delay)
        self._stop.wait(delay)

    # ----- status ---------------------------------------------------------------------------------

    def _status_loop(self) -> None:
        while not self._stop.wait(self._status_interval):
            try:
                if not self._is_leader():
                    self._leading_since = None
                    continue
                if self._leading_since is None:
                    self._leading_since = self._clock.now()  # a new leadership: see write_statuses
                self.write_statuses()
            except Exception:  # the status is best effort; the next interval tries again
                logger.exception("writing TailguardPolicy status failed")

    def write_statuses(self) -> int:
        """Write each policy's status where it changed (and its Events); the number of writes."""
        decisions = self._journal.recent_decisions(500) if self._journal is not None else []
        with self._lock:
            entries = list(self._entries.values())
        writes = 0
        for entry in entries:
            if not self._evaluated_as_leader(entry):
                continue
            mine = [d for d in decisions if entry.policy is not None and d.get("policy") == entry.policy]
            status = self.policy_status(entry, mine)
            if status != entry.written_status and self._write_status(entry.name, status):
                entry.written_status = status
                writes += 1
            if self._events:
                self._record_events(entry, mine)
        self.status_writes += writes
        return writes

    def _evaluated_as_leader(self, entry: _Entry) -> bool:
        """Whether this replica evaluated `entry`'s policy since its leadership began (always true outside the
        status loop, and for a CR with no valid policy: its refusal is this replica's own finding)."""
        since = self._leading_since
        if since is None or entry.policy is None or self._journal is None:
            return True
        state = self._journal.load_state(entry.policy)
        return state is not None and state.last_evaluated_at is not None and state.last_evaluated_at >= since

    def policy_status(self, entry: _Entry, decisions: list[dict[str, Any]]) -> dict[str, Any]:
        now = self._clock.now()
        state = (
            self._journal.load_state(entry.policy) if self._journal is not None and entry.policy is not None else None
        ) or PolicyState()
        latest: dict[tuple[str, tuple[tuple[str, str], ...]], dict[str, Any]] = {}
        for decision in decisions:  # newest first
            key = (str(decision.get("condition")), tuple(sorted((decision.get("target") or {}).items())))
            latest.setdefault(key, decision)
        targets: list[dict[str, Any]] = []
        cooldown = self._cooldown(entry)
        for (condition, target), cs in sorted(state.conditions.items()):
            phase = "errored" if cs.errored else "stale" if cs.stale else cs.phase.value
            times = state.actions_at.get(target, ())
            row: dict[str, Any] = {
                "condition": condition,
                "target": target_labels(target),
                "phase": phase,
                "lastValue": cs.last_value,
                "streak": cs.breach_count,
                "cooldownRemainingSeconds": max(0.0, round(max(times) + cooldown - now, 3)) if times else 0.0,
                "budgetUsed": sum(1 for t in times if now - t < BUDGET_WINDOW_SECONDS),
            }
            if cs.last_data_at is not None:
                row["lastValueTime"] = _iso(cs.last_data_at)
            last = latest.get((condition, tuple(sorted(target_labels(target).items()))))
            if last is not None:
                row["lastDecision"] = _decision_summary(last)
            targets.append(row)
        firing = sum(1 for row in targets if row["phase"] == "firing")
        errored = [row for row in targets if row["phase"] == "errored"]
        conditions = [
            _condition(
                "Ready",
                entry.policy is not None and not entry.invalid,
                "Invalid" if entry.invalid else "Loaded" if entry.policy else "NeverValid",
                "; ".join(entry.invalid) or "the policy runs",
            ),
            _condition(
                "Suspended",
                entry.suspend,
                "Suspended" if entry.suspend else "Active",
                "spec.suspend is true" if entry.suspend else "actions run",
            ),
            _condition(
                "Degraded",
                bool(entry.invalid or errored),
                "InvalidSpec" if entry.invalid else "TargetErrored" if errored else "AsExpected",
                "; ".join(entry.invalid)
                if entry.invalid
                else f"{len(errored)} target(s) errored (the metrics source fails)"
                if errored
                else "",
            ),
        ]
        status: dict[str, Any] = {
            "observedGeneration": entry.good_generation if entry.good_generation is not None else 0,
            "conditions": conditions,
            "targets": targets,
            "targetsFiring": firing,
        }
        if entry.policy is not None:
            status["policy"] = entry.policy
        if entry.invalid:
            status["invalid"] = list(entry.invalid)
        last_action = _headline_action(decisions)
        if last_action is not None:
            status["lastAction"] = f"{last_action['type']} {last_action['status']}"
        return status

    def _cooldown(self, entry: _Entry) -> float:
        try:
            text = self._file(entry.name).read_text(encoding="utf-8")
        except OSError:
            return 0.0
        loaded, _ = parse_policy_text(text, entry.name)
        return float(loaded[0].policy.limits.cooldown) if loaded else 0.0

    def _write_status(self, name: str, status: dict[str, Any]) -> bool:
        """Replace the status subresource; a 409 re-reads the object and retries (bounded)."""
        for _ in range(STATUS_CONFLICT_RETRIES):
            try:
                current = cast(
                    dict[str, Any],
                    self._api.get_namespaced_custom_object(GROUP, VERSION, self._namespace, PLURAL, name),
                )
            except ApiException as failed:
                if failed.status == 404:
                    return False
                raise
            if current.get("status") == status:
                return True  # already there (written by us before a restart, or by a previous leader)
            current["status"] = status
            try:
                self._api.replace_namespaced_custom_object_status(
                    GROUP, VERSION, self._namespace, PLURAL, name, current
                )
                return True
            except ApiException as failed:
                if failed.status != 409:
                    raise
                logger.info("status of TailguardPolicy %s: conflict, re-reading", name)
        return False

    def _record_events(self, entry: _Entry, decisions: list[dict[str, Any]]) -> None:
        for decision in reversed(decisions):  # oldest first
            if float(decision.get("recorded_at") or 0.0) < self._started_at:
                continue
            kind = str(decision.get("kind"))
            key = (str(decision.get("id")), kind)
            if kind in ("fire", "resolve") and key not in entry.evented:
                entry.evented.add(key)
                labels = ",".join(f"{k}={v}" for k, v in sorted((decision.get("target") or {}).items()))
                reason = "Fired" if kind == "fire" else "Resolved"
                self._event(
                    entry.name,
                    reason,
                    "Normal" if kind == "resolve" else "Warning",
                    f"{decision.get('condition')} {labels}: {kind} (decision {decision.get('id')})",
                )
            for action in decision.get("action_records", []):
                if action["status"] in ("planned", "started"):
                    continue
                action_key = (str(action["idempotency_key"]), str(action["status"]))
                if action_key in entry.evented:
                    continue
                entry.evented.add(action_key)
                failed = action["status"] == "failed"
                self._event(
                    entry.name,
                    "Action" + ("Failed" if failed else "Done"),
                    "Warning" if failed else "Normal",
                    f"{action['type']} {action['resource']}: {action['status']}"
                    + (f" ({action.get('error')})" if action.get("error") else ""),
                )

    def _event(self, name: str, reason: str, kind: str, message: str) -> None:
        now = datetime.fromtimestamp(self._clock.now(), UTC)
        body = k8s.CoreV1Event(
            # A name of its own (the policy and a digest of what happened): a second leader repeating it gets 409.
            metadata=k8s.V1ObjectMeta(
                name=f"{name}.{hashlib.sha256(f'{reason}:{message}'.encode()).hexdigest()[:16]}",
                namespace=self._namespace,
            ),
            involved_object=k8s.V1ObjectReference(
                api_version=f"{GROUP}/{VERSION}", kind=KIND, name=name, namespace=self._namespace
            ),
            reason=reason,
            message=message[:1024],
            type=kind,
            first_timestamp=now,
            last_timestamp=now,
            count=1,
            source=k8s.V1EventSource(component="tailguard"),
            reporting_component="tailguard",
        )
        try:
            self._core.create_namespaced_event(self._namespace, body)
        except ApiException as failed:  # an Event is best effort (409: already recorded)
            if failed.status == 409:
                return
            logger.warning("Event on TailguardPolicy %s not recorded: %s", name, failed.reason)


def _condition(kind: str, true: bool, reason: str, message: str) -> dict[str, Any]:
    return {"type": kind, "status": "True" if true else "False", "reason": reason, "message": message}


def _decision_summary(decision: dict[str, Any]) -> dict[str, Any]:
    summary: dict[str, Any] = {"id": str(decision.get("id")), "kind": str(decision.get("kind"))}
    when = _iso(decision.get("at"))
    if when is not None:
        summary["time"] = when
    summary["actions"] = [
        {k: v for k, v in (("type", a["type"]), ("status", a["status"]), ("error", a.get("error"))) if v}
        for a in decision.get("action_records", [])
    ]
    return summary


def _headline_action(decisions: list[dict[str, Any]]) -> dict[str, Any] | None:
    """The newest decision's action an operator asks about: its mutating one (the rollback, not the annotation
    written before it), else its last."""
    for decision in decisions:
        records = decision.get("action_records") or []
        if records:
            mutating = [r for r in records if r.get("type") in _MUTATING_TYPES]
            return dict(mutating[0] if mutating else records[-1])
    return None
