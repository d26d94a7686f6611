"""Rollback through Argo CD: the `RollbackPort` for an Argo CD application.

rollback(service, rollout_revision) = GET the application, pick the last good history entry (the one before the
rollout the breach is attributed to, which the dispatcher passes from the engine's rollback action; never a
revision recorded as bad), POST /api/v1/applications/{name}/rollback with its history id, then poll until the
operation finished and the app is Healthy.

Argo CD refuses a rollback while automated sync is on (gRPC FailedPrecondition), and auto-sync would undo it
anyway (argo-cd #9570). `autoSync: disableAutoSync` removes `spec.syncPolicy.automated` first (merge PATCH, the
endpoint Argo CD's swagger defines), records it in the outcome and raises a notice so a human re-enables it after
fixing Git; `autoSync: notifyOnly` does not roll back and says why.

Idempotency: Argo CD has no idempotency key, so the guard is the application itself. Before POSTing, a rollback
whose target is already the synced revision, or already running, is not repeated; a POST that failed
transiently (timeout, 5xx) is followed by a fresh GET to see whether it took effect, else it is reported
`transient`. The adapter makes one attempt (one POST; a second only after Argo CD refused the first for auto-sync
and auto-sync was disabled); the dispatcher alone retries, and each retry starts with the GET above. Reads (the
GETs, the polls) retry through the kit's read call. Done keys are kept in the bad-revision record, so a resumed
action does not act twice either.

Abort: an operator's abort (`tailguard abort DECISION`, the dispatcher's AbortSignal) before the POST sends
nothing; after it, the wait for sync and health stops at its next poll (the poll interval is cut short). The
rollback request already sent stays with Argo CD (it is not undone); the ABORTED outcome says so and what Argo CD
was last seen doing (operation phase, health).

Plan first: `plan_rollback` reads the application once and names the rollback (from-revision, to-revision and
its history id); the dispatcher journals it before `rollback(plan=...)` acts. A resume (after a crash, a
restart, or a failover in which the old leader later takes the Lease back) acts on the journaled plan: the
application already running `to_revision` is done; one running neither `from_revision` nor `to_revision` was
changed by someone else and is left alone. The current revision is never taken for the bad one on a resume (it
is the good one by then: the bug of 894c662's probe, which rolled back to the bad revision).

The Argo CD API client and the `argocd:` settings live on the adapters' ground floor (controller/adapters/argocd/),
shared with change tracking; this module holds the rollback port's implementation only.
"""

from __future__ import annotations

import datetime
import json
import logging
import os
import threading
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

from tailguard.controller.adapters.argocd.client import (
    GRPC_FAILED_PRECONDITION,
    GRPC_INVALID_ARGUMENT,
    ArgoCDClient,
    ArgoCDError,
    HistoryEntry,
    describe_failure,
    error_message,
    grpc_code,
    history_of,
    read_token,
)
from tailguard.controller.adapters.argocd.settings import ArgoCDApp, ArgoCDSettings, AutoSyncMode
from tailguard.controller.core.controls import AbortRequest
from tailguard.controller.core.ports import (
    AbortSignal,
    ActionOutcome,
    Clock,
    OutcomeStatus,
    RollbackPlan,
    RollbackRequest,
)
from tailguard.controller.kit.http import HttpAnswer, RetryPolicy

log = logging.getLogger(__name__)

FINISHED_PHASES = frozenset({"Succeeded", "Failed", "Error"})


class BadRevisionRecord:
    """tailguard's own record of revisions it rolled back from, per application, and of rollbacks done.

    A JSON file (written atomically) so that it survives restarts; in memory when no path is given.
    """

    def __init__(self, path: Path | None = None) -> None:
        self.path = path
        self._lock = threading.Lock()
        self._data: dict[str, Any] = {"bad": {}, "done": {}}
        if path is not None and path.exists():
            loaded = json.loads(path.read_text(encoding="utf-8"))
            if isinstance(loaded, dict):
                self._data = {"bad": dict(loaded.get("bad", {})), "done": dict(loaded.get("done", {}))}

    def bad(self, app: str) -> set[str]:
        with self._lock:
            return set(self._data["bad"].get(app, {}))

    def done(self, idempotency_key: str) -> dict[str, Any] | None:
        with self._lock:
            found = self._data["done"].get(idempotency_key)
            return dict(found) if isinstance(found, dict) else None

    def record(self, app: str, bad_revision: str, idempotency_key: str, outcome: Mapping[str, Any], at: float) -> None:
        with self._lock:
            self._data["bad"].setdefault(app, {})[bad_revision] = {"at": at, "idempotency_key": idempotency_key}
            self._data["done"][idempotency_key] = dict(outcome)
            if self.path is not None:
                self.path.parent.mkdir(parents=True, exist_ok=True)
                scratch = self.path.with_suffix(self.path.suffix + ".tmp")
                scratch.write_text(json.dumps(self._data, sort_keys=True, default=str), encoding="utf-8")
                os.replace(scratch, self.path)


class ArgoCDRollback:
    """RollbackPort for services deployed by Argo CD (replicas belong to the HPA: controller/adapters/scale)."""

    def __init__(
        self,
        client: ArgoCDClient,
        apps: Mapping[str, ArgoCDApp],
        *,
        clock: Clock,
        auto_sync: AutoSyncMode = "notifyOnly",
        wait_timeout: float = 300.0,
        poll_interval: float = 5.0,
        record: BadRevisionRecord | None = None,
        notice: Callable[[str, Mapping[str, Any]], None] | None = None,
    ) -> None:
        self.client = client
        self.apps = dict(apps)
        self.clock = clock
        self.auto_sync = auto_sync
        self.wait_timeout = wait_timeout
        self.poll_interval = poll_interval
        self.record = record or BadRevisionRecord()
        self.notice = notice

    @staticmethod
    def from_settings(
        settings: ArgoCDSettings,
        *,
        clock: Clock,
        record_path: Path | None = None,
        notice: Callable[[str, Mapping[str, Any]], None] | None = None,
        base_dir: Path | None = None,
    ) -> ArgoCDRollback:
        token_file = settings.tokenFile
        if token_file is not None and base_dir is not None and not Path(token_file).is_absolute():
            token_file = str(base_dir / token_file)
        client = ArgoCDClient(
            settings.url,
            clock=clock,
            token=lambda: read_token(token_file, settings.tokenEnv),
            timeout=settings.timeout,
            retries=settings.retries,
        )
        return ArgoCDRollback(
            client,
            settings.apps,
            clock=clock,
            auto_sync=settings.autoSync,
            wait_timeout=settings.waitTimeout,
            poll_interval=settings.pollInterval,
            record=BadRevisionRecord(record_path),
            notice=notice,
        )

    # -- RollbackPort -------------------------------------------------------------------------------------

    def plan_rollback(self, service: str, *, rollout_revision: str | None = None) -> RollbackPlan | ActionOutcome:
        """The rollback to make, journaled by the dispatcher before acting: the application, `from_revision` (the
        synced one now), `bad_revision` (the attributed rollout, else the current one), `to_revision` and its
        `history_id` (the newest entry before the last deployment of the bad revision, never one recorded bad)."""
        app_settings = self.apps.get(service)
        if app_settings is None:
            known = ", ".join(sorted(self.apps)) or "none"
            return ActionOutcome(
                OutcomeStatus.FAILED, {}, f"no Argo CD application for service {service!r} (known: {known})", False
            )
        name = app_settings.name
        detail: dict[str, Any] = {"application": name, "service": service}
        try:
            app = self.client.get_app(name, app_settings.appNamespace)
        except ArgoCDError as failed:
            return ActionOutcome(OutcomeStatus.FAILED, detail, f"rollback of {name!r}: {failed}", failed.transient)
        history = history_of(app)
        current = _synced_revision(app, history)
        bad = rollout_revision or current
        if bad is None:
            return ActionOutcome(OutcomeStatus.SKIPPED, detail, f"rollback of {name!r}: the application has no history")
        target = pick_target(history, bad, self.record.bad(name))
        detail.update({"bad_revision": bad, "current_revision": current})
        if target is None:
            return ActionOutcome(
                OutcomeStatus.SKIPPED,
                detail,
                f"rollback of {name!r}: no earlier good revision before {bad} in its history "
                f"(bad: {', '.join(sorted(self.record.bad(name) | {bad}))})",
            )
        plan = RollbackPlan(
            service=service,
            application=name,
            from_revision=current,
            bad_revision=bad,
            to_revision=target.revision,
            history_id=target.id,
        )
        since = next((_epoch(e.deployed_at) for e in reversed(history) if e.revision == current), None)
        if since is not None:
            # when what runs now was deployed (a rollout since a decision: not the world it saw)
            plan = plan.model_copy(update={"from_deployed_at": since})
        return plan

    def rollback(self, request: RollbackRequest, abort: AbortSignal | None = None) -> ActionOutcome:
        """Make the planned rollback (None: plan it now): done when the app already runs `to_revision`,
        world-changed when it runs neither the plan's `from_revision` nor `to_revision` (someone else changed
        it). On `abort`: nothing sent when it came before the POST, else the wait stops at its next poll."""
        service, idempotency_key, plan = request.service, request.idempotency_key, request.plan
        app_settings = self.apps.get(service)
        if app_settings is None:
            known = ", ".join(sorted(self.apps)) or "none"
            return ActionOutcome(
                OutcomeStatus.FAILED, {}, f"no Argo CD application for service {service!r} (known: {known})", False
            )
        name = app_settings.name
        detail: dict[str, Any] = {"application": name, "service": service}
        done = self.record.done(idempotency_key)
        if done is not None:
            return ActionOutcome(OutcomeStatus.SUCCEEDED, {**done, "replayed": True})
        if plan is None:
            planned = self.plan_rollback(service, rollout_revision=request.rollout_revision)
            if isinstance(planned, ActionOutcome):
                return planned
            plan = planned
        try:
            app = self.client.get_app(name, app_settings.appNamespace)
        except ArgoCDError as failed:
            return ActionOutcome(OutcomeStatus.FAILED, detail, f"rollback of {name!r}: {failed}", failed.transient)
        history = history_of(app)
        current = _synced_revision(app, history)
        source, bad = plan.from_revision, str(plan.bad_revision or plan.from_revision)
        if plan.history_id is None:
            error = f"rollback of {name!r}: the plan has no history id"
            return ActionOutcome(OutcomeStatus.FAILED, detail, error, False)
        target = HistoryEntry(plan.history_id, str(plan.to_revision), None, {})
        detail.update(
            {
                "bad_revision": bad,
                "current_revision": current,
                "planned_from_revision": source,
                "to_revision": target.revision,
                "history_id": target.id,
            }
        )
        running = _running_revision(app)
        if running is None and current == target.revision:
            # Already rolled back (by us before a crash or a failover, or by a human): acting again would be a
            # second rollback. The plan, not the current revision, says what was bad.
            detail["already_done"] = True
            return self._finish(name, bad, idempotency_key, detail, app)
        if running is not None and running != target.revision:
            return ActionOutcome(
                OutcomeStatus.FAILED,
                detail,
                f"rollback of {name!r}: another operation (to {running}) is in progress; not interfering",
                True,
            )
        if running is None and current != source:
            detail["reason"] = (
                f"changed by someone else since the rollback was planned: the application runs {current}, "
                f"the plan was {source} -> {target.revision}; not rolled back"
            )
            log.warning("Argo CD application %s: %s", name, detail["reason"])
            return ActionOutcome(OutcomeStatus.WORLD_CHANGED, detail, detail["reason"])
        if running is None:
            stopped = abort.requested() if abort is not None else None
            if stopped is not None:
                detail.update({"aborted": stopped.to_json(), "rollback_request": "not sent"})
                error = f"rollback of {name!r} to {target.revision} {stopped.phrase()} before it was sent; nothing sent"
                return ActionOutcome(OutcomeStatus.ABORTED, detail, error)
            started = self._start(app_settings, app, target, idempotency_key, detail)
            if started is not None:
                return started
        return self._wait(app_settings, bad, target, idempotency_key, detail, abort)

    # -- steps ----------------------------------------------------------------------------------------------

    def _mode(self, app: ArgoCDApp) -> AutoSyncMode:
        return app.autoSync or self.auto_sync

    def _start(
        self,
        settings: ArgoCDApp,
        app: Mapping[str, Any],
        target: HistoryEntry,
        idempotency_key: str,
        detail: dict[str, Any],
    ) -> ActionOutcome | None:
        """Disable auto-sync if needed and allowed, POST the rollback; an outcome only when it did not start."""
        name = settings.name
        if _automated(app):
            if self._mode(settings) == "notifyOnly":
                return self._refused_auto_sync(name, detail)
            disabled = self._disable_auto_sync(settings, app, idempotency_key, detail)
            if disabled is not None:
                return disabled
        body: dict[str, Any] = {"name": name, "id": target.id, "dryRun": False, "prune": False}
        if settings.appNamespace:
            body["appNamespace"] = settings.appNamespace
        if settings.project:
            body["project"] = settings.project
        url = self.client.url(name, "/rollback")
        # One attempt, one HTTP try (the dispatcher alone retries an action): a rollback is never re-POSTed here.
        answer = self._post(url, body, idempotency_key, detail)
        if _auto_sync_refused(answer):
            # Auto-sync was switched on between our read and the POST; Argo CD refused, so nothing was rolled back.
            if self._mode(settings) == "notifyOnly":
                return self._refused_auto_sync(name, detail)
            disabled = self._disable_auto_sync(settings, app, idempotency_key, detail)
            if disabled is not None:
                return disabled
            answer = self._post(url, body, idempotency_key, detail)
            if _auto_sync_refused(answer):
                return ActionOutcome(
                    OutcomeStatus.FAILED, detail, describe_failure(answer, f"rollback of {name!r}"), True
                )
        if answer.ok:
            log.info("Argo CD rollback of %s to %s (history id %d) started", name, target.revision, target.id)
            return None
        if not answer.transient:
            what = f"rollback of {name!r} to {target.revision} (history id {target.id})"
            if grpc_code(answer) == GRPC_INVALID_ARGUMENT:
                return ActionOutcome(OutcomeStatus.FAILED, detail, f"{what} refused: {error_message(answer)}", False)
            return ActionOutcome(OutcomeStatus.FAILED, detail, describe_failure(answer, what), False)
        # Ambiguous (a timeout, a 5xx): the POST may have taken effect. Read the app before reporting a transient
        # failure; the dispatcher's next attempt reads it again too and never POSTs a rollback that is running.
        try:
            fresh = self.client.get_app(name, settings.appNamespace)
        except ArgoCDError:
            fresh = None
        if fresh is not None and target.revision in (_running_revision(fresh), _synced_revision(fresh, [])):
            log.info("Argo CD rollback of %s: the failed POST had taken effect; not repeating it", name)
            return None
        return ActionOutcome(OutcomeStatus.FAILED, detail, describe_failure(answer, f"rollback of {name!r}"), True)

    def _post(self, url: str, body: Mapping[str, Any], idempotency_key: str, detail: dict[str, Any]) -> HttpAnswer:
        answer = self.client.call("POST", url, body, idempotency_key=idempotency_key, retry=RetryPolicy(1))
        detail["post_attempts"] = int(detail.get("post_attempts", 0)) + 1
        return answer

    def _refused_auto_sync(self, name: str, detail: dict[str, Any]) -> ActionOutcome:
        detail["auto_sync"] = "enabled"
        return ActionOutcome(
            OutcomeStatus.FAILED,
            detail,
            f"no rollback of {name!r}: Argo CD refuses rollback while automated sync is enabled, and autoSync is "
            "notifyOnly; disable auto-sync (or revert in Git) to roll back",
            False,
        )

    def _disable_auto_sync(
        self, settings: ArgoCDApp, app: Mapping[str, Any], idempotency_key: str, detail: dict[str, Any]
    ) -> ActionOutcome | None:
        name = settings.name
        previous = ((app.get("spec") or {}).get("syncPolicy") or {}).get("automated")
        body: dict[str, Any] = {
            "name": name,
            "patch": json.dumps({"spec": {"syncPolicy": {"automated": None}}}),
            "patchType": "merge",
        }
        if settings.appNamespace:
            body["appNamespace"] = settings.appNamespace
        if settings.project:
            body["project"] = settings.project
        answer = self.client.call(
            "PATCH", self.client.url(name), body, idempotency_key=f"{idempotency_key}:autosync", retry=RetryPolicy(1)
        )
        if not answer.ok:
            return ActionOutcome(
                OutcomeStatus.FAILED,
                detail,
                describe_failure(answer, f"disabling auto-sync of {name!r}"),
                answer.transient,
            )
        detail["auto_sync_disabled"] = True
        detail["previous_automated"] = previous
        text = (
            f"tailguard disabled automated sync of Argo CD application {name!r} to roll it back; "
            "re-enable it after fixing Git (syncPolicy.automated was "
            f"{json.dumps(previous, sort_keys=True)})"
        )
        detail["notice"] = text
        log.warning("%s", text)
        if self.notice is not None:
            try:
                self.notice(text, {"application": name, "previous_automated": previous})
            except Exception:
                log.exception("auto-sync notice for %s failed", name)
        return None

    def _wait(
        self,
        settings: ArgoCDApp,
        bad: str,
        target: HistoryEntry,
        idempotency_key: str,
        detail: dict[str, Any],
        abort: AbortSignal | None = None,
    ) -> ActionOutcome:
        name = settings.name
        deadline = self.clock.now() + self.wait_timeout
        polls = 0
        last_error: str | None = None
        while True:
            try:
                app = self.client.get_app(name, settings.appNamespace)
                last_error = None
            except ArgoCDError as failed:
                app, last_error = None, str(failed)
            polls += 1
            if app is not None:
                operation = (app.get("status") or {}).get("operationState") or {}
                phase = str(operation.get("phase", ""))
                health = str(((app.get("status") or {}).get("health") or {}).get("status", ""))
                detail.update({"operation_phase": phase, "health": health, "polls": polls})
                if phase in ("Failed", "Error"):
                    return ActionOutcome(
                        OutcomeStatus.FAILED,
                        detail,
                        f"rollback of {name!r} to {target.revision}: operation {phase}: {operation.get('message', '')}",
                        False,
                    )
                if phase == "Succeeded" and health == "Healthy":
                    return self._finish(name, bad, idempotency_key, detail, app)
            if self.clock.now() >= deadline:
                state = last_error or f"operation {detail.get('operation_phase')}, health {detail.get('health')}"
                return ActionOutcome(
                    OutcomeStatus.FAILED,
                    detail,
                    f"rollback of {name!r} to {target.revision} started, but not Healthy after "
                    f"{self.wait_timeout:g}s ({state})",
                    False,
                )
            if abort is None:
                self.clock.sleep(self.poll_interval)
                continue
            stopped = abort.hold(self.poll_interval)
            if stopped is not None:
                return self._aborted_wait(name, target, detail, stopped, last_error)

    def _aborted_wait(
        self,
        name: str,
        target: HistoryEntry,
        detail: dict[str, Any],
        request: AbortRequest,
        last_error: str | None,
    ) -> ActionOutcome:
        """ABORTED while waiting for the sync: the rollback request stays with Argo CD; what it was last seen doing."""
        sent = "sent by this attempt" if detail.get("post_attempts") else "already running when this attempt began"
        seen = f"operation {detail.get('operation_phase') or 'unknown'}, health {detail.get('health') or 'unknown'}"
        if last_error is not None:
            seen += f" (the last poll failed: {last_error})"
        detail.update(
            {
                "aborted": request.to_json(),
                "rollback_request": f"{sent}; it stays with Argo CD (not undone): only tailguard's wait stopped",
                "last_seen": seen,
            }
        )
        log.warning("Argo CD rollback of %s: wait %s; last seen %s", name, request.phrase(), seen)
        return ActionOutcome(
            OutcomeStatus.ABORTED,
            detail,
            f"rollback of {name!r} to {target.revision}: wait for sync and health {request.phrase()} after "
            f"{detail.get('polls', 0)} poll(s); the rollback request stays with Argo CD; last seen: {seen}",
        )

    def _finish(
        self, name: str, bad: str, idempotency_key: str, detail: dict[str, Any], app: Mapping[str, Any]
    ) -> ActionOutcome:
        detail.setdefault("health", ((app.get("status") or {}).get("health") or {}).get("status"))
        detail["replayed"] = bool(detail.get("already_done", False))
        self.record.record(name, bad, idempotency_key, detail, self.clock.now())
        log.info("Argo CD application %s rolled back from %s to %s", name, bad, detail.get("to_revision"))
        return ActionOutcome(OutcomeStatus.SUCCEEDED, detail)


def _epoch(rfc3339: str | None) -> float | None:
    if not rfc3339:
        return None
    try:
        return datetime.datetime.fromisoformat(rfc3339).timestamp()
    except ValueError:
        return None


def pick_target(history: Sequence[HistoryEntry], bad: str, known_bad: set[str]) -> HistoryEntry | None:
    """The newest entry before the last deployment of `bad` whose revision is neither `bad` nor known bad."""
    positions = [index for index, entry in enumerate(history) if entry.revision == bad]
    before = history[: positions[-1]] if positions else history[:-1]
    excluded = known_bad | {bad}
    for entry in reversed(before):
        if entry.revision not in excluded:
            return entry
    return None


def _auto_sync_refused(answer: HttpAnswer) -> bool:
    """Argo CD's refusal to roll back while automated sync is on (gRPC FailedPrecondition)."""
    return grpc_code(answer) == GRPC_FAILED_PRECONDITION and "auto-sync" in error_message(answer)


def _automated(app: Mapping[str, Any]) -> bool:
    return ((app.get("spec") or {}).get("syncPolicy") or {}).get("automated") is not None


def _running_revision(app: Mapping[str, Any]) -> str | None:
    operation = (app.get("status") or {}).get("operationState") or {}
    if operation.get("phase") not in ("Running", "Terminating"):
        return None
    revision = ((operation.get("operation") or {}).get("sync") or {}).get("revision")
    return str(revision) if revision else None


def _synced_revision(app: Mapping[str, Any], history: Sequence[HistoryEntry]) -> str | None:
    revision = ((app.get("status") or {}).get("sync") or {}).get("revision")
    if revision:
        return str(revision)
    return history[-1].revision if history else None
