"""Shared pieces of the kill chaos suite (tests/chaos/test_chaos_action_kills*.py): a simulated crash at a chosen
point of a process (a BaseException nothing in the controller catches, so the "process" stops exactly there, its
journal left as a real kill leaves it: committed transactions only), and the crash points: every dispatcher hook,
every clock sleep (a sync poll, a ramp hold, a retry backoff), every HTTP answer from Argo CD or Kubernetes
(the server applied the request; the answer is lost)."""

from __future__ import annotations

import random
from typing import Any

import requests

from tailguard.controller.kit.clock import ManualClock


class SimulatedCrash(BaseException):
    """The process died here (BaseException: no `except Exception` in the controller swallows it)."""


class Chaos:
    """Counts crash points as the process passes them and dies at the `crash_at`-th (None: never)."""

    def __init__(self, crash_at: int | None) -> None:
        self.crash_at = crash_at
        self.passed = 0
        self.died_at: str | None = None

    def point(self, where: str) -> None:
        self.passed += 1
        if self.crash_at is not None and self.passed == self.crash_at:
            self.died_at = where
            raise SimulatedCrash(where)

    def hook(self, point: str, record: Any) -> None:
        self.point(f"dispatcher {point} {record.type.value}")


class CrashingClock(ManualClock):
    """A ManualClock whose every sleep is a crash point (before the wait)."""

    def __init__(self, chaos: Chaos, start: float) -> None:
        super().__init__(start)
        self.chaos = chaos

    def sleep(self, seconds: float) -> None:
        self.chaos.point(f"sleep {seconds:g}s")
        super().sleep(seconds)


class CrashingSession(requests.Session):
    """A requests session whose every answer is a crash point: the server acted, the client never learns."""

    def __init__(self, chaos: Chaos) -> None:
        super().__init__()
        self.chaos = chaos

    def request(self, method: str | bytes, url: str | bytes, *args: Any, **kwargs: Any) -> requests.Response:  # type: ignore[override]
        answer = super().request(method, url, *args, **kwargs)
        self.chaos.point(f"answer to {method!r} {url!r}")
        return answer


def crashing_api_client(api_client: Any, chaos: Chaos) -> Any:
    """A kubernetes ApiClient whose every answer is a crash point (after the fake server applied the request)."""
    call = api_client.call_api

    def call_api(*args: Any, **kwargs: Any) -> Any:
        answer = call(*args, **kwargs)
        chaos.point(f"kubernetes answer to {args[1] if len(args) > 1 else '?'} {args[0] if args else '?'}")
        return answer

    api_client.call_api = call_api
    return api_client


def crash_plan(rng: random.Random, kills: int, span: int) -> list[int | None]:
    """The crash points of an episode's runs: `kills` runs that die at a random point in 1..span, then one that
    runs to the end (a run that finishes before its point simply does not die)."""
    return [rng.randint(1, span) for _ in range(kills)] + [None]
