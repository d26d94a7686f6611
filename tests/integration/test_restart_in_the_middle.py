"""Restart in the middle: kill the controller between journaling and completing a rollback.

The real serving tier (`python -m tailguard.serving.tier`) runs as its own process for the
whole test. A driver process journals a FIRE decision (annotate + rollback) and
dispatches it with a crash hook that `os._exit()`s at "after-start" (the tier was
never called) or at "after-execute" (the tier rolled back, the journal does not
know). A second driver process opens the same journal and calls `resume()`.
Afterwards the tier shows exactly one rollback, the journal exactly one rollback
action (succeeded, two attempts), and a third resume changes nothing.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest
import requests

from tailguard.controller.adapters.stores.journal import ActionStatus, Journal
from tests.support.fake_tier import running_serving_tier

pytestmark = pytest.mark.integration

ROOT = Path(__file__).resolve().parents[2]
CRASH_EXIT = 17

TIER_CONFIG = """\
services:
  - name: chat
    namespace: llm
    model: tiny-llama
    profile: stable
    replicas: 1
"""

DRIVER = textwrap.dedent(
    """
    import json, os, sys
    from tailguard.controller.adapters.annotations.jsonl import JsonlAnnotator
    from tailguard.controller.testing import make_decision
    from tailguard.controller.adapters.tier.local_tier import LocalTierClient
    from tailguard.controller.kit.clock import SystemClock
    from tailguard.controller.loop.dispatcher import Actuators, Dispatcher, GlobalLimits
    from tailguard.controller.core.engine import PolicyState
    from tailguard.controller.adapters.stores.journal import Journal

    journal_path, annotations_path, tier_url, mode = sys.argv[1:5]
    clock = SystemClock()
    journal = Journal(journal_path)
    tier = LocalTierClient(tier_url, timeout=10.0, retries=3, clock=clock)
    actuators = Actuators(rollback=tier, scale=tier, annotator=JsonlAnnotator(annotations_path))

    def crash_hook(point, record):
        if mode == "dispatch-crash-" + point and record.type.value == "rollback":
            os._exit(CRASH_EXIT)  # killed: no journal close, no result recorded

    dispatcher = Dispatcher(journal, actuators, clock, GlobalLimits(cooldown=600, maxActionsPerHour=3),
                            crash_hook=crash_hook)
    if mode.startswith("dispatch"):
        decision = make_decision([("annotate", {"text": "P99 1.2s > 0.8s on chat: rolling back",
                                                "tags": ["regression"]}),
                                  ("rollback", {"service": "chat"})], onset=float(sys.argv[5]))
        journal.commit_evaluation(decision.policy, PolicyState(), [decision], clock.now())
        records = dispatcher.dispatch(decision)
    else:
        records = dispatcher.resume()
    journal.close()
    print(json.dumps([record.to_json() for record in records]))
    """
).replace("CRASH_EXIT", str(CRASH_EXIT))


@contextmanager
def running_tier(tmp: Path) -> Iterator[str]:
    with running_serving_tier(tmp, TIER_CONFIG) as url:
        yield url


def run_driver(tmp: Path, tier_url: str, mode: str, onset: float = 1_700_000_000.0) -> subprocess.CompletedProcess[str]:
    script = tmp / "driver.py"
    script.write_text(DRIVER)
    return subprocess.run(
        [
            sys.executable,
            str(script),
            str(tmp / "journal.db"),
            str(tmp / "annotations.jsonl"),
            tier_url,
            mode,
            str(onset),
        ],
        cwd=ROOT,
        env={**os.environ, "PYTHONPATH": str(ROOT)},
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )


def tier_history(tier_url: str) -> tuple[int, list[dict[str, Any]]]:
    service = requests.get(f"{tier_url}/api/v1/services/chat", timeout=10).json()
    revisions = requests.get(f"{tier_url}/api/v1/services/chat/revisions", timeout=10).json()
    return int(service["active_revision"]), revisions


def roll_out(tier_url: str, key: str) -> None:
    answer = requests.post(
        f"{tier_url}/api/v1/services/chat/rollout",
        json={"profile_name": "stable", "idempotency_key": key},
        timeout=30,
    )
    assert answer.status_code == 200, answer.text


@pytest.mark.parametrize("crash_point", ["after-start", "after-execute"])
def test_restart_in_the_middle_of_a_rollback(tmp_path: Path, crash_point: str) -> None:
    with running_tier(tmp_path) as tier_url:
        roll_out(tier_url, "setup-r2")
        roll_out(tier_url, "setup-r3")
        assert tier_history(tier_url)[0] == 3

        crashed = run_driver(tmp_path, tier_url, f"dispatch-crash-{crash_point}")
        assert crashed.returncode == CRASH_EXIT, crashed.stderr
        active, revisions = tier_history(tier_url)
        # after-start: the tier was never called; after-execute: it rolled back, the journal does not know.
        assert active == (3 if crash_point == "after-start" else 2)
        with Journal(tmp_path / "journal.db") as journal:
            [pending] = journal.pending_actions()
            assert (pending.type.value, pending.status, pending.attempts) == (
                "rollback",
                ActionStatus.STARTED,
                1,
            )

        resumed = run_driver(tmp_path, tier_url, "resume")
        assert resumed.returncode == 0, resumed.stderr
        [record] = json.loads(resumed.stdout)
        assert record["type"] == "rollback" and record["status"] == "succeeded"
        assert record["result"]["detail"]["replayed"] is (crash_point == "after-execute")

        # The tier: exactly one rollback performed (r3 left and marked bad, r2 active, r1 untouched).
        active, revisions = tier_history(tier_url)
        assert active == 2
        assert [(r["revision"], r["bad"]) for r in revisions] == [(1, False), (2, False), (3, True)]

        # The journal: exactly one rollback action, succeeded, both attempts counted; the annotation once.
        with Journal(tmp_path / "journal.db") as journal:
            rollbacks = [r for r in journal.all_actions() if r.type.value == "rollback"]
            assert len(rollbacks) == 1
            assert rollbacks[0].status is ActionStatus.SUCCEEDED and rollbacks[0].attempts == 2
            assert rollbacks[0].result is not None and rollbacks[0].result["detail"]["to_revision"] == 2
            assert journal.pending_actions() == []
        annotations = (tmp_path / "annotations.jsonl").read_text().splitlines()
        assert len(annotations) == 1

        # A third process: nothing left to do, nothing changes.
        again = run_driver(tmp_path, tier_url, "resume")
        assert again.returncode == 0, again.stderr
        assert json.loads(again.stdout) == []
        assert tier_history(tier_url) == (active, revisions)


def test_a_replayed_decision_after_restart_does_not_roll_back_again(tmp_path: Path) -> None:
    """A crash before the results were journaled re-derives the same decision: dispatching it is a no-op."""
    with running_tier(tmp_path) as tier_url:
        roll_out(tier_url, "setup-r2")
        roll_out(tier_url, "setup-r3")
        first = run_driver(tmp_path, tier_url, "dispatch-complete")
        assert first.returncode == 0, first.stderr
        assert [r["status"] for r in json.loads(first.stdout)] == ["succeeded", "succeeded"]
        second = run_driver(tmp_path, tier_url, "dispatch-complete")  # the same decision id and keys
        assert second.returncode == 0, second.stderr
        assert [(r["status"], r["attempts"]) for r in json.loads(second.stdout)] == [("succeeded", 1)] * 2
        active, revisions = tier_history(tier_url)
        assert active == 2 and [r["bad"] for r in revisions] == [False, False, True]
