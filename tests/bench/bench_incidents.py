"""Benchmark: what the incident layer (issue 23) adds to an evaluation cycle, side by side in one run.

The real Controller, Dispatcher and Journal on a ManualClock (tests/scenarios' simulator, scripted signals: no
Prometheus), the shipped p99-rollback policy over N services, every one breaching from the start (so each service
has an open incident, every evaluation reconciles them, and the first cycles open the incidents and roll back):
  plain      the dispatcher as at 7710821 (no incidents)
  incidents  the incident layer over the journal's SQLite file (`tailguard run` without `kubernetes.incidents`)
Medians over the cycles after the incidents opened (a cycle is one evaluation of the policy: its transition, the
journal commit, the deferred retries and the reconcile), the first cycles (the fires: the incidents open, the
rollbacks run through the incident) apart, and the ratios. Figures only, nothing asserted.

    python tests/bench/bench_incidents.py [--services 10 100 500] [--cycles 40]
"""

from __future__ import annotations

import argparse
import logging
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any, cast

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO))

from tailguard.controller.adapters.stores.incidents import SqliteIncidentStore
from tailguard.controller.adapters.stores.journal import Journal
from tailguard.controller.core.model import target_key
from tailguard.controller.core.ports import DispatcherPort
from tailguard.controller.kit.clock import ManualClock
from tailguard.controller.loop.dispatcher import Actuators, Dispatcher
from tailguard.controller.loop.incident_ports import incident_layer
from tailguard.controller.loop.incidents import IncidentKeeper
from tailguard.controller.testing import FakeAnnotator, FakeNotifier, FakeRollback
from tests.scenarios.test_incident_matrix import P99, STEP, T0, Replica, World, example


def run(services: int, cycles: int, with_incidents: bool) -> tuple[list[float], list[float]]:
    """(seconds of each of the first 3 cycles, seconds of each later cycle)."""
    with tempfile.TemporaryDirectory(prefix="bench-incidents-") as scratch:
        tmp = Path(scratch)
        clock, world = ManualClock(T0), World()
        names = [f"svc{index:04d}" for index in range(services)]
        for name in names:
            world.set(P99, target_key({"service": name}), 2.0)
        actuators = Actuators(
            rollback=FakeRollback(revisions=dict.fromkeys(names, 1000)),
            annotator=FakeAnnotator(),
            notifier=FakeNotifier(),
        )
        wrap: Any = None
        keeper: IncidentKeeper | None = None
        if with_incidents:
            keeper = IncidentKeeper(SqliteIncidentStore(tmp / "pod.db"), clock)
            layer = incident_layer(keeper, actuators, None)
            actuators = layer.actuators

            def wrap(dispatcher: Dispatcher, journal: Journal) -> DispatcherPort:
                return layer.dispatcher(dispatcher)

        replica = Replica(tmp, "pod", {"p99-rollback": example("p99-rollback")}, actuators, clock, world=world,
                          wrap_dispatcher=cast(Any, wrap))  # fmt: skip
        if keeper is not None:
            keeper.bind(replica.controller.policies)
        times: list[float] = []
        try:
            for _ in range(cycles):
                started = time.perf_counter()
                replica.evaluate()
                times.append(time.perf_counter() - started)
                clock.advance(STEP)
        finally:
            replica.stop()
        return times[:3], times[3:]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--services", type=int, nargs="+", default=[10, 100, 500])
    parser.add_argument("--cycles", type=int, default=40)
    parser.add_argument("--smoke", action="store_true", help="a tiny run (seconds) that only shows the bench works")
    args = parser.parse_args()
    if args.smoke:
        args.services, args.cycles = [3], 5
    logging.disable(logging.WARNING)  # every escalation logs a warning: not what is measured
    print(f"{'services':>8} | {'plain ms':>9} | {'incidents ms':>12} | {'ratio':>5} | "
          f"{'plain fires ms':>14} | {'incident fires ms':>17} | {'ratio':>5}")  # fmt: skip
    for services in args.services:
        plain_first, plain = run(services, args.cycles, with_incidents=False)
        layered_first, layered = run(services, args.cycles, with_incidents=True)
        steady_plain, steady_layered = statistics.median(plain) * 1e3, statistics.median(layered) * 1e3
        fires_plain, fires_layered = sum(plain_first) * 1e3, sum(layered_first) * 1e3
        print(
            f"{services:>8} | {steady_plain:>9.2f} | {steady_layered:>12.2f} | {steady_layered / steady_plain:>5.2f} | "
            f"{fires_plain:>14.1f} | {fires_layered:>17.1f} | {fires_layered / fires_plain:>5.2f}"
        )


if __name__ == "__main__":
    main()
