"""The recorder's bad-config rollouts against a real tier process (simulator replicas, no vLLM): a canary rollout
at 1%, its promote to all the traffic, the rollback, then a second round; the tier's final state and the rollouts
recording.json lists (tailguard.serving.lab.recording `_act`, `bad_config_rollouts`)."""

from __future__ import annotations

import asyncio
import time
from pathlib import Path
from typing import Any

import pytest
import requests
import yaml

from tailguard.serving.lab.dataset import tier_process
from tailguard.serving.lab.recording import RecordingScenario, _act, bad_config_rollouts

pytestmark = pytest.mark.integration


def _scenario() -> RecordingScenario:
    bad: dict[str, Any] = {"action": "rollout", "profile": "bad-max-num-seqs", "canary_weight": 1}
    return RecordingScenario.model_validate(
        {
            "duration_s": 30,
            "phases": [{"start_s": 0, "end_s": 30, "rate_from": 1, "rate_to": 1}],
            "actions": [
                {**bad, "at_s": 0.2, "engine_args": {"max_num_seqs": 1}},
                {"at_s": 1.0, "action": "promote", "latest_s": 5},
                {"at_s": 1.0, "action": "rollback", "after_previous_s": 1.0},
                {**bad, "at_s": 1.0, "engine_args": {"max_num_seqs": 2}, "after_previous_s": 0.5},
                {"at_s": 1.0, "action": "promote", "latest_s": 8},
                {"at_s": 1.0, "action": "rollback", "after_previous_s": 1.0},
            ],
        }
    )


def test_canary_promote_and_rollback_twice_leave_the_stable_version_serving_alone(tmp_path: Path) -> None:
    config = {
        "ports": {"control": 0, "router": 0},
        "services": [{"name": "chat", "namespace": "llm", "model": "m", "profile": "stable", "replicas": 2}],
    }
    (tmp_path / "tier.yaml").write_text(yaml.safe_dump(config), encoding="utf-8")
    tier = tier_process(tmp_path / "tier.yaml", tmp_path)
    tier.start()
    try:
        ready = tier.wait_ready(60.0)
        timeline: list[dict[str, Any]] = []
        asyncio.run(_act(ready["control_url"], _scenario(), time.time(), timeline))
        service = requests.get(f"{ready['control_url']}/api/v1/services/chat", timeout=10).json()
        revisions = requests.get(f"{ready['control_url']}/api/v1/services/chat/revisions", timeout=10).json()
    finally:
        tier.stop(grace=10.0)
    assert [(e["action"], e["status"]) for e in timeline] == [
        ("rollout", 200),
        ("promote", 200),
        ("rollback", 200),
        ("rollout", 200),
        ("promote", 200),
        ("rollback", 200),
    ]
    assert timeline[0]["answer"]["version"] == "r2" and timeline[3]["answer"]["version"] == "r3"
    assert timeline[1]["answer"]["weights"] == {"r2": 100, "r1": 0}
    assert timeline[4]["answer"]["weights"] == {"r3": 100, "r1": 0}
    assert [(r["revision"], r["bad"]) for r in revisions] == [(1, False), (2, True), (3, True)]
    assert [(v["version"], v["weight"], len(v["replicas"])) for v in service["versions"]] == [("r1", 100, 2)]
    # The rollback waited for its delay after the promote was answered.
    assert timeline[2]["sent_at"] >= timeline[1]["answered_at"] + 1.0
    rollouts = bad_config_rollouts(timeline)
    assert [(r["took_traffic_at"], r["rolled_back_at"]) for r in rollouts] == [
        (timeline[1]["answered_at"], timeline[2]["sent_at"]),
        (timeline[4]["answered_at"], timeline[5]["sent_at"]),
    ]


def test_a_promote_whose_canary_never_serves_is_skipped_not_sent() -> None:
    scenario = RecordingScenario.model_validate(
        {
            "duration_s": 5,
            "phases": [{"start_s": 0, "end_s": 5, "rate_from": 1, "rate_to": 1}],
            "actions": [{"at_s": 0.0, "action": "promote", "latest_s": 1.0}],
        }
    )
    timeline: list[dict[str, Any]] = []
    # Nothing listens there: the canary's state cannot be read, so it never served.
    asyncio.run(_act("http://127.0.0.1:9", scenario, time.time(), timeline))
    assert timeline == [{"action": "promote", "at_s": 0.0, "skipped": "the newest version never served"}]
    assert bad_config_rollouts(timeline) == []
