"""The running policy set: what is loaded, each policy's engine state, and reload as a diff of two sets.

Policies are reloaded when their files change, as a diff of the policy sets (added, removed, updated:
`diff_policies`). A reload with any error keeps the last good set running: an SRE's typo must never switch
the controller off. An empty policy set (every file removed, no policy left) is such an error too, never a
silent stop. The signal queries of added and updated policies are checked once against the metrics source
before they are applied: a query the source refuses as bad data (a PromQL error) is a reload error for that
policy only, which keeps its last good version (or, for a new policy, is not loaded) while the rest applies.
At run time a refused query is a policy error: listed on /readyz (`policy_errors`) and in
tailguard_policy_errors{policy}.

What a diff does to the rest: an added policy's state is read from the journal; a removed policy's state,
evaluation times, run-time errors and health readings are dropped (its metrics series too); an updated policy
loses the state of the conditions it no longer has. What the scheduler and the dispatcher do about it is the
caller's (controller/loop/runtime.py), from the names the ReloadOutcome lists.
"""

from __future__ import annotations

import hashlib
import logging
import threading
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import NamedTuple

from tailguard.controller.core.engine import PolicyState, action_retention
from tailguard.controller.core.handover import ActionTimes, merge_action_times
from tailguard.controller.core.limits import BUDGET_WINDOW_SECONDS
from tailguard.controller.core.model import TargetKey
from tailguard.controller.core.policy import Policy
from tailguard.controller.core.policy_files import LoadedPolicy, PolicyError, load_policies, policy_paths
from tailguard.controller.core.ports import Clock, JournalPort, MetricsSource
from tailguard.controller.core.signals import refused_queries
from tailguard.controller.kit.errors import ConfigError
from tailguard.controller.loop.health import SourceHealthTracker
from tailguard.controller.loop.metrics import ControllerMetrics

logger = logging.getLogger("tailguard.controller")

# What the configuration refuses in a loaded set (e.g. an action no actuator can run).
PolicyCheck = Callable[[Sequence[LoadedPolicy]], Sequence[PolicyError]]


class PolicyLoadError(ConfigError):
    """The initial policy set has errors; the controller refuses to start on a broken set."""

    def __init__(self, errors: Sequence[PolicyError]):
        super().__init__("; ".join(str(error) for error in errors))
        self.errors = list(errors)


@dataclass(frozen=True)
class ReloadOutcome:
    changed: bool
    applied: bool
    errors: tuple[PolicyError, ...] = ()
    added: tuple[str, ...] = ()
    removed: tuple[str, ...] = ()
    updated: tuple[str, ...] = ()


class PolicyDiff(NamedTuple):
    """How a new policy set differs from the running one, by policy name (each list sorted)."""

    added: list[str]
    removed: list[str]
    updated: list[str]  # in both sets, the policy changed


def diff_policies(old: Mapping[str, LoadedPolicy], new: Mapping[str, LoadedPolicy]) -> PolicyDiff:
    return PolicyDiff(
        added=sorted(set(new) - set(old)),
        removed=sorted(set(old) - set(new)),
        updated=sorted(name for name in set(new) & set(old) if new[name].policy != old[name].policy),
    )


def files_fingerprint(paths: Sequence[Path]) -> tuple[tuple[str, str], ...]:
    """What the policy files hold now: the file list and a hash of each (an unreadable file is its error)."""
    entries: list[tuple[str, str]] = []
    for path in policy_paths(paths):
        try:
            with open(path, "rb") as handle:  # streamed: an oversized file is refused by the loader, not read here
                entries.append((str(path), hashlib.file_digest(handle, "sha256").hexdigest()))
        except OSError as unreadable:
            entries.append((str(path), f"unreadable: {unreadable.strerror or unreadable}"))
    return tuple(entries)


@dataclass(frozen=True)
class EvaluationInput:
    """What one evaluation of a policy starts from, read together."""

    loaded: LoadedPolicy
    state: PolicyState
    # Action times a previous leader handed over, not yet merged into the state (None: none).
    inherited: dict[TargetKey, tuple[float, ...]] | None


@dataclass(frozen=True)
class ReadinessView:
    """What /readyz needs of the policy set, read together."""

    intervals: dict[str, float]  # loaded policy -> its interval, sorted by name
    last_evaluation: dict[str, float | None]
    reload_errors: tuple[str, ...]
    policy_errors: tuple[str, ...]  # "policy P: signal S: ..."


class PolicySet:
    """The loaded policies and their engine state; `load` once, then `reload` installs what changed."""

    def __init__(
        self,
        paths: Sequence[str | Path],
        *,
        source: MetricsSource,
        journal: JournalPort,
        clock: Clock,
        metrics: ControllerMetrics,
        health: SourceHealthTracker,
        dry_run: bool | None = None,
        policy_check: PolicyCheck | None = None,
    ) -> None:
        self._paths = [Path(p) for p in paths]
        # On a reload a check error is the same as a file error, so the last good set keeps running.
        self._policy_check = policy_check
        self._dry_run = dry_run
        self._source = source  # the query check of added and updated policies
        self._journal = journal  # an added policy's state
        self._clock = clock
        self._metrics = metrics
        self._health = health
        self._lock = threading.Lock()  # guards the fields below, never held during an evaluation or a query
        self._policies: dict[str, LoadedPolicy] = {}
        self._states: dict[str, PolicyState] = {}
        self._loaded_at: dict[str, float] = {}
        self._last_evaluation: dict[str, float] = {}
        self._fingerprint: tuple[tuple[str, str], ...] = ()
        self._reload_errors: list[PolicyError] = []
        # Run-time policy errors by policy (a query the source refused as bad data at its last evaluation).
        self._policy_errors: dict[str, tuple[str, ...]] = {}
        # Action times a previous leader handed over (policy -> target -> times), until an evaluation of that
        # policy has merged them into its state (and journal).
        self._inherited: dict[str, dict[TargetKey, tuple[float, ...]]] = {}
        self._closed = False
        # One reload at a time; the query check of a reload talks to the source outside self._lock.
        self._reload_lock = threading.Lock()

    # ----- reads -----------------------------------------------------------------------------------

    def policies(self) -> dict[str, Policy]:
        with self._lock:
            return {name: loaded.policy for name, loaded in self._policies.items()}

    def names(self) -> set[str]:
        with self._lock:
            return set(self._policies)

    def intervals(self) -> dict[str, float]:
        with self._lock:
            return {name: loaded.policy.interval for name, loaded in self._policies.items()}

    def states(self) -> dict[str, PolicyState]:
        with self._lock:
            return dict(self._states)

    def reload_errors(self) -> list[PolicyError]:
        with self._lock:
            return list(self._reload_errors)

    def readiness_view(self) -> ReadinessView:
        with self._lock:
            return ReadinessView(
                intervals={name: loaded.policy.interval for name, loaded in sorted(self._policies.items())},
                last_evaluation={name: self._last_evaluation.get(name) for name in self._policies},
                reload_errors=tuple(str(error) for error in self._reload_errors),
                policy_errors=tuple(
                    f"policy {name}: signal {error}"
                    for name, errors in sorted(self._policy_errors.items())
                    for error in errors
                ),
            )

    # ----- one evaluation --------------------------------------------------------------------------

    def evaluation_input(self, name: str) -> EvaluationInput | None:
        """The policy, its state and its inherited action times; None when it is not (or no longer) loaded."""
        with self._lock:
            loaded = self._policies.get(name)
            if loaded is None:
                return None
            return EvaluationInput(loaded, self._states.get(name, PolicyState()), self._inherited.get(name))

    def committed(
        self, name: str, state: PolicyState, now: float, inherited: dict[TargetKey, tuple[float, ...]] | None
    ) -> None:
        """An evaluation at `now` committed `state` (with `inherited` merged into it, if any)."""
        with self._lock:
            if name in self._policies:
                self._states[name] = state
                self._last_evaluation[name] = now
                if inherited and self._inherited.get(name) is inherited:
                    del self._inherited[name]  # in the state (and journal) now

    def record_policy_errors(self, name: str, errors: tuple[str, ...]) -> None:
        with self._lock:
            if errors and name in self._policies:
                self._policy_errors[name] = errors
            else:
                self._policy_errors.pop(name, None)

    # ----- handover between leaders (controller/core/handover.py) ---------------------------------------------

    def handover_snapshot(self) -> ActionTimes:
        """The mutating-action times that still count for a cooldown or budget: ours and those not merged yet."""
        now = self._clock.now()
        with self._lock:
            own = {name: state.actions_at for name, state in self._states.items()}
            merged = merge_action_times(own, self._inherited)
            retention = {name: action_retention(loaded.policy) for name, loaded in self._policies.items()}
        # A policy not loaded (yet, or any more) keeps its times as long as the longest loaded one would.
        longest = max([BUDGET_WINDOW_SECONDS, *retention.values()])
        return {
            policy: kept
            for policy, by_target in merged.items()
            if (kept := _recent(by_target, now - retention.get(policy, longest)))
        }

    def inherit_handover(self, times: ActionTimes) -> None:
        """Times read from the Lease (the previous leader's, or our own as published): merged into each policy's
        state by its next evaluation. Idempotent: a time we already count counts once."""
        with self._lock:
            self._inherited = merge_action_times(self._inherited, times)

    # ----- load and reload -------------------------------------------------------------------------

    def load(self) -> list[str]:
        """The first load (errors -> PolicyLoadError); returns the policies loaded, sorted."""
        with self._reload_lock:
            # Parsed outside self._lock, like a reload: /readyz answers (not started) meanwhile.
            fingerprint = files_fingerprint(self._paths)
            loaded, errors = load_policies(self._paths)
            if not errors and self._policy_check is not None:
                errors = list(self._policy_check(loaded))
            if errors:
                raise PolicyLoadError(errors)
            with self._lock:
                self._fingerprint = fingerprint
                return self._apply(self._index(loaded)).added

    def close(self) -> None:
        """No reload applies any more (the controller stopped)."""
        with self._lock:
            self._closed = True

    def reload(self) -> ReloadOutcome:
        """Re-read the policy files if they changed; on any error keep the last good set and report it.

        A set without any policy is an error. Added and updated policies' queries are checked against the source
        first: a refused query keeps that policy's last good version (a new one is not loaded) and is reported.
        """
        with self._reload_lock:
            return self._reload()

    def _reload(self) -> ReloadOutcome:
        fingerprint = files_fingerprint(self._paths)
        with self._lock:
            if self._closed:
                return ReloadOutcome(changed=False, applied=False)
            if fingerprint == self._fingerprint:
                return ReloadOutcome(changed=False, applied=False, errors=tuple(self._reload_errors))
            self._fingerprint = fingerprint
        # Parsing and validating happen outside self._lock (one reload at a time: self._reload_lock), so a large or
        # hostile policy set never holds evaluations, alerts or /readyz; only installing the result takes the lock.
        loaded, errors = load_policies(self._paths)
        if not errors and self._policy_check is not None:
            errors = list(self._policy_check(loaded))
        if not errors and not loaded:
            errors = [self._empty_set_error()]
        with self._lock:
            if self._closed:
                return ReloadOutcome(changed=False, applied=False)
            if errors:
                return self._reject(errors)
            current = dict(self._policies)
        # Outside self._lock: evaluations, alerts and /readyz go on while the source answers.
        checked, refusals = self._check_queries(current, self._index(loaded))
        with self._lock:
            if self._closed:
                return ReloadOutcome(changed=False, applied=False)
            if not checked:
                return self._reject([*refusals, self._empty_set_error()])
            added, removed, updated = self._apply(checked)
            self._reload_errors = list(refusals)
        if refusals:
            self._metrics.reload_errors.inc()
            for error in refusals:
                logger.error("policy reload: a refused query keeps that policy's last good version: %s", error)
        logger.info(
            "policies reloaded: %d loaded; added %s; removed %s; updated %s",
            len(checked),
            ", ".join(added) or "none",
            ", ".join(removed) or "none",
            ", ".join(updated) or "none",
        )
        return ReloadOutcome(
            changed=True,
            applied=True,
            errors=tuple(refusals),
            added=tuple(added),
            removed=tuple(removed),
            updated=tuple(updated),
        )

    def _index(self, loaded: Iterable[LoadedPolicy]) -> dict[str, LoadedPolicy]:
        indexed: dict[str, LoadedPolicy] = {}
        for entry in loaded:
            policy = entry.policy
            if self._dry_run is not None and policy.dryRun != self._dry_run:
                # The controller-wide override (e.g. a dry-run deployment) wins over each policy's own flag.
                policy = policy.model_copy(update={"dryRun": self._dry_run})
            indexed[policy.name] = replace(entry, policy=policy)
        return indexed

    def _apply(self, new: dict[str, LoadedPolicy]) -> PolicyDiff:
        """Install a validated policy set (caller holds self._lock)."""
        old = self._policies
        diff = diff_policies(old, new)
        now = self._clock.now()
        for name in diff.added:
            self._states[name] = self._journal.load_state(name) or PolicyState()
            self._loaded_at[name] = now
        for name in diff.removed:
            self._states.pop(name, None)
            self._policy_errors.pop(name, None)
            self._loaded_at.pop(name, None)
            self._last_evaluation.pop(name, None)
        gone_conditions: dict[str, list[str]] = {
            name: [c.name for c in old[name].policy.conditions] for name in diff.removed
        }
        for name in diff.updated:
            kept = {c.name for c in new[name].policy.conditions}
            gone = [c.name for c in old[name].policy.conditions if c.name not in kept]
            if gone:
                gone_conditions[name] = gone
                state = self._states.get(name, PolicyState())
                # State of a condition that no longer exists would otherwise linger in the journal forever.
                self._states[name] = PolicyState(
                    conditions={key: value for key, value in state.conditions.items() if key[0] in kept},
                    actions_at=state.actions_at,
                    evaluations=state.evaluations,
                    last_evaluated_at=state.last_evaluated_at,
                )
        self._policies = new
        self._metrics.set_policies(
            {name: [c.name for c in loaded.policy.conditions] for name, loaded in new.items()},
            gone_conditions,
        )
        self._metrics.set_intervals({name: loaded.policy.interval for name, loaded in new.items()})
        if diff.removed:
            self._health.keep_policies(new, now)
        return diff

    def _reject(self, errors: Sequence[PolicyError]) -> ReloadOutcome:
        """A reload refused as a whole (caller holds self._lock): the last good set keeps running."""
        self._reload_errors = list(errors)
        self._metrics.reload_errors.inc()
        for error in errors:
            logger.error("policy reload rejected, keeping the last good set: %s", error)
        return ReloadOutcome(changed=True, applied=False, errors=tuple(errors))

    def _empty_set_error(self) -> PolicyError:
        where = ", ".join(str(path) for path in self._paths) or "(no policy paths)"
        return PolicyError(
            where, 1, "", "no policy left: an empty policy set is refused (the last good set keeps running)"
        )

    def _check_queries(
        self, current: Mapping[str, LoadedPolicy], new: Mapping[str, LoadedPolicy]
    ) -> tuple[dict[str, LoadedPolicy], list[PolicyError]]:
        """`new` with every added or updated policy whose query the source refuses (bad data) replaced by its last
        good version (dropped when it has none), and one error per refused query (file:line of the query)."""
        diff = diff_policies(current, new)
        checked = dict(new)
        errors: list[PolicyError] = []
        for name in [*diff.added, *diff.updated]:
            refused = refused_queries(self._source, new[name].policy)
            if not refused:
                continue
            kept = current.get(name)
            outcome = "keeping its last good version" if kept is not None else "not loaded"
            for signal, why in sorted(refused.items()):
                errors.append(
                    PolicyError(
                        new[name].file,
                        new[name].query_line(signal),
                        new[name].query_field(signal),
                        f"Prometheus refuses the query of signal {signal!r} ({why}); policy {name!r} {outcome}",
                    )
                )
            if kept is not None:
                checked[name] = kept
            else:
                del checked[name]
        return checked, sorted(errors, key=lambda error: (error.file, error.line))


def _recent(by_target: Mapping[TargetKey, tuple[float, ...]], since: float) -> dict[TargetKey, tuple[float, ...]]:
    return {target: kept for target, stamps in by_target.items() if (kept := tuple(t for t in stamps if t > since))}
