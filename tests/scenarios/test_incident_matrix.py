"""Issue 12, item 7: the incident scenario matrix (docs/scenarios.md is its table).

Each scenario runs the real Controller, Dispatcher and Journal (SQLite in tmp) for minutes of SIMULATED time on a
ManualClock (evaluations are run by hand at their scheduled times; nothing sleeps for real), with the shipped
example policies (rules/examples) unless a scenario needs its own, the global limits of the shipped configuration
(cooldown 2m, 10 mutating actions per hour), and for the outside world either the public fakes of the ports
(controller/testing) or the real adapters against the spec-validating fake servers (tests/support: Argo CD,
Grafana, the Kubernetes API with its Lease). Every external call is recorded in order (`Tape`: each port method
with its arguments, and the fake servers' own request logs), and each scenario asserts that exact sequence and the
final state of the world (route weights, replicas, HPA floor, Argo CD revision), not only the decisions.
"""

from __future__ import annotations

import json
import threading
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any, cast
from urllib.parse import parse_qs, urlsplit

import pytest
import requests
from kubernetes import client as k8s
from prometheus_client import CollectorRegistry

from tailguard.controller.adapters.annotations.grafana import GrafanaAnnotator, GrafanaHttp
from tailguard.controller.adapters.argocd.client import ArgoCDClient
from tailguard.controller.adapters.argocd.settings import ArgoCDApp
from tailguard.controller.adapters.lease.leader import LeaderElector
from tailguard.controller.adapters.metrics.prometheus import PrometheusSettings, PrometheusSource
from tailguard.controller.adapters.rollback.argocd import ArgoCDRollback, BadRevisionRecord
from tailguard.controller.adapters.scale.hpa import HpaBounds, HpaScaler
from tailguard.controller.adapters.stores.journal import Journal
from tailguard.controller.adapters.stores.outbox import Outbox
from tailguard.controller.app.api import ControllerAPI
from tailguard.controller.core.attribution import Rollout
from tailguard.controller.core.model import SignalResult, TargetKey, target_key
from tailguard.controller.core.policy import Policy
from tailguard.controller.core.ports import Annotation, DispatcherPort, LeaderPort, MetricsSource
from tailguard.controller.kit.clock import ManualClock, ShutdownInterrupt
from tailguard.controller.loop.annotating_dispatcher import DecisionAnnotatingDispatcher
from tailguard.controller.loop.dispatcher import Actuators, Dispatcher, GlobalLimits
from tailguard.controller.loop.metrics import ControllerMetrics
from tailguard.controller.loop.runtime import Controller
from tailguard.controller.testing import (
    FakeAnnotator,
    FakeChangeTracker,
    FakeNotifier,
    FakeRollback,
    FakeRouter,
    FakeScaler,
)
from tests.support.fake_argocd import FakeArgoCD, application
from tests.support.fake_grafana import FakeGrafana
from tests.support.fake_kubernetes import FakeKubernetes, hpa

REPO = Path(__file__).resolve().parents[2]
EXAMPLES = REPO / "rules" / "examples"
T0 = 1_700_000_000.0
STEP = 15.0
SHIPPED_LIMITS = GlobalLimits(cooldown=120.0, maxActionsPerHour=10)  # deploy/base/controller.yaml `limits`

CHAT = target_key({"service": "chat"})
EMBED = target_key({"service": "embed"})
CHAT_R1 = target_key({"service": "chat", "version": "r1"})
CHAT_R2 = target_key({"service": "chat", "version": "r2"})

PRE_INCIDENT_HPA = {"minReplicas": 2, "maxReplicas": 10, "metrics": {"vllm:num_requests_waiting": "5"}}
P99 = "p99-e2e-latency"
QUEUE = "waiting-per-replica"


# ----- the simulator ---------------------------------------------------------------------------------------------


class Tape:
    """One ordered record of every call the dispatcher makes to the action ports, whatever port it is."""

    def __init__(self) -> None:
        self.calls: list[tuple[Any, ...]] = []
        self.keys: list[str] = []
        self._lock = threading.Lock()

    def _add(self, entry: tuple[Any, ...], key: str) -> None:
        with self._lock:
            self.calls.append(entry)
            self.keys.append(key)

    def wrap(self, port: Any) -> Any:
        """A proxy of `port` that records its mutating calls (with their arguments, without the key) first."""
        tape = self

        class Recorded:
            def __getattr__(self, name: str) -> Any:
                target = getattr(port, name)
                summary = _SUMMARIES.get(name)
                if summary is None:
                    return target

                def call(*args: Any, **kwargs: Any) -> Any:
                    # the key: a keyword, or the typed request's (core/ports: RollbackRequest, ScaleRequest, ...)
                    key = kwargs.get("idempotency_key", getattr(args[0] if args else None, "idempotency_key", None))
                    tape._add((name, *summary(*args, **kwargs)), str(key))
                    return target(*args, **kwargs)

                return call

        return Recorded()


def _annotation(annotation: Annotation, **_: Any) -> tuple[Any, ...]:
    return (annotation.text,)


_SUMMARIES: dict[str, Callable[..., tuple[Any, ...]]] = {
    "rollback": lambda request, *_, **kw: (request.service,),
    "set_replicas": lambda request, **kw: (request.service, request.replicas),
    "restore_scale": lambda service, state, **kw: (service, dict(state)),
    "set_weight": lambda request, *_, **kw: (request.service, request.version, request.weight),
    "set_weights": lambda service, weights, **kw: (service, dict(weights)),
    "annotate": _annotation,
    "notify": lambda request, **kw: (request.receiver,),
}


def example(name: str) -> str:
    return (EXAMPLES / f"{name}.yaml").read_text(encoding="utf-8")


@dataclass
class World:
    """What the scripted signals say, per signal and target (None: no sample for that target)."""

    values: dict[str, dict[TargetKey, float | None]] = field(default_factory=dict)

    def set(self, signal: str, target: TargetKey, value: float | None) -> None:
        self.values.setdefault(signal, {})[target] = value

    def query(self, source: MetricsSource, policy: Policy, at: float | None) -> Mapping[str, SignalResult]:
        return {
            signal.name: SignalResult({t: v for t, v in self.values.get(signal.name, {}).items() if v is not None})
            for signal in policy.signals
        }


class Replica:
    """One controller process as `tailguard run` wires it (minus the network to Prometheus unless `source`)."""

    def __init__(
        self,
        tmp: Path,
        name: str,
        policies: Mapping[str, str],
        actuators: Actuators,
        clock: Any,
        *,
        world: World | None = None,
        source: MetricsSource | None = None,
        leader: LeaderPort | None = None,
        change_tracker: FakeChangeTracker | None = None,
        wrap_dispatcher: Callable[[Dispatcher, Journal], DispatcherPort] | None = None,
    ) -> None:
        self.rules = tmp / f"{name}-rules"
        self.rules.mkdir(exist_ok=True)
        for policy, text in policies.items():
            (self.rules / f"{policy}.yaml").write_text(text, encoding="utf-8")
        self.clock = clock
        self.path = tmp / f"{name}.db"
        self.journal = Journal(self.path)
        self.dispatcher = Dispatcher(self.journal, actuators, clock, SHIPPED_LIMITS)
        dispatcher: DispatcherPort = self.dispatcher
        if wrap_dispatcher is not None:
            dispatcher = wrap_dispatcher(self.dispatcher, self.journal)
        self.controller = Controller(
            policy_paths=[self.rules],
            source=source if source is not None else cast(MetricsSource, object()),
            journal=self.journal,
            dispatcher=dispatcher,
            clock=clock,
            metrics=ControllerMetrics(CollectorRegistry()),
            query_signals=world.query if world is not None else None,
            schedule=False,
            leader=leader,
            change_tracker=change_tracker,
            change_window=1800.0 if change_tracker is not None else 0.0,
        )
        self.controller.start()

    def evaluate(self) -> None:
        """One scheduled evaluation of every loaded policy, in name order, at the current time."""
        for name in sorted(self.controller.policies()):
            self.controller.evaluate_scheduled(name)

    def recorded(self) -> list[dict[str, Any]]:
        """Every decision in the journal (read from the file: also after stop()), oldest first."""
        with Journal(self.path) as journal:
            return list(reversed(journal.recent_decisions(1000)))

    def actions(self) -> list[tuple[str, str, str]]:
        """(policy, action type, status) of every journaled action, in journal order."""
        with Journal(self.path) as journal:
            return [(r.policy, r.type.value, r.status.value) for r in journal.all_actions()]

    def decisions(self) -> list[tuple[str, str, str]]:
        """(policy, kind, target service) of every decision, oldest first."""
        return [(d["policy"], d["kind"], dict(d["target"])["service"]) for d in self.recorded()]

    def fires(self) -> list[tuple[str, float]]:
        return [(d["policy"], d["at"]) for d in self.recorded() if d["kind"] == "fire"]

    def stop(self) -> None:
        self.controller.stop()


def run_for(replica: Replica, seconds: float, script: Callable[[float], None] | None = None) -> None:
    """Evaluate every 15 s of simulated time for `seconds`; `script(elapsed)` sets the world first."""
    end = replica.clock.now() + seconds
    while replica.clock.now() < end:
        if script is not None:
            script(replica.clock.now() - T0)
        replica.evaluate()
        replica.clock.advance(STEP)


@pytest.fixture
def kube() -> Iterator[FakeKubernetes]:
    with FakeKubernetes() as server:
        yield server


# ----- 1. bad rollout with a queue surge (both policies) ---------------------------------------------------------


def test_s01_bad_rollout_with_queue_surge_scales_then_rolls_back_then_restores_the_floor(
    tmp_path: Path, kube: FakeKubernetes
) -> None:
    kube.put_object(hpa("chat", min_replicas=2, max_replicas=10))
    tape, clock, world = Tape(), ManualClock(T0), World()
    rollback = FakeRollback(revisions={"chat": 3})
    scaler = HpaScaler(
        k8s.AutoscalingV2Api(kube.api_client()), clock=clock, bounds=HpaBounds(max_replicas=8), namespace="llm"
    )
    annotator = FakeAnnotator()
    actuators = Actuators(rollback=tape.wrap(rollback), scale=tape.wrap(scaler), annotator=tape.wrap(annotator))
    policies = {"queue-scale": example("queue-scale"), "p99-rollback": example("p99-rollback")}
    replica = Replica(tmp_path, "pod", policies, actuators, clock, world=world)

    def script(elapsed: float) -> None:
        # The bad revision fills the queue first (T0), then slows every request (T0+15 s); the rollback (at
        # +45 s) fixes both.
        rolled_back = rollback.active_revision["chat"] < 3
        world.set(QUEUE, CHAT, 3.0 if rolled_back else 45.0)
        world.set(P99, CHAT, 0.3 if rolled_back or elapsed < 15 else 2.0)

    try:
        run_for(replica, 14 * 60, script)  # 14 minutes: the incident, then 10+ calm minutes
    finally:
        replica.stop()
    waiting = "45 requests waiting per replica on chat (target 20): scaling out"
    assert tape.calls == [
        ("set_replicas", "chat", 5),
        ("annotate", waiting),
        ("annotate", "P99 e2e latency 2s > 0.8s on chat: rolling back"),
        ("rollback", "chat"),
        ("annotate", "P99 e2e latency back to 0.3s on chat"),
        ("restore_scale", "chat", {**PRE_INCIDENT_HPA, "replicas": 2}),
        ("annotate", "3 requests waiting per replica on chat for 10m: back to the pre-incident floor"),
    ]
    assert [call.body["spec"]["minReplicas"] for call in kube.calls("update", "horizontalpodautoscalers")] == [5, 2]
    final = kube.get_object("horizontalpodautoscalers", "llm", "chat")
    assert final is not None and (final["spec"]["minReplicas"], final["spec"]["maxReplicas"]) == (2, 10)
    assert rollback.active_revision == {"chat": 2}
    assert replica.fires() == [("queue-scale", T0 + 30), ("p99-rollback", T0 + 45)]
    assert replica.actions() == [
        ("queue-scale", "scale", "succeeded"),
        ("queue-scale", "annotate", "succeeded"),
        ("p99-rollback", "annotate", "succeeded"),
        ("p99-rollback", "rollback", "succeeded"),
        ("p99-rollback", "annotate", "succeeded"),
        ("queue-scale", "restore", "succeeded"),
        ("queue-scale", "annotate", "succeeded"),
    ]


# ----- 2. canary error spike and recovery ------------------------------------------------------------------------


def test_s02_canary_error_spike_and_recovery_ends_at_stable_90_canary_10(tmp_path: Path) -> None:
    tape, clock, world = Tape(), ManualClock(T0), World()
    router = FakeRouter(routes={"chat": {"r1": 90, "r2": 10}})  # the bundled route
    actuators = Actuators(router=tape.wrap(router), annotator=tape.wrap(FakeAnnotator()))
    replica = Replica(tmp_path, "pod", {"error-rate-shift": example("error-rate-shift")}, actuators, clock, world=world)

    def script(elapsed: float) -> None:
        world.set("error-ratio", CHAT_R1, 0.01)
        world.set("error-ratio", CHAT_R2, 0.40 if elapsed < 180 else 0.01)  # three minutes of canary errors

    try:
        run_for(replica, 6 * 60, script)
    finally:
        replica.stop()
    assert tape.calls == [
        ("set_weight", "chat", "r2", 10),
        ("annotate", "error rate 0.4 > 15% on chat r2: shifted down to 10%"),
        ("set_weights", "chat", {"r1": 90, "r2": 10}),  # restore: the pre-incident weights (already so)
        ("annotate", "error rate 0.01 < 3% on chat r2: pre-incident weights restored"),
    ]
    assert router.routes == {"chat": {"r1": 90, "r2": 10}}  # never the canary at 100% (the old recovery)
    assert replica.decisions() == [("error-rate-shift", "fire", "chat"), ("error-rate-shift", "resolve", "chat")]
    # The restore is skipped: the route already shows its pre-incident weights.
    assert [a for a in replica.actions() if a[1] == "restore"] == [("error-rate-shift", "restore", "skipped")]


# ----- 3. load surge with no rollout -----------------------------------------------------------------------------


def test_s03_load_surge_without_a_rollout_scales_and_never_rolls_back(tmp_path: Path) -> None:
    tape, clock, world = Tape(), ManualClock(T0), World()
    deployed = FakeRollback(revisions={"chat": 3})
    scaler = FakeScaler(replicas={"chat": 2})
    actuators = Actuators(
        rollback=tape.wrap(deployed), scale=tape.wrap(scaler), annotator=tape.wrap(FakeAnnotator()),
        notifier=tape.wrap(FakeNotifier()),
    )  # fmt: skip
    # The only rollout in the window is of another service: attribution is by the `service` label.
    other = Rollout(
        at=T0 - 600, labels={"service": "embed"}, revision="embed-7", previous_revision="embed-6", source="argocd"
    )
    replica = Replica(
        tmp_path,
        "pod",
        {"attributed-rollback-or-scale": example("attributed-rollback-or-scale")},
        actuators,
        clock,
        world=world,
        change_tracker=FakeChangeTracker([other]),
    )
    world.set(P99, CHAT, 2.0)
    world.set("queue-per-replica", CHAT, 45.0)
    try:
        run_for(replica, 15 * 60)  # a quarter of an hour of saturation
    finally:
        replica.stop()
    assert tape.calls == [
        (
            "annotate",
            (
                "P99 2s on chat: not rollback-the-rollout (not attributed (no rollout of service=chat within 30m "
                "before onset)); queue-per-replica 45 > 20 -> scale-out; scaling out"
            ),
        ),
        ("set_replicas", "chat", 4),
    ]
    assert scaler.replica_counts == {"chat": 4} and deployed.active_revision == {"chat": 3}
    assert replica.decisions() == [("attributed-rollback-or-scale", "fire", "chat")]


# ----- 4. alert storm across services ----------------------------------------------------------------------------


def alert_body(*services: str) -> bytes:
    alerts = [
        {"status": "firing", "labels": {"alertname": "P99High", "namespace": "llm", "service": s}} for s in services
    ]
    return json.dumps({"version": "4", "status": "firing", "receiver": "tailguard", "alerts": alerts}).encode()


def test_s04_alert_storm_about_one_service_never_advances_another_nor_shortens_for(tmp_path: Path) -> None:
    tape, clock, world = Tape(), ManualClock(T0), World()
    deployed = FakeRollback(revisions={"chat": 3, "embed": 5})
    actuators = Actuators(rollback=tape.wrap(deployed), annotator=tape.wrap(FakeAnnotator()))
    replica = Replica(tmp_path, "pod", {"p99-rollback": example("p99-rollback")}, actuators, clock, world=world)
    api = ControllerAPI(replica.controller)  # not served: its handler's logic, called directly
    world.set(P99, CHAT, 2.0)
    world.set(P99, EMBED, 0.3)
    try:
        for tick in range(4):  # T0 ... T0+45
            replica.evaluate()
            # embed breaches only between scheduled evaluations, while Alertmanager storms about chat: one
            # post a second. Only chat's streak may take these observations; embed's is untouched.
            world.set(P99, EMBED, 2.0)
            for _ in range(14):
                clock.advance(1)
                status, answer = api.alerts(alert_body("chat"))
                assert (status, answer["triggered"]) == (202, ["p99-rollback"])
                assert replica.controller.wait_for_triggered(30)
                if tick == 0:
                    assert tape.calls == [], "an alert storm never shortens `for: 3`"
            world.set(P99, EMBED, 0.3)
            clock.advance(1)
    finally:
        replica.stop()
    assert tape.calls == [
        ("annotate", "P99 e2e latency 2s > 0.8s on chat: rolling back"),
        ("rollback", "chat"),
    ]
    assert deployed.active_revision == {"chat": 2, "embed": 5}
    assert replica.fires() == [("p99-rollback", T0 + 30)]  # the first breach + (3 - 1) x 15 s, not earlier


# ----- 5. Prometheus outage mid-incident -------------------------------------------------------------------------


class FakePrometheus:
    """A loopback Prometheus HTTP API (/api/v1/query): one vector, `value` per service; `down()` refuses
    connections until `up()` (same port), as a restarting Prometheus does."""

    def __init__(self) -> None:
        self.values: dict[str, float] = {}
        self.port = 0
        self.queries = 0
        self._server: ThreadingHTTPServer | None = None
        self.up()

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def up(self) -> None:
        fake = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, format: str, *args: Any) -> None:
                pass

            def _answer(self, params: Mapping[str, list[str]]) -> None:
                fake.queries += 1
                at = float(params.get("time", ["0"])[0])
                result = [
                    {"metric": {"service": service}, "value": [at, repr(value)]}
                    for service, value in sorted(fake.values.items())
                ]
                body = json.dumps({"status": "success", "data": {"resultType": "vector", "result": result}}).encode()
                self.send_response(200)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def do_GET(self) -> None:
                self._answer(parse_qs(urlsplit(self.path).query))

            def do_POST(self) -> None:
                length = int(self.headers.get("Content-Length") or 0)
                self._answer(parse_qs(self.rfile.read(length).decode()))

        server = ThreadingHTTPServer(("127.0.0.1", self.port), Handler)
        server.daemon_threads = True
        self.port = server.server_address[1]
        self._server = server
        threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True).start()

    def down(self) -> None:
        if self._server is not None:
            self._server.shutdown()
            self._server.server_close()
            self._server = None


def test_s05_prometheus_outage_mid_incident_acts_on_no_missing_data_and_resumes(tmp_path: Path) -> None:
    tape, clock = Tape(), ManualClock(T0)
    prometheus = FakePrometheus()
    source = PrometheusSource(PrometheusSettings(url=prometheus.url, timeout=2.0, retries=0), clock)
    deployed = FakeRollback(revisions={"chat": 3})
    actuators = Actuators(rollback=tape.wrap(deployed), annotator=tape.wrap(FakeAnnotator()))
    replica = Replica(tmp_path, "pod", {"p99-rollback": example("p99-rollback")}, actuators, clock, source=source)
    prometheus.values = {"chat": 2.0}
    try:
        run_for(replica, 30)  # T0, T0+15: two breaching observations
        prometheus.down()  # the outage: T0+30 ... T0+135, eight failed evaluations
        run_for(replica, 120)
        assert tape.calls == [], "no action from missing data"
        prometheus.up()  # back, the regression still there
        run_for(replica, 120)
    finally:
        replica.stop()
        prometheus.down()
    assert tape.calls == [
        ("annotate", "P99 e2e latency 2s > 0.8s on chat: rolling back"),
        ("rollback", "chat"),
    ]
    assert deployed.active_revision == {"chat": 2}
    assert replica.fires() == [("p99-rollback", T0 + 180)]  # three fresh observations after the outage
    # The outage is journaled (an `errored` decision after maxSourceErrors: 4), then the incident resumes.
    assert replica.decisions() == [("p99-rollback", "errored", "chat"), ("p99-rollback", "fire", "chat")]


# ----- 10. a flapping signal at the threshold --------------------------------------------------------------------


def test_s10_a_flapping_signal_at_the_threshold_causes_no_action_storm(tmp_path: Path) -> None:
    tape, clock, world = Tape(), ManualClock(T0), World()
    deployed = FakeRollback(revisions={"chat": 9})
    scaler = FakeScaler(replicas={"chat": 2})
    actuators = Actuators(rollback=tape.wrap(deployed), scale=tape.wrap(scaler), annotator=tape.wrap(FakeAnnotator()))
    policies = {"queue-scale": example("queue-scale"), "p99-rollback": example("p99-rollback")}
    replica = Replica(tmp_path, "pod", policies, actuators, clock, world=world)

    def script(elapsed: float) -> None:
        step = int(elapsed // STEP)
        # P99: three evaluations just above 0.8 s, two just below, over and over (fires and recovers each 75 s);
        # the queue: 19 and 21 waiting per replica in turn (never 30 s above 20).
        world.set(P99, CHAT, 0.81 if step % 5 < 3 else 0.79)
        world.set(QUEUE, CHAT, 21.0 if step % 2 else 19.0)

    try:
        run_for(replica, 60 * 60, script)  # an hour of flapping
    finally:
        replica.stop()
    kinds = [kind for _, kind, _ in replica.decisions()]
    one_incident = [
        ("annotate", "P99 e2e latency 0.81s > 0.8s on chat: rolling back"),
        ("rollback", "chat"),
        ("annotate", "P99 e2e latency back to 0.79s on chat"),
    ]
    # 48 flaps in the hour: three rollbacks, 10 minutes apart (the policy's cooldown; its budget is 3 an hour),
    # every other flap a suppressed decision; the queue never held above 20 for 30 s: no scale.
    assert tape.calls == one_incident * 3
    assert replica.fires() == [("p99-rollback", T0 + 30), ("p99-rollback", T0 + 630), ("p99-rollback", T0 + 1230)]
    assert deployed.active_revision == {"chat": 6} and scaler.replica_counts == {"chat": 2}
    assert (kinds.count("fire"), kinds.count("resolve"), kinds.count("suppressed"), len(kinds)) == (3, 3, 45, 51)


# ----- 6. Argo CD auto-sync on -----------------------------------------------------------------------------------

ARGOCD_TOKEN = "scenario-argocd-token"


def argocd_rollback(argocd: FakeArgoCD, clock: Any, record: Path | None = None) -> ArgoCDRollback:
    client = ArgoCDClient(argocd.url, clock=clock, token=lambda: ARGOCD_TOKEN, timeout=5.0, retries=1)
    return ArgoCDRollback(
        client,
        {"chat": ArgoCDApp(name="chat")},
        clock=clock,
        auto_sync="disableAutoSync",  # deploy/base/controller.yaml's `autoSync`
        poll_interval=5.0,
        record=BadRevisionRecord(record),
    )


@pytest.fixture
def argocd() -> Iterator[FakeArgoCD]:
    with FakeArgoCD() as server:
        server.state.token = ARGOCD_TOKEN
        yield server
    assert server.state.spec_violations == [], "every Argo CD request valid against its swagger"


def argocd_writes(argocd: FakeArgoCD) -> list[tuple[str, Any]]:
    return [(r.method, r.body) for r in argocd.state.requests if r.method != "GET"]


DISABLE_AUTO_SYNC = (
    "PATCH",
    {"name": "chat", "patch": '{"spec": {"syncPolicy": {"automated": null}}}', "patchType": "merge"},
)
ROLLBACK_TO_GOOD1 = ("POST", {"name": "chat", "id": 1, "dryRun": False, "prune": False})


def test_s06_argocd_auto_sync_on_is_disabled_first_then_exactly_one_rollback(
    tmp_path: Path, argocd: FakeArgoCD
) -> None:
    argocd.add_app(application("chat", [("good1", T0 - 7200), ("bad2", T0 - 120)], automated=True))
    tape, clock, world = Tape(), ManualClock(T0), World()
    actuators = Actuators(rollback=tape.wrap(argocd_rollback(argocd, clock)), annotator=tape.wrap(FakeAnnotator()))
    replica = Replica(tmp_path, "pod", {"p99-rollback": example("p99-rollback")}, actuators, clock, world=world)

    def script(elapsed: float) -> None:
        fixed = argocd.app("chat")["status"]["sync"]["revision"] == "good1"
        world.set(P99, CHAT, 0.3 if fixed else 2.0)

    try:
        run_for(replica, 5 * 60, script)
    finally:
        replica.stop()
    assert tape.calls == [
        ("annotate", "P99 e2e latency 2s > 0.8s on chat: rolling back"),
        ("rollback", "chat"),
        ("annotate", "P99 e2e latency back to 0.3s on chat"),
    ]
    assert argocd_writes(argocd) == [DISABLE_AUTO_SYNC, ROLLBACK_TO_GOOD1]  # auto-sync off first, one rollback
    final = argocd.app("chat")
    assert final["status"]["sync"]["revision"] == "good1" and "automated" not in final["spec"].get("syncPolicy", {})
    assert [a for a in replica.actions() if a[1] == "rollback"] == [("p99-rollback", "rollback", "succeeded")]


# ----- 7. Grafana down during the incident -----------------------------------------------------------------------


def test_s07_grafana_down_during_the_incident_gets_every_annotation_once_after(tmp_path: Path) -> None:
    tape, clock, world = Tape(), ManualClock(T0), World()
    deployed = FakeRollback(revisions={"chat": 3})
    with FakeGrafana("scenario-grafana-token") as grafana:
        grafana.down()  # down before the incident, up after it ended
        http = GrafanaHttp(grafana.url, "scenario-grafana-token", clock, timeout=2.0, retries=1)
        annotator = GrafanaAnnotator(http, Outbox(tmp_path / "outbox.db"), clock)

        def regions(dispatcher: Dispatcher, journal: Journal) -> DispatcherPort:
            return DecisionAnnotatingDispatcher(dispatcher, annotator, journal)

        actuators = Actuators(rollback=tape.wrap(deployed), annotator=tape.wrap(annotator))
        replica = Replica(
            tmp_path, "pod", {"p99-rollback": example("p99-rollback")}, actuators, clock, world=world,
            wrap_dispatcher=regions,
        )  # fmt: skip

        def script(elapsed: float) -> None:
            world.set(P99, CHAT, 0.3 if deployed.active_revision["chat"] < 3 else 2.0)

        try:
            for _ in range(20):  # five minutes: the incident and its recovery, the outbox trying every 15 s
                script(0)
                replica.evaluate()
                annotator.flush()
                clock.advance(STEP)
            assert grafana.annotations() == []
            grafana.up()
            for _ in range(6):  # Grafana back: the outbox delivers within its (capped) backoff
                annotator.flush()
                clock.advance(STEP)
        finally:
            replica.stop()
            annotator.close()
        writes = [(r.method, r.status) for r in grafana.requests() if r.method != "GET"]
        notes = grafana.annotations()
    assert tape.calls == [
        ("annotate", "P99 e2e latency 2s > 0.8s on chat: rolling back"),
        ("rollback", "chat"),
        ("annotate", "P99 e2e latency back to 0.3s on chat"),
    ]
    assert deployed.active_revision == {"chat": 2}
    # Delivered once each, in order, after Grafana returned: the decision's region, the annotate action, the
    # region closed on recovery (PATCH timeEnd), the recovery's annotate action; nothing twice.
    assert writes == [("POST", 200), ("POST", 200), ("PATCH", 200), ("POST", 200)]
    region, *texts = [note["text"] for note in notes]
    assert texts == ["P99 e2e latency 2s > 0.8s on chat: rolling back", "P99 e2e latency back to 0.3s on chat"]
    assert region.startswith("tailguard fire: p99-rollback/p99-above-800ms") and "resolved: recovered" in region


# ----- 8. leader killed mid-rollback -----------------------------------------------------------------------------


class PodClock:
    """One pod's view of the shared simulated time: its own shutdown (interrupt) and its own death (`die_on_sleep`:
    the next wait, e.g. the Argo CD sync poll after the rollback POST, is where the pod is killed)."""

    def __init__(self, shared: ManualClock) -> None:
        self.shared = shared
        self.die_on_sleep = False
        self._stopping = False

    def now(self) -> float:
        return self.shared.now()

    def sleep(self, seconds: float) -> None:
        if self._stopping or self.die_on_sleep:
            raise ShutdownInterrupt("the pod is gone")
        self.shared.advance(seconds)

    def interrupt(self) -> None:
        self._stopping = True


@dataclass
class Pod:
    replica: Replica
    elector: LeaderElector
    clock: PodClock


def start_pod(
    tmp: Path,
    name: str,
    kube: FakeKubernetes,
    shared: ManualClock,
    world: World,
    actuators: Callable[[PodClock], Actuators],
) -> Pod:
    clock = PodClock(shared)
    elector = LeaderElector(k8s.CoordinationV1Api(kube.api_client()), "tailguard", "tailguard", name, 15, clock)
    elector.run_once()  # `tailguard run` takes part in the election before it starts the controller
    policies = {"p99-rollback": example("p99-rollback")}
    replica = Replica(tmp, name, policies, actuators(clock), clock, world=world, leader=elector)
    return Pod(replica, elector, clock)


def tick(pods: Sequence[Pod], shared: ManualClock) -> None:
    for pod in pods:
        pod.elector.run_once()
        pod.replica.evaluate()
    shared.advance(STEP)


def argocd_finishes(argocd: FakeArgoCD) -> None:
    """Argo CD completes the running operation on its own (the fake advances it on reads)."""
    for _ in range(3):
        answer = requests.get(
            f"{argocd.url}/api/v1/applications/chat", headers={"Authorization": f"Bearer {ARGOCD_TOKEN}"}, timeout=10
        )
        assert answer.status_code == 200


@dataclass
class Failover:
    shared: ManualClock
    world: World
    tape: Tape
    argocd: FakeArgoCD
    kube: FakeKubernetes
    tmp: Path

    def actuators(self, name: str) -> Callable[[PodClock], Actuators]:
        def build(clock: PodClock) -> Actuators:
            rollback = argocd_rollback(self.argocd, clock, self.tmp / f"{name}-argocd-rollbacks.json")
            return Actuators(rollback=self.tape.wrap(rollback), annotator=self.tape.wrap(FakeAnnotator()))

        return build

    def latency(self) -> None:
        fixed = self.argocd.app("chat")["status"]["sync"]["revision"] == "good1"
        self.world.set(P99, CHAT, 0.3 if fixed else 2.0)


@pytest.fixture
def failover(tmp_path: Path, argocd: FakeArgoCD, kube: FakeKubernetes) -> Failover:
    argocd.add_app(application("chat", [("good1", T0 - 7200), ("bad2", T0 - 120)]))
    return Failover(ManualClock(T0), World(), Tape(), argocd, kube, tmp_path)


def kill_pod_a_mid_rollback(f: Failover) -> tuple[Pod, Pod]:
    a = start_pod(f.tmp, "pod-a", f.kube, f.shared, f.world, f.actuators("pod-a"))
    b = start_pod(f.tmp, "pod-b", f.kube, f.shared, f.world, f.actuators("pod-b"))
    assert a.elector.is_leader() and not b.elector.is_leader()
    f.latency()
    tick([a, b], f.shared)  # T0, T0+15: breaching
    tick([a, b], f.shared)
    a.clock.die_on_sleep = True  # pod-a is killed while it waits for the sync after its rollback POST
    a.elector.run_once()
    with pytest.raises(ShutdownInterrupt):
        a.replica.evaluate()
    assert argocd_writes(f.argocd) == [ROLLBACK_TO_GOOD1]
    with Journal(a.replica.path) as journal:
        assert [(r.type.value, r.status.value) for r in journal.all_actions()] == [
            ("annotate", "succeeded"),
            ("rollback", "started"),
        ]
    return a, b


def test_s08a_the_new_leader_does_not_roll_back_a_second_time(failover: Failover) -> None:
    f = failover
    a, b = kill_pod_a_mid_rollback(f)
    try:
        for _ in range(4):  # pod-b leads once pod-a's Lease expired; the sync is still running, P99 still high
            f.shared.advance(STEP)
            tick([b], f.shared)
        assert b.elector.run_once(), "pod-b leads"
        argocd_finishes(f.argocd)
        for _ in range(8):
            f.latency()
            tick([b], f.shared)
    finally:
        b.replica.stop()
        a.replica.stop()
    assert f.tape.calls == [
        ("annotate", "P99 e2e latency 2s > 0.8s on chat: rolling back"),
        ("rollback", "chat"),
    ]
    assert argocd_writes(f.argocd) == [ROLLBACK_TO_GOOD1]  # one rollback, to good1; bad2 never deployed again
    assert f.argocd.app("chat")["status"]["sync"]["revision"] == "good1"
    # pod-b decided on the same breach, but pod-a's rollback (handed over on the Lease) holds its cooldown.
    assert [kind for _, kind, _ in b.replica.decisions()] == ["suppressed"]


def test_s08b_the_killed_leader_taking_the_lease_back_does_not_redeploy_the_bad_revision(failover: Failover) -> None:
    f = failover
    a, b = kill_pod_a_mid_rollback(f)
    a.replica.stop()
    argocd_finishes(f.argocd)  # the rollback pod-a started completes without it
    try:
        for _ in range(3):
            f.shared.advance(STEP)
            f.latency()
            tick([b], f.shared)
        assert b.elector.run_once(), "pod-b leads"
        b.elector.release()  # pod-b is drained (a rolling update) ...
        b.replica.stop()
        restarted = start_pod(f.tmp, "pod-a", f.kube, f.shared, f.world, f.actuators("pod-a"))  # ... pod-a is back
        for _ in range(4):
            f.latency()
            tick([restarted], f.shared)  # its first evaluation as leader resumes the started rollback
        restarted.replica.stop()
    finally:
        b.replica.stop()
    assert argocd_writes(f.argocd) == [ROLLBACK_TO_GOOD1]
    assert f.argocd.app("chat")["status"]["sync"]["revision"] == "good1"


# ----- 9. the standby receives the alerts ------------------------------------------------------------------------


def test_s09_alerts_posted_to_the_standby_get_503_and_the_leader_acts_once(
    tmp_path: Path, kube: FakeKubernetes
) -> None:
    shared, world, tape = ManualClock(T0), World(), Tape()
    deployed = FakeRollback(revisions={"chat": 3})

    def actuators(clock: PodClock) -> Actuators:
        return Actuators(rollback=tape.wrap(deployed), annotator=tape.wrap(FakeAnnotator()))

    leader = start_pod(tmp_path, "pod-a", kube, shared, world, actuators)
    standby = start_pod(tmp_path, "pod-b", kube, shared, world, actuators)
    apis = [ControllerAPI(pod.replica.controller, leader=pod.elector) for pod in (leader, standby)]
    for api in apis:
        api.start()

    def post(api: ControllerAPI) -> requests.Response:
        return requests.post(
            f"{api.url}/api/v1/alerts",
            data=alert_body("chat"),
            headers={"Content-Type": "application/json"},
            timeout=10,
        )

    world.set(P99, CHAT, 2.0)
    answers: list[tuple[int, str | None]] = []
    try:
        for step in range(8):  # two minutes; Alertmanager posts (retrying a 5xx) 5 s after each scheduled evaluation
            for pod in (leader, standby):
                pod.elector.run_once()
                pod.replica.evaluate()
            shared.advance(5)
            for pod in (leader, standby):
                pod.elector.run_once()  # the electors renew every few seconds
            for api in (apis[1], apis[0]):  # the standby first: Alertmanager's retry reaches the leader
                answer = post(api)
                answers.append((answer.status_code, answer.headers.get("Retry-After")))
            assert leader.replica.controller.wait_for_triggered(30)
            if step < 2:
                assert tape.calls == [], "an alert never shortens `for: 3`"
            shared.advance(STEP - 5)
    finally:
        for api in apis:
            api.stop()
        leader.replica.stop()
        standby.replica.stop()
    assert answers == [(503, str(apis[1].standby_retry_after)), (202, None)] * 8
    assert tape.calls == [
        ("annotate", "P99 e2e latency 2s > 0.8s on chat: rolling back"),
        ("rollback", "chat"),
    ]
    assert deployed.active_revision == {"chat": 2}
    assert standby.replica.decisions() == [] and leader.replica.fires() == [("p99-rollback", T0 + 30)]
