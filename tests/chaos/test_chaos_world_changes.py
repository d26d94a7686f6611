"""Issue 23: kills during an Argo CD rollback, and between the kill and the restart the world changes. Seeded, in
process, against the spec-validating fake Argo CD (every request recorded).

Each episode: process 1 commits a firing decision (an unattributed rollback, as the shipped p99-rollback.yaml) and
dispatches it, dying at a random crash point (tests/chaos/kills.py: a dispatcher hook, after the plan included, a
clock sleep, an answer from Argo CD after it acted). Then one of:

* `none`: nothing changes;
* `fix`: an on-call engineer deploys fix4 (the breach ends);
* `second-bad`: someone deploys bad5 (the breach goes on);
* `recovery`: the breach ends on its own;
* `late`: the restart comes after the action's deadline.

Process 2 starts as the controller does: it resumes what process 1 left, then evaluates (the journal commits the
condition as the world now makes it) and retries what waits. Wrong writes counted over all episodes (all must be
zero): a rollback accepted twice, to another revision than good2, or sent after the world changed (the human's
revision, or a breach the evaluation saw end), or after the deadline.
"""

from __future__ import annotations

import random
import time
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tailguard.controller.adapters.argocd.client import ArgoCDClient
from tailguard.controller.adapters.argocd.settings import ArgoCDApp
from tailguard.controller.adapters.rollback.argocd import ArgoCDRollback, BadRevisionRecord
from tailguard.controller.adapters.stores.journal import Journal
from tailguard.controller.core.actions import TERMINAL_STATUSES
from tailguard.controller.loop.dispatcher import Actuators, Dispatcher, GlobalLimits
from tailguard.controller.testing import condition_state, make_decision
from tests.chaos.kills import Chaos, CrashingClock, CrashingSession, SimulatedCrash
from tests.support.fake_argocd import FakeArgoCD, application

T0 = 1_767_225_600.0
GOOD1, GOOD2, BAD3, FIX4, BAD5 = "1111aaaa", "2222bbbb", "3333cccc", "4444dddd", "5555eeee"
TOKEN = "argocd-test-token"
DEADLINE = 45.0
WORLDS = ("none", "fix", "second-bad", "recovery", "late")
EPISODES_PER_WORLD = 24  # 120 episodes in all
COUNTS: Counter[str] = Counter()


@pytest.fixture(scope="module")
def argocd() -> Iterator[FakeArgoCD]:
    with FakeArgoCD() as fake:
        yield fake


def reset(fake: FakeArgoCD, rng: random.Random) -> None:
    with fake.lock:
        fake.state.pending.clear()
        fake.state.progress_polls = rng.randint(0, 2)
    fake.add_app(application("chat", [(GOOD1, T0 - 7200), (GOOD2, T0 - 3600), (BAD3, T0 - 600)]))


def human_deploys(fake: FakeArgoCD, revision: str, at: float) -> None:
    """A human sync to `revision` (after any operation tailguard started has finished or been overridden)."""
    with fake.lock:
        fake.state.pending.pop("chat", None)
        status = fake.state.apps["chat"]["status"]
        history = status["history"]
        history.append({"id": max(int(e["id"]) for e in history) + 1, "revision": revision,
                        "deployedAt": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(at)), "source": {}})  # fmt: skip
        status["sync"] = {"status": "Synced", "revision": revision}
        status["operationState"] = {"phase": "Succeeded", "message": "synced by a human",
                                    "operation": {"sync": {"revision": revision}}}  # fmt: skip


def process(fake: FakeArgoCD, tmp: Path, chaos: Chaos, now: float) -> tuple[Dispatcher, Journal]:
    clock = CrashingClock(chaos, now)
    client = ArgoCDClient(fake.url, clock=clock, token=lambda: TOKEN, timeout=5.0, retries=2, backoff=0.1,
                          session=CrashingSession(chaos))  # fmt: skip
    rollback = ArgoCDRollback(client, {"chat": ArgoCDApp(name="chat")}, clock=clock, wait_timeout=120.0,
                              poll_interval=5.0, record=BadRevisionRecord(tmp / "argocd-bad.json"))  # fmt: skip
    journal = Journal(tmp / "journal.db")
    dispatcher = Dispatcher(journal, Actuators(rollback=rollback), clock, GlobalLimits(), crash_hook=chaos.hook,
                            deadline_for=lambda _policy: DEADLINE)  # fmt: skip
    return dispatcher, journal


def accepted_posts(fake: FakeArgoCD, since: int) -> list[Any]:
    return [r for r in fake.state.requests[since:] if r.method == "POST" and r.path.endswith("/rollback")
            and r.status == 200]  # fmt: skip


def episode(fake: FakeArgoCD, tmp: Path, world: str, seed: int) -> list[str]:
    """One episode; returns the wrong writes it saw (each a sentence)."""
    rng = random.Random(f"{world}-{seed}")
    reset(fake, rng)
    start = len(fake.state.requests)
    decision = make_decision([("rollback", {"service": "chat"})], onset=T0 - 30, at=T0)
    chaos = Chaos(rng.randint(1, 10))
    dispatcher, journal = process(fake, tmp, chaos, T0)
    try:
        journal.commit_evaluation(decision.policy, condition_state(decision), [decision], T0)
        dispatcher.dispatch(decision)
    except SimulatedCrash:
        COUNTS["kills"] += 1
    finally:
        journal.close()
    changed_at = len(fake.state.requests)
    if world == "fix":
        human_deploys(fake, FIX4, T0 + 10)
    elif world == "second-bad":
        human_deploys(fake, BAD5, T0 + 10)
    restart = T0 + (DEADLINE + 60 if world == "late" else 20)
    dispatcher, journal = process(fake, tmp, Chaos(None), restart)
    try:
        resumed_at = len(fake.state.requests)
        dispatcher.resume()
        evaluated_at = len(fake.state.requests)
        breach_over = world in ("fix", "recovery")
        state = condition_state(decision, "ok" if breach_over else "firing")
        journal.commit_evaluation(decision.policy, state, [], restart + 1)
        dispatcher.retry_deferred(decision.policy, state)
        [record] = journal.actions_for(decision.id)
    finally:
        journal.close()
    wrong: list[str] = []
    posts = accepted_posts(fake, start)
    if len(posts) > 1:
        wrong.append(f"{len(posts)} rollbacks accepted")
    if any(post.body["id"] != 2 for post in posts):
        wrong.append(f"a rollback to another revision than good2: {[post.body for post in posts]}")
    if world in ("fix", "second-bad") and accepted_posts(fake, changed_at):
        wrong.append("a rollback sent after a human deployed another revision")
    if world == "recovery" and accepted_posts(fake, evaluated_at):
        wrong.append("a rollback sent after an evaluation saw the breach end")
    if world == "late" and accepted_posts(fake, resumed_at):
        wrong.append("a rollback sent after its deadline")
    if record.status not in TERMINAL_STATUSES:
        wrong.append(f"the action did not end: {record.status.value}")
    status = fake.app("chat")["status"]
    running = status["sync"]["revision"]
    if status["operationState"]["phase"] == "Running":  # a rollback sent before the kill stays with Argo CD
        running = status["operationState"]["operation"]["sync"]["revision"]
    expected = {"fix": {FIX4}, "second-bad": {BAD5}}.get(world, {GOOD2} if posts else {BAD3})
    if running not in expected:
        wrong.append(f"the application runs {running}, expected {expected}")
    if world == "none" and running != GOOD2:
        wrong.append("the rollback was lost")
    if fake.state.spec_violations:
        wrong.append(f"spec violations: {fake.state.spec_violations}")
    COUNTS["episodes"] += 1
    COUNTS[f"{world}:{record.status.value}"] += 1
    COUNTS["rollbacks"] += len(posts)
    return [f"{world} seed {seed} (died at {chaos.died_at}): {sentence}" for sentence in wrong]


@pytest.mark.parametrize("world", WORLDS)
def test_kills_and_a_changing_world_never_make_a_wrong_or_duplicate_write(
    world: str, argocd: FakeArgoCD, tmp_path: Path
) -> None:
    wrong: list[str] = []
    before = COUNTS["episodes"]
    for seed in range(EPISODES_PER_WORLD):
        folder = tmp_path / f"episode-{seed}"
        folder.mkdir()
        wrong += episode(argocd, folder, world, seed)
    assert wrong == [], "\n".join(wrong)
    assert COUNTS["episodes"] - before == EPISODES_PER_WORLD  # every episode ran to its checks
    COUNTS["worlds"] += 1


def test_the_run_has_at_least_100_episodes() -> None:
    assert len(WORLDS) * EPISODES_PER_WORLD >= 100


def test_the_episodes_were_counted() -> None:
    """Prints the tally (pytest -s): episodes, kills, rollbacks, and how the actions ended per world."""
    print(f"\nworld-change chaos: {dict(sorted(COUNTS.items()))}")
    # Under pytest-xdist the worlds may run in other worker processes: the whole tally is this process's only when
    # every world ran here (file order: the parametrized runs come first).
    if COUNTS["worlds"] == len(WORLDS):
        assert COUNTS["episodes"] >= 100 and COUNTS["kills"] > 0
