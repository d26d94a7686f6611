"""The API's operator endpoints (controller/core/controls.py, controller/core/status_view.py): the recent decisions,
the status document, pause/resume and the kill switch, the abort of a decision's actions. Each answers (status,
JSON body[, headers]); controller/app/api.py routes to them after authentication, on its worker pool."""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping
from typing import Any
from urllib.parse import parse_qs

from tailguard.controller.app.ports import AbortControlPort, ControllerPort, OperatorPort
from tailguard.controller.core.controls import MAX_ABORT_REASON, AbortState
from tailguard.controller.kit.redact import redact_value

DEFAULT_DECISIONS = 50
MAX_DECISIONS = 1000

# A standby's refusal (status, body, headers), or None on the leader: `what` names what to ask the leader for.
StandbyRefusal = Callable[[str], "tuple[int, dict[str, Any], dict[str, str]] | None"]


class OperatorEndpoints:
    """Decisions, status, controls and abort over `controller` (an OperatorPort / AbortControlPort, else 404)."""

    def __init__(
        self,
        controller: ControllerPort,
        refuse_if_standby: StandbyRefusal,
        *,
        token_configured: bool,
        status_links: Mapping[str, str],
    ) -> None:
        self._controller = controller
        self._refuse_if_standby = refuse_if_standby
        self._token_configured = token_configured  # who: "NAME (bearer token)", else the name as given
        self._status_links = status_links  # Grafana links on the status page

    def decisions(self, query: str) -> tuple[int, dict[str, Any] | list[Any]]:
        """`?limit=N` (1..MAX_DECISIONS) newest first; `&before=SEQ` the page after a decision's `seq`. Read from the
        journal's own read connection: a read storm never holds what an evaluation commits under."""
        arguments = parse_qs(query)
        values = arguments.get("limit", [str(DEFAULT_DECISIONS)])
        try:
            limit = int(values[-1])
        except ValueError:
            return 400, {"error": f"limit must be an integer between 1 and {MAX_DECISIONS}"}
        if not 1 <= limit <= MAX_DECISIONS:
            return 400, {"error": f"limit must be an integer between 1 and {MAX_DECISIONS}"}
        before: int | None = None
        if "before" in arguments:
            try:
                before = int(arguments["before"][-1])
            except ValueError:
                before = 0
            if before < 1:
                return 400, {"error": "before must be a positive integer: the `seq` of the last decision of a page"}
        # Receiver URLs and credential-bearing values are cut to scheme+host (they are in the journal cut already;
        # this also covers an older journal's rows).
        # (the one-argument call when no page is asked for: a ControllerPort written before paging still serves)
        page = (
            self._controller.recent_decisions(limit)
            if before is None
            else self._controller.recent_decisions(limit, before)
        )
        return 200, redact_value(page)

    def status(self) -> tuple[int, dict[str, Any], dict[str, str]]:
        if not isinstance(self._controller, OperatorPort):
            return 404, {"error": "this controller serves no status"}, {}
        standby = self._refuse_if_standby("status")
        if standby is not None:
            return standby
        # Credential-bearing values cut to scheme+host; the configured links (no credentials) are added after.
        document: dict[str, Any] = redact_value(self._controller.status())
        document["links"] = {**document.get("links", {}), **self._status_links}
        return 200, document, {}

    def control(self, path: str, body: bytes) -> tuple[int, dict[str, Any]]:
        """POST /api/v1/policies/NAME/pause|resume, POST /api/v1/pause|resume (every policy: the kill switch).
        Body (optional JSON): {"by": "who", "reason": "why"}; both are journaled with the control."""
        parsed = control_of(path)
        assert parsed is not None
        policy, paused = parsed
        if not isinstance(self._controller, OperatorPort):
            return 404, {"error": "this controller takes no controls"}
        try:
            raw = json.loads(body) if body.strip() else {}
        except (UnicodeDecodeError, json.JSONDecodeError):
            return 400, {"error": 'the body must be JSON: {"by": ..., "reason": ...}'}
        if not isinstance(raw, dict):
            return 400, {"error": "the body must be a JSON object"}
        by, reason = str(raw.get("by") or "").strip()[:200], str(raw.get("reason") or "").strip()[:1000]
        who = self._who(by)
        if policy is not None and policy not in self._controller.policies():
            return 404, {"error": f"no policy named {policy!r} is loaded"}
        control = self._controller.set_paused(policy, paused, by=who, reason=reason)
        return 200, {"policy": policy if policy is not None else "*", "control": control.to_json()}

    def abort(self, path: str, body: bytes) -> tuple[int, dict[str, Any]]:
        """POST /api/v1/decisions/ID/abort, body {"reason": "why" (required), "by": "who"}: stop the decision's
        actions (controller/loop/dispatcher.py `abort`). 202: one is in flight and stops at its next step; 200: the
        queued and deferred ones are cancelled before they ran; 409: it had already finished; 404: unknown id."""
        decision_id = abort_of(path)
        assert decision_id is not None
        if not isinstance(self._controller, AbortControlPort):
            return 404, {"error": "this controller takes no aborts"}
        try:
            raw = json.loads(body) if body.strip() else {}
        except (UnicodeDecodeError, json.JSONDecodeError):
            return 400, {"error": 'the body must be JSON: {"reason": ..., "by": ...}'}
        if not isinstance(raw, dict):
            return 400, {"error": "the body must be a JSON object"}
        reason, by = raw.get("reason"), raw.get("by")
        if not isinstance(reason, str) or not reason.strip():
            return 400, {"error": "reason is required: say why (it is journaled with the abort)"}
        if len(reason.strip()) > MAX_ABORT_REASON:
            return 400, {"error": f"reason is {len(reason.strip())} characters; at most {MAX_ABORT_REASON}"}
        if by is not None and not isinstance(by, str):
            return 400, {"error": "by must be a string"}
        who = self._who((by or "").strip()[:200])
        result = self._controller.abort_decision(decision_id, by=who, reason=reason.strip())
        status = {AbortState.IN_FLIGHT: 202, AbortState.CANCELLED: 200, AbortState.FINISHED: 409}
        # The actions' errors may name a URL: cut to scheme+host, as in /api/v1/decisions.
        answer: dict[str, Any] = redact_value({**result.to_json(), "by": who, "reason": reason.strip()})
        if result.state not in status:
            return 404, {**answer, "error": result.message}
        if result.state is AbortState.FINISHED:
            answer["error"] = result.message
        return status[result.state], answer

    def _who(self, by: str) -> str:
        return f"{by or 'unnamed'} (bearer token)" if self._token_configured else by or "unauthenticated"


def control_of(path: str) -> tuple[str | None, bool] | None:
    """(policy or None for every policy, pause?) of a control endpoint's path; None for any other path."""
    parts = path.strip("/").split("/")
    if parts[:2] != ["api", "v1"]:
        return None
    rest = parts[2:]
    if len(rest) == 1 and rest[0] in ("pause", "resume"):
        return None, rest[0] == "pause"
    if len(rest) == 3 and rest[0] == "policies" and rest[1] and rest[2] in ("pause", "resume"):
        return rest[1], rest[2] == "pause"
    return None


def abort_of(path: str) -> str | None:
    """The decision id of `/api/v1/decisions/ID/abort`; None for any other path."""
    parts = path.strip("/").split("/")
    if len(parts) == 5 and parts[:3] == ["api", "v1", "decisions"] and parts[3] and parts[4] == "abort":
        return parts[3]
    return None
