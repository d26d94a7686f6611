"""Leader election with a coordination.k8s.io/v1 Lease, so that of several replicas only one evaluates and acts.

`run_once()` is one round: acquire the Lease when nobody holds it (or it is released or expired), renew it
while we hold it. Expiry is judged like client-go does, against the local clock and never against the
holder's timestamps (clocks of two pods may differ): a Lease held by someone else is expired when its record
(resourceVersion) has not changed for `leaseDurationSeconds` since WE first saw that record.

`is_leader()` is true only until `renew_deadline` after our last successful renewal, counted from before the
request was sent; that deadline is shorter than the lease, so a partitioned leader stops acting before
anyone else may take over. Every write is a PUT with the resourceVersion read just before, so two electors
racing for the same Lease get one 200 and one 409: they never both lead.

`release()` (on stop) empties holderIdentity so a successor takes over at once instead of waiting out
the lease. Time comes from the injected clock; only the background loop (`start`) paces itself in real time.

With a handover attached (the controller, `attach_handover`), every write also carries the leader's
mutating-action times in the Lease annotation `tailguard.io/action-times` (controller/core/handover.py), and
whoever acquires the Lease hands the previous holder's times to its controller before its first write: a
new leader's cooldowns and budgets count what the old one did. `publish()` renews at once, so the controller
can publish a new action's time before it acts. Rounds are serialised (the background loop and `publish`
would otherwise race each other into a 409).

Failover adopts: with `attach_pending` (controller/loop/adoption.py) every write also carries the leader's
unfinished mutating actions (with their plans and deadlines) in `tailguard.io/pending-actions`, and whoever
acquires the Lease adopts them into its journal before its first write: a successor continues an action its
predecessor decided but did not finish, after the action's precondition check, instead of only counting its time.

One view across replicas: with `advertise(url)` every write also carries this replica's API URL in the Lease
annotation `tailguard.io/api-url`, and every round records the URL the current holder published
(`leader_api_url()`), so a standby can forward reads and alerts to the leader (controller/app/forwarding.py). The
URL of a holder whose Lease expired or was released is never returned: a request then gets a 503, not a guess.
"""

from __future__ import annotations

import datetime
import logging
import math
import threading
from collections.abc import Callable
from dataclasses import dataclass
from typing import TypeVar

from kubernetes import client as k8s

from tailguard.controller.adapters.kube.calls import KubeError, kube_call
from tailguard.controller.adapters.lease.settings import LeaderElectionSettings
from tailguard.controller.core.controls import CONTROLS_ANNOTATION, Controls, ControlsError
from tailguard.controller.core.handover import (
    HANDOVER_ANNOTATION,
    PENDING_ANNOTATION,
    HandoverError,
    decode_action_times,
    decode_pending,
    encode_action_times,
    encode_pending,
)
from tailguard.controller.core.ports import Clock, ControlsHandoverPort, HandoverPort, PendingHandoverPort
from tailguard.controller.kit.http import RetryPolicy

log = logging.getLogger(__name__)

API_URL_ANNOTATION = "tailguard.io/api-url"  # the holder's API (http://POD_IP:PORT), for the standby to forward to

T = TypeVar("T")


@dataclass(frozen=True)
class LeaseView:
    holder: str
    resource_version: str
    duration: float
    transitions: int


class LeaderElector:
    def __init__(
        self,
        api: k8s.CoordinationV1Api,
        name: str,
        namespace: str,
        identity: str,
        lease_seconds: float,
        clock: Clock,
        *,
        renew_deadline: float | None = None,
        timeout: float = 5.0,
    ) -> None:
        if lease_seconds <= 0:
            raise ValueError(f"lease_seconds must be positive, got {lease_seconds}")
        if not identity:
            raise ValueError("identity must not be empty (use the pod name)")
        self.api = api
        self.name = name
        self.namespace = namespace
        self.identity = identity
        self.lease_seconds = float(lease_seconds)
        self.renew_deadline = float(renew_deadline if renew_deadline is not None else lease_seconds * 2 / 3)
        if not 0 < self.renew_deadline <= self.lease_seconds:
            raise ValueError("renew_deadline must be positive and at most lease_seconds")
        self.clock = clock
        self.timeout = timeout
        self.last_error: str | None = None
        self.acquisitions = 0  # times this elector became leader
        self._leader_until = 0.0
        self._observed: tuple[str, float] | None = None  # (resourceVersion of someone else's record, seen at)
        self._lock = threading.Lock()
        self._round = threading.Lock()  # one acquire/renew round at a time (background loop and publish)
        self._handover: HandoverPort | None = None
        self._pending: PendingHandoverPort | None = None
        self._advertised_url: str | None = None  # ours, written with every Lease write
        self._holder_url: str | None = None  # the current (other) holder's, read each round
        self._holder_identity: str | None = None  # who published it
        self._rounds = RoundLoop(self.run_once, "tailguard-leader", join_timeout=self.timeout + 1)

    @classmethod
    def from_settings(cls, settings: LeaderElectionSettings, api: k8s.CoordinationV1Api, clock: Clock) -> LeaderElector:
        """The elector the `leaderElection` section describes."""
        return cls(
            api,
            settings.leaseName,
            settings.namespace,
            settings.resolved_identity(),
            settings.leaseDuration,
            clock,
            renew_deadline=settings.renewDeadline,
        )

    # -- state --------------------------------------------------------------------------------------

    def is_leader(self) -> bool:
        with self._lock:
            return self.clock.now() < self._leader_until

    def leader_api_url(self) -> str | None:
        """The API URL the current leader published, when another replica holds an unexpired Lease; else None
        (we lead, nobody leads, or the holder published none)."""
        with self._lock:
            return self._holder_url

    def leader_endpoint(self) -> tuple[str, str] | None:
        """(holder identity, published API URL) of another replica's unexpired Lease, read together; else None."""
        with self._lock:
            if self._holder_url is None or self._holder_identity is None:
                return None
            return self._holder_identity, self._holder_url

    def advertise(self, url: str) -> None:
        """Publish `url` (this replica's API) in the Lease from the next write on."""
        self._advertised_url = url

    # -- one round ----------------------------------------------------------------------------------

    def attach_handover(self, handover: HandoverPort) -> None:
        """Publish `handover`'s action times with every write, and hand it the previous holder's on acquiring."""
        self._handover = handover

    def attach_pending(self, pending: PendingHandoverPort) -> None:
        """Publish `pending`'s unfinished actions with every write (`tailguard.io/pending-actions`), and hand it the
        previous holder's on acquiring: the successor continues them (controller/loop/adoption.py)."""
        self._pending = pending

    def publish(self) -> bool:
        """Renew now (writing the current action times); returns whether we still lead."""
        return self.run_once()

    def run_once(self) -> bool:
        """Acquire or renew; returns whether we lead now. Errors are recorded in `last_error`, never raised."""
        with self._round:
            return self._round_unlocked()

    def _round_unlocked(self) -> bool:
        started = self.clock.now()
        found = self._call(
            lambda: self.api.read_namespaced_lease(self.name, self.namespace, _request_timeout=self.timeout),
            "reading",
        )
        if isinstance(found, KubeError):
            if found.status == 404:
                return self._create(started)
            return self.is_leader()
        view = _view(found)
        if view.holder == self.identity:
            self._set_holder_url(None, None)
            return self._write(found, started, acquiring=False)
        if view.holder and not self._expired(view, started):
            with self._lock:
                self._leader_until = 0.0
            self._set_holder_url(
                view.holder, ((found.metadata.annotations if found.metadata else None) or {}).get(API_URL_ANNOTATION)
            )
            return False
        self._set_holder_url(None, None)
        log.info("lease %s/%s %s; %s takes it", self.namespace, self.name,
                 f"held by {view.holder!r} expired" if view.holder else "is free", self.identity)  # fmt: skip
        return self._write(found, started, acquiring=True)

    def release(self) -> None:
        """Give the Lease up (if we hold it) so a successor need not wait for it to expire."""
        with self._round:
            self._release_unlocked()

    def _release_unlocked(self) -> None:
        with self._lock:
            was_leader = self._leader_until > 0
            self._leader_until = 0.0
        if not was_leader:
            return
        found = self._call(
            lambda: self.api.read_namespaced_lease(self.name, self.namespace, _request_timeout=self.timeout),
            "reading",
        )
        if isinstance(found, KubeError) or _view(found).holder != self.identity:
            return
        spec = found.spec or k8s.V1LeaseSpec()
        spec.holder_identity = ""
        spec.lease_duration_seconds = 1
        spec.renew_time = self._timestamp(self.clock.now())
        found.spec = spec
        self._carry_over(found, acquiring=False)  # the successor's inheritance
        self._call(
            lambda: self.api.replace_namespaced_lease(self.name, self.namespace, found, _request_timeout=self.timeout),
            "releasing",
        )

    # -- background loop ------------------------------------------------------------------------------

    def start(self, interval: float | None = None) -> None:
        """Run `run_once` every `interval` seconds (default a third of the lease) on a daemon thread."""
        self._rounds.start(interval if interval is not None else self.lease_seconds / 3)

    @property
    def running(self) -> bool:
        """Whether `start` started the renewal loop (and `stop` has not ended it)."""
        return self._rounds.running

    def stop(self) -> None:
        self._rounds.stop()
        self.release()

    # -- helpers ----------------------------------------------------------------------------------------

    def _carry_over(self, lease: k8s.V1Lease, *, acquiring: bool) -> None:
        """Before writing `lease`: hand the action times it carries to our controller, then set the annotation
        to the union. On every write, not only on acquiring: a leader restarted in its container renews
        before it has loaded its journal, and must not overwrite its own published times with nothing."""
        lease.metadata = lease.metadata or k8s.V1ObjectMeta()
        if acquiring:
            self._adopt(lease)
        if self._handover is None:
            lease.metadata.annotations = self._annotations(lease.metadata.annotations)
            return
        text = (lease.metadata.annotations or {}).get(HANDOVER_ANNOTATION)
        if text:
            try:
                times = decode_action_times(text)
            except HandoverError as unreadable:
                log.warning(
                    "lease %s/%s: annotation %s is unreadable (%s): cooldowns and budgets start from this "
                    "replica's journal", self.namespace, self.name, HANDOVER_ANNOTATION, unreadable,
                )  # fmt: skip
            else:
                self._handover.inherit_handover(times)
                if acquiring:
                    count = sum(len(stamps) for by_target in times.values() for stamps in by_target.values())
                    log.info("lease %s/%s: inherited %d action time(s) of the previous leader",
                             self.namespace, self.name, count)  # fmt: skip
        controls_text = (lease.metadata.annotations or {}).get(CONTROLS_ANNOTATION)
        if controls_text and isinstance(self._handover, ControlsHandoverPort):
            # Pauses and the kill switch survive a leader change (controller/core/controls.py).
            try:
                self._handover.inherit_controls(Controls.decode(controls_text))
            except ControlsError as unreadable:
                log.warning("lease %s/%s: annotation %s is unreadable (%s): the pauses start from this replica's "
                            "journal", self.namespace, self.name, CONTROLS_ANNOTATION, unreadable)  # fmt: skip
        lease.metadata.annotations = self._annotations(lease.metadata.annotations)

    def _adopt(self, lease: k8s.V1Lease) -> None:
        """On acquiring: the previous holder's unfinished actions to our journal (controller/loop/adoption.py)."""
        pending_text = ((lease.metadata.annotations if lease.metadata else None) or {}).get(PENDING_ANNOTATION)
        if not pending_text or self._pending is None:
            return
        try:
            adopted = self._pending.adopt_pending(decode_pending(pending_text))
        except HandoverError as unreadable:
            log.warning("lease %s/%s: annotation %s is unreadable (%s): the previous leader's unfinished actions "
                        "are not adopted", self.namespace, self.name, PENDING_ANNOTATION, unreadable)  # fmt: skip
            return
        if adopted:
            log.warning("lease %s/%s: adopted %d unfinished action(s) of the previous leader", self.namespace,
                        self.name, adopted)  # fmt: skip

    def _set_holder_url(self, holder: str | None, url: str | None) -> None:
        with self._lock:
            self._holder_identity = holder or None
            self._holder_url = url or None

    def _annotations(self, current: dict[str, str] | None) -> dict[str, str] | None:
        if self._advertised_url is not None:
            current = {**(current or {}), API_URL_ANNOTATION: self._advertised_url}
        if self._pending is not None:
            pending, left_out = encode_pending(self._pending.pending_snapshot())
            if left_out:
                log.warning("lease %s/%s: %d unfinished action(s) left out of %s (size limit)",
                            self.namespace, self.name, left_out, PENDING_ANNOTATION)  # fmt: skip
            current = {**(current or {}), PENDING_ANNOTATION: pending}
        if self._handover is None:
            return current
        text, dropped = encode_action_times(self._handover.handover_snapshot())
        if dropped:
            log.warning("lease %s/%s: %d target(s) with the oldest actions left out of %s (size limit)",
                        self.namespace, self.name, dropped, HANDOVER_ANNOTATION)  # fmt: skip
        annotations = {**(current or {}), HANDOVER_ANNOTATION: text}
        if isinstance(self._handover, ControlsHandoverPort):
            annotations[CONTROLS_ANNOTATION] = self._handover.controls_snapshot().encode()
        return annotations

    def _expired(self, view: LeaseView, now: float) -> bool:
        with self._lock:
            if self._observed is None or self._observed[0] != view.resource_version:
                self._observed = (view.resource_version, now)
                return False
            return now - self._observed[1] >= view.duration

    def _create(self, started: float) -> bool:
        when = self._timestamp(started)
        lease = k8s.V1Lease(
            metadata=k8s.V1ObjectMeta(name=self.name, namespace=self.namespace, annotations=self._annotations(None)),
            spec=k8s.V1LeaseSpec(
                holder_identity=self.identity,
                lease_duration_seconds=max(1, math.ceil(self.lease_seconds)),
                acquire_time=when,
                renew_time=when,
                lease_transitions=0,
            ),
        )
        created = self._call(
            lambda: self.api.create_namespaced_lease(self.namespace, lease, _request_timeout=self.timeout),
            "creating",
        )
        return self._settle(created, started, acquiring=True)

    def _write(self, lease: k8s.V1Lease, started: float, *, acquiring: bool) -> bool:
        spec = lease.spec or k8s.V1LeaseSpec()
        when = self._timestamp(started)
        if acquiring:
            spec.holder_identity = self.identity
            spec.acquire_time = when
            spec.lease_transitions = (spec.lease_transitions or 0) + 1
        self._carry_over(lease, acquiring=acquiring)
        spec.lease_duration_seconds = max(1, math.ceil(self.lease_seconds))
        spec.renew_time = when
        lease.spec = spec
        written = self._call(
            lambda: self.api.replace_namespaced_lease(self.name, self.namespace, lease, _request_timeout=self.timeout),
            "acquiring" if acquiring else "renewing",
        )
        return self._settle(written, started, acquiring=acquiring)

    def _settle(self, written: k8s.V1Lease | KubeError, started: float, *, acquiring: bool) -> bool:
        with self._lock:
            if isinstance(written, KubeError):
                if written.status == 409:
                    # Someone else wrote first: the Lease is not ours (any more). Other errors leave a
                    # current leadership to run out at its deadline unless the next round renews it.
                    self._leader_until = 0.0
                return self.clock.now() < self._leader_until
            if acquiring:
                self.acquisitions += 1
                log.info("%s is now the leader (lease %s/%s)", self.identity, self.namespace, self.name)
            self._observed = None
            self._leader_until = started + self.renew_deadline
            return self.clock.now() < self._leader_until

    def _call(self, fn: Callable[[], T], what: str) -> T | KubeError:
        result = kube_call(
            fn,
            what=f"{what} Lease {self.namespace}/{self.name}",
            clock=self.clock,
            retry=RetryPolicy(attempts=1),  # the next round is the retry
        )
        if isinstance(result, KubeError):
            if result.status != 404:
                self.last_error = result.message
                log.warning("%s", result.message)
        else:
            self.last_error = None
        return result

    @staticmethod
    def _timestamp(at: float) -> datetime.datetime:
        return datetime.datetime.fromtimestamp(at, datetime.UTC)


def _view(lease: k8s.V1Lease) -> LeaseView:
    spec = lease.spec or k8s.V1LeaseSpec()
    return LeaseView(
        holder=spec.holder_identity or "",
        resource_version=(lease.metadata.resource_version if lease.metadata else None) or "",
        duration=float(spec.lease_duration_seconds or 0),
        transitions=int(spec.lease_transitions or 0),
    )


class RoundLoop:
    """A daemon thread running `run_once` every `period` seconds until stop() (an elector's renewal rounds)."""

    def __init__(self, run_once: Callable[[], object], name: str, join_timeout: float) -> None:
        self._run_once = run_once
        self._name = name
        self._join_timeout = join_timeout
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    @property
    def running(self) -> bool:
        return self._thread is not None

    def start(self, period: float) -> None:
        self._stop.clear()

        def loop() -> None:
            while not self._stop.is_set():
                try:
                    self._run_once()
                except Exception:  # one bad round must not end the election loop
                    log.exception("%s: election round failed", self._name)
                self._stop.wait(period)

        self._thread = threading.Thread(target=loop, name=self._name, daemon=True)
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=self._join_timeout)
            self._thread = None
