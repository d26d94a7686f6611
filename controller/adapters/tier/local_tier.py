"""RollbackPort, ScalePort and TrafficRouter over the local serving tier's control API (docs/architecture.md).

Every mutating call carries the action's idempotency key twice (header and body):
the tier answers a repeated key with the first answer and `"replayed": true`, so a
retry, or a resume after a crash, never acts twice. A mutation makes one attempt and
reports `transient` (the dispatcher alone retries actions); reads retry through the kit.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from typing import Any
from urllib.parse import quote

import requests

from tailguard.controller.core.ports import (
    AbortSignal,
    ActionOutcome,
    Clock,
    OutcomeStatus,
    RollbackPlan,
    RollbackRequest,
    ScaleRequest,
    ScaleState,
    TrafficRequest,
)
from tailguard.controller.kit.errors import ActuatorError
from tailguard.controller.kit.http import HttpAnswer, RetryPolicy, redact_url, request_with_retry

log = logging.getLogger(__name__)


class TierError(ActuatorError):
    """A read from the tier failed (raised only by reads such as `replicas()`; actions return outcomes)."""

    def __init__(self, message: str, *, transient: bool) -> None:
        super().__init__(message, transient=transient)


class LocalTierClient:
    def __init__(
        self,
        base_url: str,
        *,
        timeout: float = 5.0,
        retries: int = 3,
        clock: Clock,
        backoff: float = 0.5,
        session: requests.Session | None = None,
    ) -> None:
        if timeout <= 0:
            raise ValueError(f"timeout must be positive, got {timeout}")
        self.base_url = base_url.rstrip("/")
        self.timeout = timeout
        self.retry = RetryPolicy(attempts=max(1, retries), backoff=backoff)
        self.clock = clock
        self.session = session or requests.Session()

    # -- plumbing -----------------------------------------------------------------------------------------

    def _url(self, *parts: str) -> str:
        return self.base_url + "/api/v1/" + "/".join(quote(part, safe="") for part in parts)

    def _call(
        self, method: str, url: str, body: Mapping[str, Any] | None = None, idempotency_key: str | None = None
    ) -> HttpAnswer:
        headers = {"Accept": "application/json"}
        if idempotency_key is not None:
            headers["Idempotency-Key"] = idempotency_key
        return request_with_retry(
            self.session,
            method,
            url,
            clock=self.clock,
            timeout=self.timeout,
            # Reads retry here; a mutation makes one attempt (the dispatcher alone retries actions).
            retry=self.retry if method == "GET" else RetryPolicy(attempts=1),
            json_body=dict(body) if body is not None else None,
            headers=headers,
        )

    def _read(self, *parts: str) -> Any:
        answer = self._call("GET", self._url(*parts))
        if not answer.ok:
            raise TierError(answer.error or "tier read failed", transient=answer.transient)
        return answer.body

    @staticmethod
    def _failed(answer: HttpAnswer, what: str) -> ActionOutcome:
        detail: dict[str, Any] = {"http_status": answer.status}
        if answer.status == 409:
            # e.g. "no earlier good revision": the tier refused on purpose; retrying cannot help.
            return ActionOutcome(OutcomeStatus.FAILED, detail, f"{what} refused: {answer.server_message()}", False)
        return ActionOutcome(OutcomeStatus.FAILED, detail, f"{what} failed: {answer.error}", answer.transient)

    @staticmethod
    def _answer_detail(answer: HttpAnswer) -> dict[str, Any]:
        detail: dict[str, Any] = dict(answer.body) if isinstance(answer.body, Mapping) else {}
        detail["replayed"] = bool(detail.get("replayed", False))
        return detail

    # -- reads --------------------------------------------------------------------------------------------

    def healthy(self) -> bool:
        answer = request_with_retry(
            self.session,
            "GET",
            self.base_url + "/healthz",
            clock=self.clock,
            timeout=self.timeout,
            retry=RetryPolicy(attempts=1),
        )
        return answer.ok

    def services(self) -> list[dict[str, Any]]:
        body = self._read("services")
        return list(body) if isinstance(body, list) else []

    def service(self, service: str) -> dict[str, Any]:
        body = self._read("services", service)
        if not isinstance(body, Mapping):
            raise TierError(
                f"GET {redact_url(self._url('services', service))}: expected a JSON object", transient=False
            )
        return dict(body)

    def revisions(self, service: str) -> list[dict[str, Any]]:
        body = self._read("services", service, "revisions")
        return list(body) if isinstance(body, list) else []

    def replicas(self, service: str) -> int:
        body = self.service(service)
        replicas = body.get("replicas")
        if not isinstance(replicas, int) or isinstance(replicas, bool):
            raise TierError(f"service {service!r}: 'replicas' is {replicas!r}, expected an integer", transient=False)
        return replicas

    def weights(self, service: str) -> dict[str, int]:
        body = self.service(service)
        return {str(v["version"]): int(v.get("weight", 0)) for v in body.get("versions", []) if "version" in v}

    # -- RollbackPort and ScalePort ------------------------------------------------------------------------

    def plan_rollback(self, service: str, *, rollout_revision: str | None = None) -> RollbackPlan | ActionOutcome:
        """The active revision and the newest good one before it (the tier's own record of bad revisions)."""
        try:
            active = self.service(service).get("active_revision")
            revisions = self.revisions(service)
        except TierError as failed:
            return ActionOutcome(OutcomeStatus.FAILED, {"service": service}, f"rollback of {service!r}: {failed}",
                                 failed.transient)  # fmt: skip
        if not isinstance(active, int):
            return ActionOutcome(OutcomeStatus.FAILED, {"service": service}, f"service {service!r}: no active revision")
        earlier = [
            int(r["revision"])
            for r in revisions
            if isinstance(r.get("revision"), int) and r["revision"] < active and not r.get("bad")
        ]
        if not earlier:
            return ActionOutcome(
                OutcomeStatus.FAILED, {"service": service}, f"service {service!r} has no good revision before r{active}"
            )
        return RollbackPlan(service=service, from_revision=active, to_revision=max(earlier))

    def rollback(self, request: RollbackRequest, abort: AbortSignal | None = None) -> ActionOutcome:
        # The tier keeps its own record of bad revisions and rolls back to its last good one; with a plan, to the
        # planned revision, and only from the planned one (a resume acts against what the tier shows).
        service, idempotency_key, plan = request.service, request.idempotency_key, request.plan
        body: dict[str, Any] = {"idempotency_key": idempotency_key, "to_revision": None, "reason": None}
        if plan is not None and "to_revision" in plan.model_fields_set:
            try:
                active = self.service(service).get("active_revision")
            except TierError as failed:
                return ActionOutcome(OutcomeStatus.FAILED, {"service": service}, f"rollback of {service!r}: {failed}",
                                     failed.transient)  # fmt: skip
            source, target = plan.from_revision, plan.to_revision
            detail = {"from_revision": source, "to_revision": target}
            if active == target:
                return ActionOutcome(OutcomeStatus.SUCCEEDED, {**detail, "already_done": True, "replayed": True})
            if active != source:
                reason = f"changed by someone else since the plan: the tier runs r{active}; not rolled back"
                return ActionOutcome(
                    OutcomeStatus.WORLD_CHANGED, {**detail, "replayed": False, "reason": reason}, reason
                )
            body["to_revision"] = target
        answer = self._call("POST", self._url("services", service, "rollback"), body, idempotency_key)
        if not answer.ok:
            return self._failed(answer, f"rollback of {service!r}")
        detail = self._answer_detail(answer)
        log.info(
            "rolled back %s: revision %s -> %s (replayed=%s)",
            service,
            detail.get("from_revision"),
            detail.get("to_revision"),
            detail["replayed"],
        )
        return ActionOutcome(OutcomeStatus.SUCCEEDED, detail)

    def scale_target(self, replicas: int) -> dict[str, int]:
        """A scale sets the tier's replica count (ScalePort)."""
        return {"replicas": replicas}

    def set_replicas(self, request: ScaleRequest) -> ActionOutcome:
        service, replicas, idempotency_key = request.service, request.replicas, request.idempotency_key
        body = {"replicas": replicas, "idempotency_key": idempotency_key}
        answer = self._call("POST", self._url("services", service, "scale"), body, idempotency_key)
        if not answer.ok:
            return self._failed(answer, f"scale of {service!r} to {replicas}")
        return ActionOutcome(OutcomeStatus.SUCCEEDED, self._answer_detail(answer))

    def scale_state(self, service: str) -> ScaleState:
        """What a scale changes on the tier: the primary version's replica count."""
        return ScaleState(replicas=self.replicas(service))

    def restore_scale(
        self,
        service: str,
        state: ScaleState,
        *,
        expected: ScaleState | None,
        idempotency_key: str,
    ) -> ActionOutcome:
        """Set the replica count of `state`; SKIPPED without a write when the tier does not show `expected`."""
        wanted = int(state.replicas or 0)
        try:
            current = self.replicas(service)
        except TierError as exc:
            return ActionOutcome(OutcomeStatus.FAILED, {}, f"reading the replicas of {service!r}: {exc}", exc.transient)
        detail: dict[str, Any] = {"from": {"replicas": current}, "to": {"replicas": wanted}}
        if current == wanted:
            return ActionOutcome(OutcomeStatus.SKIPPED, {**detail, "reason": "already so"})
        if expected is not None and int(expected.replicas or 0) != current:
            seen = int(expected.replicas or 0)
            reason = f"changed by someone else since tailguard set {seen} replicas: found {current}; not overwritten"
            return ActionOutcome(OutcomeStatus.SKIPPED, {**detail, "reason": reason})
        outcome = self.set_replicas(ScaleRequest(service, wanted, idempotency_key))
        return ActionOutcome(outcome.status, {**detail, **outcome.detail}, outcome.error, outcome.transient)

    # -- TrafficRouter ------------------------------------------------------------------------------------

    def set_weights(
        self,
        service: str,
        weights: Mapping[str, int],
        *,
        expected: Mapping[str, int] | None,
        idempotency_key: str,
        abort: AbortSignal | None = None,
    ) -> ActionOutcome:
        """Every version's weight at once (the tier's `{"weights": ...}` form), then verified; SKIPPED without a
        write when the tier does not show `expected` (changed by someone else) or already shows `weights`."""
        wanted = {str(version): int(weight) for version, weight in weights.items()}
        try:
            current = self.weights(service)
        except TierError as exc:
            return ActionOutcome(OutcomeStatus.FAILED, {}, f"reading the weights of {service!r}: {exc}", exc.transient)
        detail: dict[str, Any] = {"from": current, "to": wanted}
        if current == wanted:
            return ActionOutcome(OutcomeStatus.SKIPPED, {**detail, "reason": "already so"})
        if expected is not None and current != dict(expected):
            reason = f"changed by someone else since tailguard set {dict(expected)}: found {current}; not overwritten"
            return ActionOutcome(OutcomeStatus.SKIPPED, {**detail, "reason": reason})
        body = {"weights": wanted, "idempotency_key": idempotency_key}
        answer = self._call("POST", self._url("services", service, "weights"), body, idempotency_key)
        if not answer.ok:
            return self._failed(answer, f"weights of {service!r} to {wanted}")
        detail.update(self._answer_detail(answer))
        try:
            verified = self.weights(service)
        except TierError as exc:
            return ActionOutcome(
                OutcomeStatus.FAILED, detail, f"weights of {service!r} set but not verified: {exc}", exc.transient
            )
        detail["verified"] = verified == wanted
        if verified != wanted and not detail["replayed"]:
            return ActionOutcome(
                OutcomeStatus.FAILED, detail, f"weights of {service!r}: asked for {wanted}, the tier reports {verified}"
            )
        return ActionOutcome(OutcomeStatus.SUCCEEDED, detail)

    def set_weight(self, request: TrafficRequest, abort: AbortSignal | None = None) -> ActionOutcome:
        service, version, weight = request.service, request.version, request.weight
        idempotency_key = request.idempotency_key
        body = {"version": version, "weight": weight, "idempotency_key": idempotency_key}
        answer = self._call("POST", self._url("services", service, "weights"), body, idempotency_key)
        if not answer.ok:
            return self._failed(answer, f"weight of {service!r} {version!r} to {weight}%")
        detail = self._answer_detail(answer)
        try:
            current = self.weights(service).get(version)
        except TierError as exc:
            return ActionOutcome(
                OutcomeStatus.FAILED,
                detail,
                f"weight of {service!r} {version!r} set but not verified: {exc}",
                exc.transient,
            )
        detail["verified_weight"] = current
        if current != weight:
            if detail["replayed"]:
                # A replayed key means this change was made earlier; a later action may have moved it since.
                detail["verified"] = False
                return ActionOutcome(OutcomeStatus.SUCCEEDED, detail)
            return ActionOutcome(
                OutcomeStatus.FAILED,
                detail,
                f"weight of {service!r} {version!r}: asked for {weight}%, the tier reports {current}%",
                False,
            )
        detail["verified"] = True
        return ActionOutcome(OutcomeStatus.SUCCEEDED, detail)
