"""Failover and shadow warm-up for vLLM pods on Kubernetes: the local tier's rules, as pod readiness gates.

The vLLM Deployments (serving/tier/manifests) declare two readiness gates; a pod is Ready, i.e. an endpoint of its
Service and so reachable through the HTTPRoute, only when both conditions are True. This small controller
(`python -m tailguard.serving.tier.rotation`, serving/tier/manifests/base/rotation.yaml) sets them, with the same state
machine as the local supervisor (tailguard.serving.tier.failover, tailguard.serving.tier.warmup):

- `tailguard.io/warmed-up`: False until the pod passed the shadow warm-up (`tailguard.serving.tier.warmup.warm_up`:
  /health, /v1/models lists the served model, /metrics has vllm: metrics, short completions succeed) against
  the pod's own address, once its containers are ready (the startup probe passed). No user request reaches a
  pod that has not been warmed up.
- `tailguard.io/in-rotation`: the failover. The controller health-checks every warmed-up pod each period;
  3 failed checks in a row take it out (False, weight 0); when it answers again it returns at half weight
  (50) and after `recover_after` good checks it is back at full weight (100). Kubernetes Services do not
  weight endpoints, so half weight is a duty cycle: while recovering the pod is in rotation every other
  health-check period (about half the traffic a full pod gets over the recovery).

Every pod also carries its weight and rotation as metadata, for people and gateways that weight endpoints:
annotation `tailguard.io/weight` ("100", "50", "0") and label `tailguard.io/rotation` (in, recovering, out).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import datetime
import logging
import signal
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import aiohttp
from kubernetes import client as k8s
from kubernetes import config as k8s_config

from tailguard.serving.tier.failover import (
    IN_ROTATION,
    READINESS_GATES,
    ROTATION_LABEL,
    WARMED_UP,
    WEIGHT_ANNOTATION,
    FailoverState,
    Rotation,
    Transition,
)
from tailguard.serving.tier.warmup import WarmupResult, warm_up

log = logging.getLogger(__name__)
__all__ = ["READINESS_GATES", "PodRotation", "RotationController", "desired_conditions"]

DEFAULT_SELECTOR = "app.kubernetes.io/name=vllm"


@dataclass
class PodRotation:
    """One pod's warm-up and failover state (pure: fed warm-up and health-check results)."""

    failover: FailoverState = field(default_factory=FailoverState)
    warmed: bool = False
    last_warmup: WarmupResult | None = None

    def observe_warmup(self, result: WarmupResult) -> None:
        self.last_warmup = result
        self.warmed = self.warmed or result.ok

    def observe_health(self, healthy: bool) -> Transition | None:
        return self.failover.observe(healthy)

    @property
    def rotation(self) -> Rotation:
        return self.failover.rotation if self.warmed else Rotation.OUT

    @property
    def weight(self) -> int:
        return self.failover.weight if self.warmed else 0

    @property
    def in_rotation(self) -> bool:
        """Whether the pod is an endpoint now: at full weight always, at half weight every other period."""
        if not self.warmed or self.rotation is Rotation.OUT:
            return False
        if self.rotation is Rotation.RECOVERING:
            return self.failover.consecutive_successes % 2 == 1
        return True


def _condition(kind: str, ok: bool, reason: str, message: str, now: str) -> dict[str, Any]:
    return {
        "type": kind,
        "status": "True" if ok else "False",
        "reason": reason,
        "message": message,
        "lastTransitionTime": now,
    }


def desired_conditions(state: PodRotation, current: Sequence[dict[str, Any]], now: str) -> list[dict[str, Any]]:
    """The pod's conditions with the two gates set from `state` (a gate's lastTransitionTime kept if unchanged)."""
    warmup = state.last_warmup
    if state.warmed:
        warmed = _condition(WARMED_UP, True, "WarmedUp", "shadow warm-up passed", now)
    elif warmup is None:
        warmed = _condition(WARMED_UP, False, "Pending", "waiting for the containers to be ready", now)
    else:
        warmed = _condition(WARMED_UP, False, "WarmupFailed", f"{warmup.step}: {warmup.detail}"[:500], now)
    failover = state.failover
    reasons = {
        Rotation.IN: ("InRotation", "full weight"),
        Rotation.RECOVERING: ("Recovering", f"half weight after {failover.consecutive_successes} good checks"),
        Rotation.OUT: ("FailedHealthChecks", f"{failover.consecutive_failures} failed health checks in a row"),
    }
    reason, message = reasons[state.rotation] if state.warmed else ("NotWarmedUp", "not warmed up yet")
    rotation = _condition(IN_ROTATION, state.in_rotation, reason, message, now)
    wanted = {WARMED_UP: warmed, IN_ROTATION: rotation}
    out = []
    for existing in current:
        kind = existing.get("type")
        if kind in wanted:
            new = wanted.pop(kind)
            if existing.get("status") == new["status"]:
                new["lastTransitionTime"] = existing.get("lastTransitionTime", now)
            out.append(new)
        else:
            out.append(existing)
    out.extend(wanted.values())
    return out


def _strip_times(conditions: Sequence[dict[str, Any]]) -> list[tuple[Any, ...]]:
    return [(c.get("type"), c.get("status"), c.get("reason"), c.get("message")) for c in conditions]


def pod_endpoint(pod: dict[str, Any], port_name: str = "http") -> str | None:
    """`http://<pod IP>:<the container port named port_name>`, or None while the pod has no IP."""
    ip = (pod.get("status") or {}).get("podIP")
    if not ip:
        return None
    for container in pod.get("spec", {}).get("containers", []):
        for port in container.get("ports") or []:
            if port.get("name") == port_name:
                return f"http://{ip}:{port['containerPort']}"
    return None


def served_model(pod: dict[str, Any]) -> str | None:
    """The `--served-model-name` of the pod's vLLM container."""
    for container in pod.get("spec", {}).get("containers", []):
        args = [str(a) for a in [*(container.get("command") or []), *(container.get("args") or [])]]
        for index, arg in enumerate(args):
            if arg == "--served-model-name" and index + 1 < len(args):
                return args[index + 1]
            if arg.startswith("--served-model-name="):
                return arg.split("=", 1)[1]
    return None


def containers_ready(pod: dict[str, Any]) -> bool:
    status = pod.get("status") or {}
    if status.get("phase") != "Running" or pod.get("metadata", {}).get("deletionTimestamp"):
        return False
    return any(c.get("type") == "ContainersReady" and c.get("status") == "True" for c in status.get("conditions") or [])


class RotationController:
    """Sets the readiness gates of the vLLM pods matching `selector` in `namespace`; one `reconcile()` per period."""

    def __init__(
        self,
        api: k8s.CoreV1Api,
        namespace: str,
        session: aiohttp.ClientSession,
        *,
        selector: str = DEFAULT_SELECTOR,
        health_timeout_s: float = 2.0,
        warmup_completions: int = 3,
        warmup_timeout_s: float = 60.0,
        failures_to_remove: int = 3,
        recover_after: int = 3,
        clock: Callable[[], float] = time.time,
    ):
        self.api = api
        self.namespace = namespace
        self.session = session
        self.selector = selector
        self.health_timeout_s = health_timeout_s
        self.warmup_completions = warmup_completions
        self.warmup_timeout_s = warmup_timeout_s
        self.failures_to_remove = failures_to_remove
        self.recover_after = recover_after
        self.clock = clock
        self.pods: dict[str, PodRotation] = {}  # by pod uid: a replaced pod starts over (warm-up again)
        self.names: dict[str, str] = {}

    def state(self, name: str) -> PodRotation:
        """The state of the current pod called `name` (tests and logs)."""
        return self.pods[next(uid for uid, pod_name in self.names.items() if pod_name == name)]

    async def reconcile(self) -> None:
        listing = await asyncio.to_thread(self.api.list_namespaced_pod, self.namespace, label_selector=self.selector)
        pods = [self.api.api_client.sanitize_for_serialization(item) for item in listing.items]
        seen = set()
        for pod in pods:
            uid = pod["metadata"].get("uid") or pod["metadata"]["name"]
            seen.add(uid)
            self.names[uid] = pod["metadata"]["name"]
            state = self.pods.setdefault(uid, PodRotation(FailoverState(self.failures_to_remove, self.recover_after)))
            await self._observe(pod, state)
            await self._publish(pod, state)
        for uid in set(self.pods) - seen:
            del self.pods[uid]
            self.names.pop(uid, None)

    async def _observe(self, pod: dict[str, Any], state: PodRotation) -> None:
        url = pod_endpoint(pod)
        if url is None or not containers_ready(pod):
            if state.warmed:
                state.observe_health(False)
            return
        if not state.warmed:
            model = served_model(pod) or ""
            result = await warm_up(
                self.session,
                url,
                model,
                completions=self.warmup_completions,
                timeout_s=self.warmup_timeout_s,
                request_id_prefix=f"warmup-{pod['metadata']['name']}",
            )
            state.observe_warmup(result)
            if not result.ok:
                log.info("pod %s: warm-up failed at %s: %s", pod["metadata"]["name"], result.step, result.detail)
            return
        transition = state.observe_health(await self._healthy(url))
        if transition is not None:
            log.warning("pod %s: %s -> %s", pod["metadata"]["name"], transition.before.value, transition.after.value)

    async def _healthy(self, url: str) -> bool:
        try:
            timeout = aiohttp.ClientTimeout(total=self.health_timeout_s)
            async with self.session.get(url + "/health", timeout=timeout) as response:
                return response.status == 200
        except (aiohttp.ClientError, TimeoutError):
            return False

    async def _publish(self, pod: dict[str, Any], state: PodRotation) -> None:
        name = pod["metadata"]["name"]
        now = datetime.datetime.fromtimestamp(self.clock(), datetime.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
        current = (pod.get("status") or {}).get("conditions") or []
        wanted = desired_conditions(state, current, now)
        if _strip_times(wanted) != _strip_times(current):
            body = {"status": {"conditions": wanted}}
            await asyncio.to_thread(self.api.patch_namespaced_pod_status, name, self.namespace, body)
        metadata = pod["metadata"]
        weight, rotation = str(state.weight), state.rotation.value
        annotations, labels = metadata.get("annotations") or {}, metadata.get("labels") or {}
        if annotations.get(WEIGHT_ANNOTATION) != weight or labels.get(ROTATION_LABEL) != rotation:
            patch = {"metadata": {"annotations": {WEIGHT_ANNOTATION: weight}, "labels": {ROTATION_LABEL: rotation}}}
            await asyncio.to_thread(self.api.patch_namespaced_pod, name, self.namespace, patch)

    async def run(self, interval_s: float, stop: asyncio.Event) -> None:
        while not stop.is_set():
            try:
                await self.reconcile()
            except (k8s.ApiException, aiohttp.ClientError, OSError) as exc:
                log.warning("reconcile failed: %s", exc)
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(stop.wait(), interval_s)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m tailguard.serving.tier.rotation", description=__doc__.split("\n\n")[0]
    )
    parser.add_argument("--namespace", required=True)
    parser.add_argument("--selector", default=DEFAULT_SELECTOR, help="label selector of the vLLM pods")
    parser.add_argument("--interval", type=float, default=5.0, help="seconds between health checks")
    parser.add_argument("--failures-to-remove", type=int, default=3)
    parser.add_argument("--recover-after", type=int, default=3)
    parser.add_argument("--warmup-completions", type=int, default=3)
    options = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    k8s_config.load_incluster_config()  # type: ignore[no-untyped-call]

    async def serve() -> None:
        stop = asyncio.Event()
        loop = asyncio.get_running_loop()
        for signum in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(signum, stop.set)
        async with aiohttp.ClientSession() as session:
            controller = RotationController(
                k8s.CoreV1Api(),
                options.namespace,
                session,
                selector=options.selector,
                failures_to_remove=options.failures_to_remove,
                recover_after=options.recover_after,
                warmup_completions=options.warmup_completions,
            )
            await controller.run(options.interval, stop)

    asyncio.run(serve())
    return 0


if __name__ == "__main__":
    sys.exit(main())
