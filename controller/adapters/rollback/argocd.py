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
"""

from __future__ import annotations

import datetime
import json
import logging
import os
import threading
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal
from urllib.parse import quote

import requests
from pydantic import BaseModel, ConfigDict, Field, model_validator

from controller.core.controls import AbortRequest
from controller.core.ports import AbortSignal, ActionOutcome, Clock, OutcomeStatus
from controller.kit.errors import ActuatorError
from controller.kit.http import HttpAnswer, RetryPolicy, redact_url, request_with_retry

log = logging.getLogger(__name__)

AutoSyncMode = Literal["disableAutoSync", "notifyOnly"]
GRPC_FAILED_PRECONDITION = 9
GRPC_INVALID_ARGUMENT = 3
GRPC_UNAUTHENTICATED = 16
FINISHED_PHASES = frozenset({"Succeeded", "Failed", "Error"})


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class ArgoCDApp(_Strict):
    name: str = Field(min_length=1, description="the Argo CD application")
    appNamespace: str | None = Field(default=None, description="the application's namespace (apps in any namespace)")
    project: str | None = None
    autoSync: AutoSyncMode | None = Field(default=None, description="overrides the global autoSync for this app")


def _app(value: Any) -> Any:
    return {"name": value} if isinstance(value, str) else value


class ArgoCDSettings(_Strict):
    """`argocd:` in the controller configuration. The token is never a value here: a file or an env variable."""

    url: str = Field(pattern=r"^https?://", description="Argo CD API server, e.g. https://argocd.example")
    tokenFile: str | None = Field(default=None, description="file holding the bearer token")
    tokenEnv: str | None = Field(default=None, description="environment variable holding the bearer token")
    apps: dict[str, ArgoCDApp] = Field(
        min_length=1, description="service -> application (a name, or {name, appNamespace, project, autoSync})"
    )
    autoSync: AutoSyncMode = Field(
        default="notifyOnly",
        description="Argo CD refuses rollback while automated sync is on: disable it first, or only notify",
    )
    timeout: float = Field(default=10.0, gt=0, description="seconds per request")
    retries: int = Field(default=3, ge=1, le=10, description="attempts in all, transient errors only")
    waitTimeout: float = Field(default=300.0, gt=0, description="seconds to wait for the rollback to be Healthy")
    pollInterval: float = Field(default=5.0, gt=0, description="seconds between status polls while waiting")

    @model_validator(mode="before")
    @classmethod
    def _app_names(cls, data: Any) -> Any:
        if isinstance(data, dict) and isinstance(data.get("apps"), dict):
            data = {**data, "apps": {k: _app(v) for k, v in data["apps"].items()}}
        return data

    @model_validator(mode="after")
    def _one_token_source(self) -> ArgoCDSettings:
        if (self.tokenFile is None) == (self.tokenEnv is None):
            raise ValueError("argocd needs exactly one of tokenFile or tokenEnv (the bearer token is never inline)")
        return self


class ArgoCDError(ActuatorError):
    """A read from Argo CD failed (reads raise; actions return outcomes)."""

    def __init__(self, message: str, *, transient: bool) -> None:
        super().__init__(message, transient=transient)


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


def read_token(token_file: str | Path | None, token_env: str | None) -> str | None:
    """The bearer token from its file or environment variable; None when absent (never logged)."""
    if token_file is not None:
        try:
            token = Path(token_file).read_text(encoding="utf-8").strip()
        except OSError:
            return None
        return token or None
    if token_env is not None:
        return os.environ.get(token_env, "").strip() or None
    return None


@dataclass(frozen=True)
class HistoryEntry:
    id: int
    revision: str
    deployed_at: str | None
    source: Mapping[str, Any]


def history_of(app: Mapping[str, Any]) -> list[HistoryEntry]:
    """`status.history`, oldest first (ids ascend; int64 may arrive as a JSON string)."""
    entries = []
    for raw in (app.get("status") or {}).get("history") or []:
        try:
            entry_id = int(raw["id"])
        except (KeyError, TypeError, ValueError):
            continue
        entries.append(
            HistoryEntry(entry_id, str(raw.get("revision", "")), raw.get("deployedAt"), dict(raw.get("source") or {}))
        )
    return sorted(entries, key=lambda e: e.id)


def _grpc_code(answer: HttpAnswer) -> int | None:
    body = answer.body
    if isinstance(body, Mapping) and isinstance(body.get("code"), int):
        return int(body["code"])
    return None


def _message(answer: HttpAnswer) -> str:
    body = answer.body
    if isinstance(body, Mapping):
        text = body.get("message") or body.get("error")
        if isinstance(text, str):
            return text.strip()
    return answer.error or answer.text[:200]


class ArgoCDClient:
    """The Argo CD REST calls tailguard makes: read an app, roll it back, merge-patch it."""

    def __init__(
        self,
        base_url: str,
        *,
        clock: Clock,
        token: Callable[[], str | None],
        timeout: float = 10.0,
        retries: int = 3,
        backoff: float = 0.5,
        session: requests.Session | None = None,
    ) -> None:
        self.base_url = base_url.rstrip("/")
        self.clock = clock
        self.token = token
        self.timeout = timeout
        self.retry = RetryPolicy(attempts=max(1, retries), backoff=backoff)
        self.session = session or requests.Session()

    def url(self, name: str, suffix: str = "", app_namespace: str | None = None) -> str:
        url = f"{self.base_url}/api/v1/applications/{quote(name, safe='')}{suffix}"
        return url + (f"?appNamespace={quote(app_namespace, safe='')}" if app_namespace else "")

    def call(
        self,
        method: str,
        url: str,
        body: Mapping[str, Any] | None = None,
        *,
        idempotency_key: str | None = None,
        retry: RetryPolicy | None = None,
    ) -> HttpAnswer:
        token = self.token()
        if token is None:
            return HttpAnswer(None, None, "", f"{method} {redact_url(url)}: no Argo CD token configured", False, 0)
        headers = {"Accept": "application/json", "Authorization": f"Bearer {token}"}
        if idempotency_key is not None:
            headers["Idempotency-Key"] = idempotency_key
        return request_with_retry(
            self.session,
            method,
            url,
            clock=self.clock,
            timeout=self.timeout,
            retry=retry or self.retry,
            json_body=dict(body) if body is not None else None,
            headers=headers,
        )

    def get_app(self, name: str, app_namespace: str | None = None) -> dict[str, Any]:
        answer = self.call("GET", self.url(name, app_namespace=app_namespace))
        if not answer.ok:
            raise ArgoCDError(_describe(answer, f"reading application {name!r}"), transient=answer.transient)
        if not isinstance(answer.body, Mapping):
            raise ArgoCDError(f"reading application {name!r}: expected a JSON object", transient=False)
        return dict(answer.body)


def _describe(answer: HttpAnswer, what: str) -> str:
    if answer.status == 401 or _grpc_code(answer) == GRPC_UNAUTHENTICATED:
        return f"{what}: unauthorized (HTTP 401: {_message(answer)}); check the Argo CD token"
    if answer.status is None:
        return f"{what}: {answer.error}"
    return f"{what}: HTTP {answer.status}: {_message(answer)}"


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

    def plan_rollback(self, service: str, *, rollout_revision: str | None = None) -> dict[str, Any] | ActionOutcome:
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
        plan: dict[str, Any] = {
            "service": service,
            "application": name,
            "from_revision": current,
            "bad_revision": bad,
            "to_revision": target.revision,
            "history_id": target.id,
        }
        since = next((_epoch(e.deployed_at) for e in reversed(history) if e.revision == current), None)
        if since is not None:
            plan["from_deployed_at"] = since  # when what runs now was deployed (a rollout since a decision: its world)
        return plan

    def rollback(
        self,
        service: str,
        *,
        idempotency_key: str,
        rollout_revision: str | None = None,
        plan: Mapping[str, Any] | None = None,
        abort: AbortSignal | None = None,
    ) -> ActionOutcome:
        """Make the planned rollback (None: plan it now): done when the app already runs `to_revision`,
        world-changed when it runs neither the plan's `from_revision` nor `to_revision` (someone else changed
        it). On `abort`: nothing sent when it came before the POST, else the wait stops at its next poll."""
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
            planned = self.plan_rollback(service, rollout_revision=rollout_revision)
            if isinstance(planned, ActionOutcome):
                return planned
            plan = planned
        try:
            app = self.client.get_app(name, app_settings.appNamespace)
        except ArgoCDError as failed:
            return ActionOutcome(OutcomeStatus.FAILED, detail, f"rollback of {name!r}: {failed}", failed.transient)
        history = history_of(app)
        current = _synced_revision(app, history)
        source, bad = plan.get("from_revision"), str(plan.get("bad_revision") or plan.get("from_revision"))
        target = HistoryEntry(int(plan["history_id"]), str(plan["to_revision"]), None, {})
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
                return ActionOutcome(OutcomeStatus.FAILED, detail, _describe(answer, f"rollback of {name!r}"), True)
        if answer.ok:
            log.info("Argo CD rollback of %s to %s (history id %d) started", name, target.revision, target.id)
            return None
        if not answer.transient:
            what = f"rollback of {name!r} to {target.revision} (history id {target.id})"
            if _grpc_code(answer) == GRPC_INVALID_ARGUMENT:
                return ActionOutcome(OutcomeStatus.FAILED, detail, f"{what} refused: {_message(answer)}", False)
            return ActionOutcome(OutcomeStatus.FAILED, detail, _describe(answer, what), False)
        # Ambiguous (a timeout, a 5xx): the POST may have taken effect. Read the app before reporting a transient
        # failure; the dispatcher's next attempt reads it again too and never POSTs a rollback that is running.
        try:
            fresh = self.client.get_app(name, settings.appNamespace)
        except ArgoCDError:
            fresh = None
        if fresh is not None and target.revision in (_running_revision(fresh), _synced_revision(fresh, [])):
            log.info("Argo CD rollback of %s: the failed POST had taken effect; not repeating it", name)
            return None
        return ActionOutcome(OutcomeStatus.FAILED, detail, _describe(answer, f"rollback of {name!r}"), True)

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
                OutcomeStatus.FAILED, detail, _describe(answer, f"disabling auto-sync of {name!r}"), answer.transient
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
    return _grpc_code(answer) == GRPC_FAILED_PRECONDITION and "auto-sync" in _message(answer)


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
