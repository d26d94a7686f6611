"""Grafana annotations of rollouts and decisions, delivered exactly once through a durable outbox.

Nothing here calls Grafana while the controller decides: `annotate`, `annotate_decision`
and `annotate_rollout` only commit an outbox item (controller/adapters/stores/outbox.py) and return.
A worker delivers the items in order with backoff; while Grafana is down or refuses
the token they wait, and they are delivered when it comes back.

Exactly once: each Grafana annotation carries a tag naming it (`decision:<id>` +
`region` for a decision's region, `key:<hash>` for the others). After an attempt
whose fate is unknown (a timeout after the request was sent, a 5xx, a crash), the
next attempt first looks the annotation up by that tag (GET /api/annotations?tags=...)
and only posts it if Grafana does not have it. The id Grafana returns is stored, so
the region of a decision is closed later with PATCH /api/annotations/{id}.
Grafana times are epoch milliseconds. The API token is read from a file or an
environment variable when the client is built and never logged.
"""

from __future__ import annotations

import hashlib
import logging
import math
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any, Protocol
from urllib.parse import quote

import requests
from grafana_client.api import GrafanaApi
from grafana_client.client import GrafanaException

from tailguard.controller.adapters.annotations.settings import GrafanaSettings
from tailguard.controller.adapters.stores.outbox import (
    Backoff,
    DeliveryResult,
    Outbox,
    OutboxItem,
    OutboxWorker,
    deliver_due,
)
from tailguard.controller.core.model import format_target, target_key
from tailguard.controller.core.ports import ActionOutcome, Annotation, Clock, OutcomeStatus
from tailguard.controller.kit.http import (
    TRANSIENT_STATUSES,
    DeadlineAdapter,
    HttpAnswer,
    RetryPolicy,
    redact_url,
    retrying,
)

log = logging.getLogger(__name__)

CREATE = "grafana.create"
UPDATE = "grafana.update"
# 401/403 are not transient for one request, but a rotated token is fixed by a human: keep the item, retry later.
WAIT_STATUSES = frozenset({401, 403})
OPENING_KINDS = ("fire", "suppressed", "errored")



class GrafanaPort(Protocol):
    """The Grafana HTTP API as the annotation adapters need it (controller/adapters/annotations/grafana.py's
    GrafanaHttp): one call, its answer as data; `retry` only for idempotent requests (GET, PATCH)."""

    def call(
        self, method: str, path: str, body: Mapping[str, Any] | None = None, *, retry: bool = False
    ) -> HttpAnswer: ...

class GrafanaHttp:
    """The Grafana HTTP API through grafana-client's GrafanaApi: timeouts, answers as data, bounded retries."""

    def __init__(self, url: str, token: str | None, clock: Clock, *, timeout: float = 5.0, retries: int = 3) -> None:
        self.url = url.rstrip("/")
        self.clock = clock
        self.retry = RetryPolicy(attempts=retries, backoff=0.5)
        self.api = GrafanaApi.from_url(self.url, credential=token, timeout=timeout)
        self.api.client.s = deadline_session(self.api.client.s)
        self._shown = redact_url(self.url)

    def call(self, method: str, path: str, body: Mapping[str, Any] | None = None, *, retry: bool = False) -> HttpAnswer:
        """`path` is below /api. Only idempotent calls may pass retry=True: a POST is never blindly repeated."""
        return retrying(
            lambda attempt: self._once(method, path, body, attempt),
            retry=self.retry if retry else RetryPolicy(attempts=1),
            clock=self.clock,
            failure=lambda answer: answer.error,
            transient=lambda answer: answer.transient,
            what=f"{method} {self._shown}/api{path.split('?')[0]}",
        )

    def _once(self, method: str, path: str, body: Mapping[str, Any] | None, attempt: int) -> HttpAnswer:
        """One try as the kit's HttpAnswer; status None: no HTTP answer (timeout, connection refused)."""
        shown = f"{method} {self._shown}/api{path.split('?')[0]}"
        runner: Any = getattr(self.api.client, method)
        try:
            answer = runner(path, json=dict(body) if body is not None else None)
        except requests.Timeout:  # the kit's DeadlineExceeded among them
            return HttpAnswer(None, None, "", f"{shown}: timed out", True, attempt)
        except GrafanaException as exc:
            status = int(exc.status_code or 0) or None
            message = exc.response.get("message") if isinstance(exc.response, dict) else None
            detail = f"HTTP {status}: {message or exc.message}" if status else f"request failed: {exc.message}"
            transient = status is None or status in TRANSIENT_STATUSES
            return HttpAnswer(status, exc.response, "", f"{shown}: {detail}", transient, attempt)
        except Exception as exc:  # noqa: BLE001 - connection refused/reset surface as the HTTP library's own errors
            return HttpAnswer(None, None, "", f"{shown}: connection failed ({type(exc).__name__})", True, attempt)
        return HttpAnswer(200, answer, "", None, False, attempt)


def deadline_session(library_session: Any) -> requests.Session:
    """The session grafana-client sends through, replaced by a `requests` one on the kit's DeadlineAdapter: every
    request ends within grafana-client's `timeout` IN TOTAL (it is a per-read timeout to the library; a Grafana
    that trickles its answer is cut there: requests.Timeout), and the body is read to its real end. The headers
    the library set (User-Agent, an organisation) are kept. The library makes one attempt per call (retries: 0);
    `GrafanaHttp.call` retries, through the clock. grafana-client 3.x is itself on `requests` (pinned below 4: 4
    and later pull in niquests and urllib3-future, which installs itself as `urllib3`, docs/architecture.md); the
    library calls `session.request(method, url, ...)` in every release, so the swap holds for either."""
    session = requests.Session()
    session.headers.update(library_session.headers)
    adapter = DeadlineAdapter(max_retries=0)
    session.mount("http://", adapter)
    session.mount("https://", adapter)
    library_session.close()
    return session


def ms(seconds: float) -> int:
    """Grafana wants epoch milliseconds."""
    return round(seconds * 1000)


def key_tag(idempotency_key: str) -> str:
    return "key:" + hashlib.sha256(idempotency_key.encode("utf-8")).hexdigest()[:16]


def decision_ref(decision_id: str) -> str:
    return f"decision:{decision_id}"


def _number(value: Any) -> str:
    if isinstance(value, (int, float)) and math.isfinite(value):
        return f"{value:.4g}"
    return "no-data"


def _attribution_text(attribution: Any) -> str | None:
    if not attribution:
        return None
    if isinstance(attribution, Mapping) and "status" in attribution:
        # The engine's shape (Attribution.to_json): {status, reason, rollout: {...}, seconds_before_onset}.
        rollout = attribution.get("rollout")
        if attribution.get("status") != "attributed" or not isinstance(rollout, Mapping):
            return f"not attributed to a rollout: {attribution.get('reason') or attribution.get('status')}"
        return str(attribution.get("reason") or _attribution_text(rollout))
    if isinstance(attribution, Mapping):
        revision = attribution.get("revision")
        previous = attribution.get("previous_revision")
        source = attribution.get("source")
        at = attribution.get("at")
        parts = [f"attributed to rollout {revision}"]
        if previous is not None:
            parts.append(f"(from {previous})")
        if source:
            parts.append(f"via {source}")
        if isinstance(at, (int, float)):
            parts.append(f"at {at:.0f}")
        return " ".join(str(part) for part in parts)
    return f"attributed to {attribution}"


def decision_text(decision: Mapping[str, Any]) -> str:
    """The region's text: what happened, why, which branch was taken and the attribution (or its absence)."""
    target = format_target(target_key({str(k): str(v) for k, v in (decision.get("target") or {}).items()}))
    kind = str(decision.get("kind", ""))
    lines = [
        f"tailguard {kind}: {decision.get('policy')}/{decision.get('condition')} {target}",
        f"value {_number(decision.get('value'))} vs threshold {_number(decision.get('threshold'))}"
        + (" (dry run)" if decision.get("dry_run") else ""),
        f"reason: {decision.get('reason', '')}",
    ]
    branch = decision.get("branch")
    if isinstance(branch, Mapping):  # the engine's shape (BranchChoice.to_json): {name, reason}
        lines.append(f"branch: {branch.get('name')} ({branch.get('reason')})")
    elif branch:
        lines.append(f"branch: {branch}")
    attribution = _attribution_text(decision.get("attribution"))
    lines.append(attribution or "not attributed to a rollout")
    actions = [str(action.get("type")) for action in decision.get("actions") or [] if isinstance(action, Mapping)]
    if actions:
        lines.append("actions: " + ", ".join(actions))
    lines.append(f"decision id: {decision.get('id')}")
    return "\n".join(lines)


def _label_tags(labels: Mapping[str, Any]) -> list[str]:
    return [f"{name}:{value}" for name, value in sorted(labels.items())]


def engine_args_diff_text(diff: Any) -> str:
    """The vLLM engine-argument diff of a rollout, one flag a line: `--flag: old -> new`."""
    if not diff:
        return "no engine-argument change"
    if isinstance(diff, str):
        return diff
    lines: list[str] = []
    if isinstance(diff, Mapping):
        for name, change in sorted(diff.items()):
            if isinstance(change, Mapping):
                old, new = change.get("old", change.get("from")), change.get("new", change.get("to"))
            elif isinstance(change, (list, tuple)) and len(change) == 2:
                old, new = change
            else:
                old, new = None, change
            lines.append(f"{name}: {'(unset)' if old is None else old} -> {'(unset)' if new is None else new}")
        return "\n".join(lines)
    return "\n".join(str(entry) for entry in diff)


class GrafanaAnnotator:
    """Implements the Annotator protocol (and decision/rollout annotations) on top of an Outbox."""

    def __init__(
        self,
        grafana: GrafanaPort,
        outbox: Outbox,
        clock: Clock,
        *,
        dashboard_uid: str | None = None,
        backoff: Backoff | None = None,
    ) -> None:
        self.grafana = grafana
        self.outbox = outbox
        self.clock = clock
        self.dashboard_uid = dashboard_uid
        self.backoff = backoff or Backoff()
        self._worker: OutboxWorker | None = None

    @classmethod
    def from_settings(cls, settings: GrafanaSettings, clock: Clock, outbox_path: Path) -> GrafanaAnnotator:
        """Reads the token now (GrafanaTokenError names its source when it cannot) and opens the outbox."""
        http = GrafanaHttp(settings.url, settings.token(), clock, timeout=settings.timeout, retries=settings.retries)
        return cls(http, Outbox(outbox_path), clock, dashboard_uid=settings.dashboardUid)

    # -- producers: durable enqueue, no HTTP ------------------------------------------------------------------

    def _body(self, time: float, text: str, tags: Sequence[str], time_end: float | None) -> dict[str, Any]:
        body: dict[str, Any] = {"time": ms(time), "text": text, "tags": list(dict.fromkeys(tags))}
        if time_end is not None and time_end > time:
            body["timeEnd"] = ms(time_end)
        if self.dashboard_uid is not None:
            body["dashboardUID"] = self.dashboard_uid
        return body

    def _enqueue(self, key: str, kind: str, payload: Mapping[str, Any]) -> ActionOutcome:
        try:
            added = self.outbox.enqueue(key, kind, payload, self.clock.now())
        except Exception as exc:  # noqa: BLE001 - a full disk is an outcome for the dispatcher, not a crash
            return ActionOutcome(OutcomeStatus.FAILED, {"outbox": str(self.outbox.path)}, f"outbox: {exc}", True)
        if self._worker is not None:
            self._worker.wake()
        return ActionOutcome(OutcomeStatus.SUCCEEDED, {"queued": added, "outbox_key": key, "deduplicated": not added})

    def annotate(self, annotation: Annotation, *, idempotency_key: str) -> ActionOutcome:
        """A policy's annotate action: one Grafana annotation (a region when it has an end)."""
        tag = key_tag(idempotency_key)
        tags = [*annotation.tags, "tailguard", tag, *_label_tags(annotation.labels)]
        if annotation.decision_id:
            tags.append(f"incident:{annotation.decision_id}")
        body = self._body(annotation.time, annotation.text, tags, annotation.time_end)
        return self._enqueue(f"grafana:{idempotency_key}", CREATE, {"body": body, "lookup": [tag]})

    def annotate_decision(self, decision: Mapping[str, Any]) -> ActionOutcome:
        """Every decision: the first opens its region at the onset, the resolve closes it (PATCH timeEnd)."""
        decision_id = str(decision["id"])
        kind = str(decision.get("kind", ""))
        ref = decision_ref(decision_id)
        onset = float(decision.get("onset") or decision.get("at") or self.clock.now())
        base_tags = [
            "tailguard",
            "region",
            str(decision.get("policy")),
            f"policy:{decision.get('policy')}",
            f"condition:{decision.get('condition')}",
            ref,
        ]
        labels = {str(k): str(v) for k, v in (decision.get("target") or {}).items()}
        tags = [*base_tags, *_label_tags(labels)]
        text = decision_text(decision)
        lookup = [ref, "region"]
        if kind == "resolve":
            # A resolve decision carries no attribution nor branch: keep the opening's text (the why) and add the end.
            opening = self.outbox.get(f"grafana:{ref}:fire") or self.outbox.get(f"grafana:{ref}:open")
            opened_text = (opening.payload.get("body") or {}).get("text") if opening is not None else None
            if isinstance(opened_text, str) and opened_text:
                text = f"{opened_text}\nresolved: {decision.get('reason', '')} (value {_number(decision.get('value'))})"
            end = float(decision.get("resolved_at") or decision.get("at") or self.clock.now())
            body = self._body(onset, text, [*tags, "resolved"], end)
            patch = {key: body[key] for key in ("time", "timeEnd", "text", "tags") if key in body}
            payload = {"ref": ref, "lookup": lookup, "patch": patch, "body": body}
            return self._enqueue(f"grafana:{ref}:resolve", UPDATE, payload)
        body = self._body(onset, text, [*tags, kind], None)
        opened = self.outbox.get(f"grafana:{ref}:open")
        if opened is None or opened.payload.get("kind") == kind:
            # The same decision seen again (e.g. re-enqueued after a restart) is deduplicated by the key.
            payload = {"body": body, "lookup": lookup, "ref": ref, "kind": kind}
            return self._enqueue(f"grafana:{ref}:open", CREATE, payload)
        # The region is open already (e.g. suppressed, then fired): update its text and tags.
        patch = {"text": body["text"], "tags": body["tags"]}
        return self._enqueue(
            f"grafana:{ref}:{kind}", UPDATE, {"ref": ref, "lookup": lookup, "patch": patch, "body": body}
        )

    def annotate_rollout(self, rollout: Any) -> ActionOutcome:
        """A config rollout: tagged `rollout`, its revision and the vLLM engine-argument diff in the text."""
        labels = {str(k): str(v) for k, v in dict(getattr(rollout, "labels", {}) or {}).items()}
        revision = str(getattr(rollout, "revision", ""))
        previous = getattr(rollout, "previous_revision", None)
        source = str(getattr(rollout, "source", "") or "")
        at = float(rollout.at)
        where = ",".join(f"{k}={v}" for k, v in sorted(labels.items()))
        key = f"rollout:{source}:{where}:{revision}"
        tag = key_tag(key)
        head = f"rollout {revision}" + (f" (from {previous})" if previous not in (None, "") else "")
        text = "\n".join(
            [f"{head} of {where or 'unknown target'}" + (f" via {source}" if source else ""), "engine arguments:"]
            + ["  " + line for line in engine_args_diff_text(getattr(rollout, "diff", None)).splitlines()]
        )
        tags = ["rollout", f"revision:{revision}", *_label_tags(labels), tag]
        if source:
            tags.append(f"source:{source}")
        return self._enqueue(f"grafana:{key}", CREATE, {"body": self._body(at, text, tags, None), "lookup": [tag]})

    # -- the delivery side ------------------------------------------------------------------------------------

    def _lookup(self, tags: Sequence[str]) -> tuple[int | None, DeliveryResult | None]:
        query = "&".join(f"tags={quote(tag, safe='')}" for tag in tags)
        answer = self.grafana.call("GET", f"/annotations?{query}&type=annotation&limit=10", retry=True)
        if not answer.ok:
            return None, _failure(answer, "looking the annotation up")
        found = [entry for entry in answer.body or [] if isinstance(entry, Mapping) and "id" in entry]
        if not found:
            return None, None
        return min(int(entry["id"]) for entry in found), None

    def _post(self, body: Mapping[str, Any], ref: str | None) -> DeliveryResult:
        answer = self.grafana.call("POST", "/annotations", body)
        if not answer.ok:
            return _failure(answer, "posting the annotation")
        annotation_id = int(answer.body["id"]) if isinstance(answer.body, Mapping) and "id" in answer.body else None
        if annotation_id is None:
            return DeliveryResult(False, error="Grafana answered without an annotation id", transient=True)
        return DeliveryResult(True, {"id": annotation_id}, refs={ref: annotation_id} if ref else {})

    def deliver(self, item: OutboxItem) -> DeliveryResult:
        """The outbox sender: one item, at most one POST, after a lookup if an earlier attempt may have landed."""
        payload = item.payload
        ref = payload.get("ref")
        lookup = list(payload.get("lookup") or [])
        if item.kind == CREATE:
            if item.attempts > 1 and lookup:
                found, failed = self._lookup(lookup)
                if failed is not None:
                    return failed
                if found is not None:
                    return DeliveryResult(True, {"id": found, "found": True}, refs={ref: found} if ref else {})
            return self._post(payload["body"], ref)
        if item.kind == UPDATE:
            annotation_id = self.outbox.ref(ref) if ref else None
            if annotation_id is None and lookup:
                annotation_id, failed = self._lookup(lookup)
                if failed is not None:
                    return failed
            if annotation_id is None:
                # The opening never reached Grafana (or was deleted): post the whole region instead.
                return self._post(payload["body"], ref)
            answer = self.grafana.call("PATCH", f"/annotations/{annotation_id}", payload["patch"], retry=True)
            if answer.status == 404:
                return self._post(payload["body"], ref)
            if not answer.ok:
                return _failure(answer, f"updating annotation {annotation_id}")
            return DeliveryResult(True, {"id": annotation_id, "patched": True})
        return DeliveryResult(False, error=f"unknown outbox item kind {item.kind!r}", transient=False)

    def flush(self, limit: int = 100) -> int:
        """Deliver what is due now, synchronously (tests, shutdown); returns how many were delivered."""
        return deliver_due(self.outbox, self.deliver, self.clock, self.backoff, limit).delivered

    def start(self, idle_interval: float = 1.0) -> None:
        if self._worker is None:
            self._worker = OutboxWorker(
                self.outbox,
                self.deliver,
                self.clock,
                backoff=self.backoff,
                idle_interval=idle_interval,
                name="tailguard-grafana",
            )
            self._worker.start()

    def stop(self) -> None:
        if self._worker is not None:
            self._worker.stop()
            self._worker = None

    def close(self) -> None:
        self.stop()
        self.outbox.close()


def _failure(answer: HttpAnswer, doing: str) -> DeliveryResult:
    transient = answer.transient or answer.status in WAIT_STATUSES
    if answer.status in WAIT_STATUSES:
        log.warning(
            "Grafana refused the token while %s (HTTP %d); the annotation waits in the outbox", doing, answer.status
        )
    return DeliveryResult(False, error=answer.error, transient=transient)
