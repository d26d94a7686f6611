"""The incident reconciler: the glue between the loop and the incident model (controller/core/incidents.py).

`IncidentKeeper` reads each incident and its service's ledger from the store (SQLite in the journal, or the
`TailguardIncident` resources of the cluster: controller/adapters/incidents/), applies one pure transition and
writes it back with a compare-and-set; on a conflict (another replica, or another thread, wrote since the read)
it reads again and re-decides, so it is level-triggered: whatever replica owns the service acts from what the
store says, never from what it remembers.

It meets the loop at the ports (controller/loop/incident_ports.py), so the dispatcher and the controller class
stay as they are.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from tailguard.controller.core import incidents as model
from tailguard.controller.core.actions import ActionRequest, ActionType, AnnotateAction, NotifyAction
from tailguard.controller.core.attribution import attribution_of
from tailguard.controller.core.engine import Phase, PolicyState, render_actions
from tailguard.controller.core.incidents import Firing, Incident, IncidentConflict, Ledger, TakenAction
from tailguard.controller.core.model import Decision, DecisionKind, target_key
from tailguard.controller.core.policy import Escalation, EscalationStep, Policy
from tailguard.controller.core.ports import (
    ActionOutcome,
    Clock,
    IncidentStorePort,
)
from tailguard.controller.kit.templating import render_text

log = logging.getLogger(__name__)

CONFLICT_RETRIES = 5
DEFAULT_ESCALATION = Escalation()

Update = Callable[[Incident | None, Ledger], tuple[Incident, Ledger] | None]


@dataclass(frozen=True)
class EscalationDecision(Decision):
    """A step of an incident's ladder, dispatched as a decision: its JSON names the incident, step and severity
    (the notification's payload carries them)."""

    incident: str = ""
    step: str = ""
    severity: str = ""

    def to_json(self) -> dict[str, Any]:
        body = super().to_json()
        body["incident"] = self.incident
        body["escalation"] = {"step": self.step, "severity": self.severity}
        return body


class IncidentKeeper:
    def __init__(
        self,
        store: IncidentStorePort,
        clock: Clock,
        policies: Callable[[], Mapping[str, Policy]] | None = None,
    ) -> None:
        self.store = store
        self.clock = clock
        self._policies = policies
        self._lock = threading.RLock()

    def bind(self, policies: Callable[[], Mapping[str, Policy]]) -> None:
        """The loaded policies (the controller's), for their escalation ladders."""
        self._policies = policies

    # -- the store, compare-and-set -------------------------------------------------------------------------

    def _update(self, scope: Mapping[str, str], service: str, change: Update) -> Incident | None:
        """Read the scope's open incident and the service's ledger, apply `change`, write with a compare-and-set;
        on a conflict read again (another writer came first) and re-decide."""
        key = model.scope_key(scope)
        with self._lock:
            for _ in range(CONFLICT_RETRIES):
                found = self.store.current(key)
                incident, ledger = found if found is not None else (None, self.store.ledger(service))
                changed = change(incident, ledger)
                if changed is None:
                    return incident
                try:
                    return self.store.save(*changed)
                except IncidentConflict as exc:
                    log.info("incident of %s changed under us (%s); reading it again", key, exc)
            raise IncidentConflict(f"incident of {key}: {CONFLICT_RETRIES} conflicting writes in a row")

    def open_for_service(self, service: str) -> Incident | None:
        return self.store.latest(service, open_only=True)

    def ledger(self, service: str) -> Ledger:
        return self.store.ledger(service)

    def incidents(self, *, open_only: bool = True, limit: int = 50) -> list[Incident]:
        return self.store.incidents(open_only=open_only, limit=limit)

    # -- decisions ------------------------------------------------------------------------------------------

    def on_decision(self, decision: Decision) -> None:
        if isinstance(decision, EscalationDecision):
            return
        scope = model.scope_of(decision.target)
        service = model.service_of(scope)
        if decision.kind is DecisionKind.FIRE:
            rollout = attribution_of(decision.to_json())
            firing = Firing(
                policy=decision.policy,
                condition=decision.condition,
                decision_id=decision.id,
                at=decision.at,
                value=decision.value,
                threshold=decision.threshold,
                evidence=decision.evidence,
                cause=rollout.revision if rollout is not None else None,
            )

            def join(incident: Incident | None, ledger: Ledger) -> tuple[Incident, Ledger] | None:
                joined = model.open_or_join(incident, scope, firing)
                return None if joined == incident else (joined, ledger)

            self._update(scope, service, join)
        elif decision.kind is DecisionKind.RESOLVE:

            def recover(incident: Incident | None, ledger: Ledger) -> tuple[Incident, Ledger] | None:
                if incident is None:
                    return None
                running = _running_revision(incident)
                done = model.recover(incident, decision.policy, self.clock.now(), ledger, running)
                return None if done == (incident, ledger) else done

            self._update(scope, service, recover)

    # -- rollbacks ------------------------------------------------------------------------------------------

    def rollback_refusal(self, service: str, plan: Mapping[str, Any]) -> str | None:
        incident = self.open_for_service(service)
        refusal = model.rollback_refusal(incident, self.store.ledger(service), plan)
        if refusal is not None and incident is not None:
            self.note(service, f"rollback {plan.get('from_revision')} -> {plan.get('to_revision')} refused: {refusal}")
            if incident.last_action() is None:
                # Nothing of the incident ran: the refusal is what the ladder answers (a human must choose).
                key = f"refused:{plan.get('from_revision')}->{plan.get('to_revision')}"
                refused = TakenAction(key, "rollback", "", self.clock.now(), "refused", dict(plan), refusal)

                def record(current: Incident | None, ledger: Ledger) -> tuple[Incident, Ledger] | None:
                    if current is None or any(a.key == key for a in current.actions):
                        return None
                    return model.action_ended(current, ledger, refused, 0.0)

                self._update(incident.scope, service, record)
        return refusal

    def rollback_starting(self, service: str, plan: Mapping[str, Any], key: str) -> str | None:
        """Count the rollback in its incident before the port is called (compare-and-set), or say why not. A
        resume of the same action (same key) is admitted again."""
        refusal: list[str] = []
        incident = self.open_for_service(service)
        if incident is None:
            why = model.rollback_refusal(None, self.store.ledger(service), plan)
            return why
        if any(a.key == key for a in incident.rollbacks()):
            return None
        policy = policy_of_key(incident, key)

        def start(current: Incident | None, ledger: Ledger) -> tuple[Incident, Ledger] | None:
            refusal.clear()
            if current is None:
                return None
            why = model.rollback_refusal(current, ledger, plan)
            if why is not None:
                refusal.append(why)
                refused = TakenAction(key, "rollback", policy, self.clock.now(), "refused", dict(plan), why)
                return model.action_ended(current, ledger, refused, 0.0)
            action = TakenAction(key, "rollback", policy, self.clock.now(), "started", dict(plan))
            return model.rollback_started(current, action), ledger

        self._update(incident.scope, service, start)
        return refusal[0] if refusal else None

    def action_ended(self, service: str, key: str, action_type: str, plan: Mapping[str, Any], outcome: ActionOutcome,
                     policy: str = "") -> None:  # fmt: skip
        incident = self.open_for_service(service)
        if incident is None:
            return
        previous = next((a for a in incident.actions if a.key == key), None)
        policy = policy or policy_of_key(incident, key)
        status = outcome.status.value
        reason = outcome.error or str(outcome.detail.get("reason") or "")
        # `at` is when it ended: the verification window starts once the action took effect (a rollback that
        # waited on a sync is verified from the sync's end, not from its request).
        taken = TakenAction(
            key, action_type, policy or (previous.policy if previous else ""), self.clock.now(), status, dict(plan),
            reason,
        )  # fmt: skip
        verify = self.escalation_of(taken.policy).verifyAfter

        def end(current: Incident | None, ledger: Ledger) -> tuple[Incident, Ledger] | None:
            if current is None:
                return None
            return model.action_ended(current, ledger, taken, verify)

        self._update(incident.scope, service, end)

    def note(self, service: str, text: str) -> None:
        """Said in the service's open incident, or in its latest one (a recovery's restore runs after the resolve
        decision ended the incident)."""
        with self._lock:
            for _ in range(CONFLICT_RETRIES):
                latest = self.store.latest(service, open_only=False)
                if latest is None or text in latest.notes:
                    return
                try:
                    self.store.save(model.note(latest, text), self.store.ledger(service))
                    return
                except IncidentConflict as exc:
                    log.info("incident %s changed under us (%s); reading it again", latest.id, exc)

    # -- verification and escalation -----------------------------------------------------------------------

    def escalation_of(self, policy: str) -> Escalation:
        loaded = self._policies() if self._policies is not None else {}
        found = loaded.get(policy)
        return found.escalation if found is not None else DEFAULT_ESCALATION

    def reconcile(self, policy_name: str, state: PolicyState | None) -> list[Decision]:
        """After an evaluation of `policy_name` committed `state`: each open incident of the policy whose last
        action's verification window ended with the breach still held moves one step up its ladder (the step's
        decision is returned, to be dispatched)."""
        if state is None or not any(c.phase is Phase.FIRING for c in state.conditions.values()):
            return []  # nothing of this policy breaches: no incident of it can be due (and no store read)
        loaded = self._policies() if self._policies is not None else {}
        policy = loaded.get(policy_name)
        now = self.clock.now()
        due: list[Decision] = []
        # Level-triggered, per scope this policy breaches on now: its open incident as the store has it.
        scopes = sorted(
            {
                model.scope_key(model.scope_of(target))
                for (_, target), condition in state.conditions.items()
                if condition.phase is Phase.FIRING
            }
        )
        for key in scopes:
            found = self.store.current(key)
            if found is None or policy_name not in found[0].active_policies:
                continue
            incident = found[0]
            holds = True  # the scope is one of the policy's firing targets': its breach holds
            last = incident.last_action()
            owner = last.policy if last is not None and last.policy else policy_name
            spec = self.escalation_of(owner)
            if model.escalation_due(incident, holds, now, spec.verifyAfter) is None:
                continue
            decision = self._escalate(incident, policy, policy_name, spec, now)
            if decision is not None:
                due.append(decision)
        return due

    def _escalate(
        self, incident: Incident, policy: Policy | None, policy_name: str, spec: Escalation, now: float
    ) -> Decision | None:
        steps = _ladder(spec)
        last = incident.last_action() or model.escalation_due(incident, True, now, spec.verifyAfter)
        if incident.stage >= len(steps) or last is None:
            if incident.next_step != "a human: the ladder is exhausted":

                def exhausted(current: Incident | None, ledger: Ledger) -> tuple[Incident, Ledger] | None:
                    if current is None or current.id != incident.id:
                        return None
                    return model.replace_next_step(current, "a human: the ladder is exhausted"), ledger

                self._update(incident.scope, incident.service, exhausted)
            return None
        step = steps[incident.stage]
        following = steps[incident.stage + 1].name if incident.stage + 1 < len(steps) else "a human"
        decision_id = f"{incident.id}.escalation-{incident.stage + 1}"
        what = (
            f"{last.describe()}, the breach holds"
            if last.status == "refused"
            else f"{last.describe()} did not end the breach within {spec.verifyAfter:.0f}s"
        )
        text = (
            f"incident {incident.id} on {incident.service}: {what}; escalation step {incident.stage + 1} "
            f"({step.name}, severity {step.severity.value}); next: {following}"
        )
        firing = next((f for f in incident.fired if f.policy == policy_name), incident.fired[0])
        target = target_key(incident.scope)
        actions = [*step.actions, AnnotateAction(type="annotate", text=text, tags=["escalation", step.severity.value])]
        if policy is not None:
            condition = next((c for c in policy.conditions if c.name == firing.condition), policy.conditions[0])
            try:
                rendered = render_actions(
                    policy, condition, actions, target, kind=DecisionKind.FIRE, incident=decision_id,
                    value=firing.value, threshold=firing.threshold, onset=incident.opened_at,
                    extra_variables={"incident": incident.id, "severity": step.severity.value, "step": step.name,
                                     "escalation": text},
                )  # fmt: skip
            except KeyError as exc:
                log.warning("escalation step %s of %s: unknown variable %s; sent as written", step.name, incident.id,
                            exc)  # fmt: skip
                rendered = _unrendered(actions, decision_id, {"incident": incident.id, "escalation": text})
        else:
            rendered = _unrendered(actions, decision_id, {"incident": incident.id, "escalation": text})
        decision = EscalationDecision(
            id=decision_id,
            kind=DecisionKind.FIRE,
            policy=policy_name,
            condition=firing.condition,
            target=target,
            onset=incident.opened_at,
            at=now,
            fired_at=now,
            resolved_at=None,
            value=firing.value,
            threshold=firing.threshold,
            evidence=firing.evidence,
            actions=rendered,
            dry_run=policy.dryRun if policy is not None else False,
            reason=text,
            incident=incident.id,
            step=step.name,
            severity=step.severity.value,
        )

        def climb(current: Incident | None, ledger: Ledger) -> tuple[Incident, Ledger] | None:
            if current is None or current.id != incident.id or current.stage != incident.stage:
                return None  # another replica climbed first: its step stands
            return model.escalated(current, step.name, now, decision_id, f"verify, then {following}"), ledger

        climbed = self._update(incident.scope, incident.service, climb)
        if climbed is None or climbed.stage != incident.stage + 1:
            return None
        log.warning("%s", text)
        return decision

    def undone(self, service: str) -> frozenset[str]:
        return model.undone_rollouts(self.store.ledger(service))


def policy_of_key(incident: Incident, key: str) -> str:
    """The policy of an action of the incident, from its idempotency key (`{decision_id}:{kind}:{index}`)."""
    decision = key.split(":", 1)[0]
    return next((f.policy for f in incident.fired if f.decision_id == decision), "")


def _ladder(spec: Escalation) -> list[EscalationStep]:
    if spec.steps:
        return list(spec.steps)
    message = "{{ escalation }}"
    return [
        EscalationStep(
            name="notify-oncall",
            actions=[NotifyAction(type="notify", receiver=spec.receiver, message=message)],
        )
    ]


def _unrendered(actions: Sequence[Any], decision_id: str, variables: Mapping[str, str]) -> tuple[ActionRequest, ...]:
    """The step's actions without the policy (it was unloaded): only the incident's own variables are filled in."""

    def fill(value: Any) -> Any:
        if not isinstance(value, str):
            return value
        try:
            return render_text(value, variables)
        except KeyError:
            return value  # a variable only the policy knows: sent as written

    return tuple(
        ActionRequest.of(
            ActionType(action.type),
            {k: fill(v) for k, v in action.model_dump(exclude_none=True).items() if k != "type"},
            f"{decision_id}:fire:{index}",
        )
        for index, action in enumerate(actions)
    )


def _running_revision(incident: Incident) -> str | None:
    """What the incident last deployed: its latest succeeded rollback's target (None: it did not roll back)."""
    for action in reversed(incident.actions):
        if action.type == "rollback" and action.status == "succeeded" and action.plan.get("to_revision") is not None:
            return str(action.plan["to_revision"])
    return None
