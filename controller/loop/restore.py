"""Exact undo: what each change replaced, and what a `restore` puts back (the dispatcher's restore path).

A change (a `scale` or a `shift_traffic`) journals, in its plan and BEFORE it acts, the state it replaced: the
route's weights of every version (`traffic`), or everything a scale may change (`scale`: an HPA's minReplicas,
maxReplicas and metric targets plus the replica count; the local tier's replicas). After it succeeds, the state it
left is read back and kept in its result (`after`). Each change also names its *episode* (plan `episode`): the
time of the first change of a run of changes to that resource while some incident that made them is still active
(an incident is active until its condition resolves: the journal has its resolve decision). A change made when no
incident of the latest episode is active starts a new one.

A `restore` (a recovery action) of incident X on a service, per kind of state (traffic, scale) X changed:

* the chain: every successful change of that kind on the service since the earliest episode of X's changes;
* the latest change in it by another incident still active holds the resource: if it is the last change, the
  restore writes nothing (skipped: that incident's own restore will put the resource back); otherwise the target
  is the state replaced by the change right after it; with no other incident active the target is the state
  before the chain's first change, the pre-incident baseline;
* the expected state is what tailguard's latest write of that kind left (a change's or a restore's `after`); the
  port writes only if the resource still shows it (otherwise: skipped, "changed by someone else").

So two incidents on one resource, restored in either order, end at the baseline, and a restore never sets more
than was there before the incident. The plan is journaled before the first write, so a resume restores the same.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping, Sequence
from typing import Any

from tailguard.controller.core.actions import RESTORABLE_ACTIONS, ActionRecord, ActionStatus, ActionType
from tailguard.controller.core.model import DecisionKind
from tailguard.controller.core.ports import (
    AbortSignal,
    ActionJournalPort,
    ActionOutcome,
    OutcomeStatus,
    ScalePort,
    ScaleState,
    TrafficRouter,
)

log = logging.getLogger(__name__)

TRAFFIC = "traffic"
SCALE = "scale"
KINDS = (TRAFFIC, SCALE)
KIND_OF = {ActionType.SHIFT_TRAFFIC: TRAFFIC, ActionType.SCALE: SCALE}


def read_state(kind: str, service: str, router: TrafficRouter, scale: ScalePort) -> dict[str, Any] | None:
    """The current state of one kind (None, logged, when it cannot be read: the change still runs)."""
    try:
        if kind == TRAFFIC:
            return {str(version): int(weight) for version, weight in router.weights(service).items()}
        return dict(scale.scale_state(service).to_json())
    except Exception as exc:  # noqa: BLE001 - a failed read must not stop a change; its restore will say why
        log.warning("could not read the %s state of %s before or after a change: %s", kind, service, exc)
        return None


def change_plan(
    journal: ActionJournalPort, record: ActionRecord, router: TrafficRouter, scale: ScalePort, now: float
) -> dict[str, Any]:
    """What a change journals before it acts: the state it replaces (`before`) and its episode."""
    kind = KIND_OF[record.type]
    service = str(record.params.get("service", record.resource))
    plan: dict[str, Any] = {"episode": _episode_for(journal, record.resource, kind, now)}
    before = read_state(kind, service, router, scale)
    if before is not None:
        plan["before"] = before
    return plan


def after_state(record: ActionRecord, router: TrafficRouter, scale: ScalePort) -> dict[str, Any]:
    """What a successful change or restore left, per kind it wrote (kept in its result as `after`)."""
    service = str(record.params.get("service", record.resource))
    if record.type in KIND_OF:
        kinds: Sequence[str] = (KIND_OF[record.type],)
    else:
        kinds = [kind for kind in KINDS if "target" in ((record.plan or {}).get(kind) or {})]
    return {kind: state for kind in kinds if (state := read_state(kind, service, router, scale)) is not None}


def restore_plan(journal: ActionJournalPort, record: ActionRecord) -> dict[str, Any]:
    """Per kind the incident changed: the `target` and `expected` states, or why nothing is written (`skip`)."""
    plan: dict[str, Any] = {"service": str(record.params.get("service", record.resource))}
    mine = [
        action
        for action in journal.actions_for(record.decision_id)
        if action.decision_kind == DecisionKind.FIRE.value and action.resource == record.resource and _change(action)
    ]
    for kind in KINDS:
        own = [action for action in mine if KIND_OF[action.type] == kind]
        if not own:
            continue
        since = min(_episode(action) for action in own)
        chain = _changes(journal, record.resource, kind, since)
        held = [
            i for i, change in enumerate(chain) if change.decision_id != record.decision_id and _active(journal, change)
        ]
        if held and held[-1] == len(chain) - 1:
            holder = chain[-1]
            plan[kind] = {
                "skip": f"incident {holder.decision_id} of policy {holder.policy!r} changed it last and is still "
                "active: its restore puts it back"
            }
            continue
        first = held[-1] + 1 if held else 0
        expected = _last_written(journal, record.resource, kind, since, chain)
        if expected is None:
            plan[kind] = {"skip": "the state tailguard's last change left is unknown (it was not read back)"}
            continue
        plan[kind] = {
            "target": (chain[first].plan or {})["before"],  # a change in the chain journaled it
            "expected": expected,
            "undoes": [change.idempotency_key for change in chain[first:]],
        }
    return plan


def run_restore(
    plan: Mapping[str, Any],
    router: TrafficRouter,
    scale: ScalePort,
    *,
    idempotency_key: str,
    abort: AbortSignal | None = None,
) -> ActionOutcome:
    """One attempt: each planned kind through its port (keys `{key}#traffic`, `{key}#scale`), one outcome. An
    abort stops a ramped traffic restore before its next step, and any kind not yet begun (ABORTED)."""
    service = str(plan["service"])
    parts: dict[str, Any] = {}
    outcomes: list[ActionOutcome] = []
    for kind in KINDS:
        entry = plan.get(kind)
        if not isinstance(entry, Mapping):
            continue
        request = abort.requested() if abort is not None else None
        if request is not None and "skip" not in entry:
            parts[kind] = {"status": OutcomeStatus.ABORTED.value, "reason": f"not begun: {request.phrase()}"}
            outcomes.append(ActionOutcome(OutcomeStatus.ABORTED, {"reason": parts[kind]["reason"]}))
            continue
        if "skip" in entry:
            parts[kind] = {"status": OutcomeStatus.SKIPPED.value, "reason": entry["skip"]}
            outcomes.append(ActionOutcome(OutcomeStatus.SKIPPED, {"reason": entry["skip"]}))
            continue
        key = f"{idempotency_key}#{kind}"
        if kind == TRAFFIC:
            outcome = router.set_weights(
                service, entry["target"], expected=entry["expected"], idempotency_key=key, abort=abort
            )
        else:
            target = ScaleState.from_json(entry["target"])
            expected = ScaleState.from_json(entry["expected"]) if entry["expected"] is not None else None
            outcome = scale.restore_scale(service, target, expected=expected, idempotency_key=key)
        parts[kind] = outcome.to_json()
        outcomes.append(outcome)
    detail: dict[str, Any] = {"service": service, **parts}
    if not outcomes:
        reason = f"the incident changed nothing of {service!r} that a restore puts back"
        return ActionOutcome(OutcomeStatus.SKIPPED, {**detail, "reason": reason})
    if any(outcome.status is OutcomeStatus.ABORTED for outcome in outcomes):
        error = "; ".join(f"{kind}: {part.get('status')}" for kind, part in parts.items())
        return ActionOutcome(OutcomeStatus.ABORTED, detail, f"restore of {service!r} aborted ({error})")
    failed = [outcome for outcome in outcomes if outcome.status is OutcomeStatus.FAILED]
    if failed:
        error = "; ".join(str(outcome.error) for outcome in failed)
        return ActionOutcome(OutcomeStatus.FAILED, detail, error, all(outcome.transient for outcome in failed))
    if any(outcome.status is OutcomeStatus.SUCCEEDED for outcome in outcomes):
        return ActionOutcome(OutcomeStatus.SUCCEEDED, detail)
    reasons = "; ".join(
        f"{kind}: {part.get('reason') or part.get('detail', {}).get('reason')}" for kind, part in parts.items()
    )
    return ActionOutcome(OutcomeStatus.SKIPPED, {**detail, "reason": reasons})


# ----- the journal's view --------------------------------------------------------------------------------


def _change(action: ActionRecord) -> bool:
    """A change a restore can undo: it succeeded and journaled the state it replaced."""
    return (
        action.type in RESTORABLE_ACTIONS
        and action.status is ActionStatus.SUCCEEDED
        and action.plan is not None
        and action.plan.get("before") is not None
    )


def _episode(action: ActionRecord) -> float:
    assert action.plan is not None
    return float(action.plan.get("episode", action.started_at or 0.0))


def _active(journal: ActionJournalPort, action: ActionRecord) -> bool:
    """The incident that made `action` has not resolved (the journal has no resolve decision for it)."""
    return journal.decision(action.decision_id, DecisionKind.RESOLVE.value) is None


def _changes(journal: ActionJournalPort, resource: str, kind: str, since: float) -> list[ActionRecord]:
    return [
        action for action in journal.actions_since(resource, since) if _change(action) and KIND_OF[action.type] == kind
    ]


def _episode_for(journal: ActionJournalPort, resource: str, kind: str, now: float) -> float:
    """The episode a change made now joins: the latest one while an incident of it is active, else a new one."""
    changes = _changes(journal, resource, kind, 0.0)
    if not changes:
        return now
    since = _episode(changes[-1])
    if any(_active(journal, change) for change in changes if (change.started_at or 0.0) >= since):
        return since
    return now


def _last_written(
    journal: ActionJournalPort, resource: str, kind: str, since: float, chain: Sequence[ActionRecord]
) -> Any:
    """What tailguard's latest write of `kind` on `resource` left (a change's or a restore's `after`)."""
    restores = [
        action
        for action in journal.actions_since(resource, since)
        if action.type is ActionType.RESTORE
        and action.status is ActionStatus.SUCCEEDED
        and ((action.result or {}).get("after") or {}).get(kind) is not None
    ]
    writes = sorted([*chain, *restores], key=lambda action: (action.started_at or 0.0, action.finished_at or 0.0))
    if not writes:
        return None
    return ((writes[-1].result or {}).get("after") or {}).get(kind)


def truthful_annotation(actions: Sequence[ActionRecord], record: ActionRecord, text: str) -> str:
    """The text of an annotate action of a recovery whose restore was skipped because someone changed the object:
    what was found, not the policy's "back to the pre-incident floor" (`actions`: the journal's for the decision)."""
    skipped = [
        action
        for action in actions
        if action.decision_kind == record.decision_kind
        and action.type is ActionType.RESTORE
        and action.status is ActionStatus.SKIPPED
    ]
    notes = []
    for action in skipped:
        detail = (action.result or {}).get("detail") or {}
        reason = str(detail.get("reason") or action.error or "")
        if "someone else" in reason:
            notes.append(f"restore of {action.resource} skipped, nothing put back: {reason}")
    if not notes:
        return text
    head = text.split(": ", 1)[0]
    return f"{head}: " + "; ".join(notes)
