"""The action times a leader hands to its successor: encoding (bounded), decoding (errors as reasons), merging."""

from __future__ import annotations

import json

import pytest

from tailguard.controller.core.engine import PolicyState, with_action_times
from tailguard.controller.core.handover import (
    HANDOVER_MAX_BYTES,
    ActionTimes,
    HandoverError,
    decode_action_times,
    decode_pending,
    encode_action_times,
    encode_pending,
    merge_action_times,
)
from tailguard.controller.core.model import target_key

CHAT, CODE = target_key({"service": "chat"}), target_key({"service": "code", "namespace": "llm"})


def test_round_trip_at_millisecond_precision() -> None:
    times: ActionTimes = {"queue-scale": {CHAT: (1000.0, 1300.1234)}, "p99-rollback": {CODE: (1200.5,)}}
    text, dropped = encode_action_times(times)
    assert dropped == 0
    assert decode_action_times(text) == {"queue-scale": {CHAT: (1000.0, 1300.123)}, "p99-rollback": {CODE: (1200.5,)}}
    assert json.loads(text)["v"] == 1


def test_over_the_size_limit_the_targets_with_the_oldest_actions_are_left_out() -> None:
    times = {"p": {target_key({"service": f"svc-{i:04d}"}): (float(i),) for i in range(2000)}}
    text, dropped = encode_action_times(times, max_bytes=4096)
    assert len(text.encode()) <= 4096 and dropped > 0
    kept = decode_action_times(text)["p"]
    assert len(kept) + dropped == 2000
    newest_left_out = max(i for i in range(2000) if target_key({"service": f"svc-{i:04d}"}) not in kept)
    assert min(stamps[0] for stamps in kept.values()) > newest_left_out  # a recent action is what counts
    # The default limit leaves room for other annotations (256 KiB for all of them).
    assert HANDOVER_MAX_BYTES <= 128 * 1024


@pytest.mark.parametrize(
    ("text", "reason"),
    [
        ("not json", "not JSON"),
        ('{"v": 2, "policies": {}}', "version 2"),
        ('{"v": 1, "policies": {}, "extra": 1}', "extra"),
        ('{"v": 1, "policies": {"p": [{"target": [["service", "chat"]], "times": []}]}}', "policies.p.0.times"),
        ('{"v": 1, "policies": {"p": [{"target": "chat", "times": [1]}]}}', "policies.p.0.target"),
    ],
)
def test_an_unreadable_annotation_is_an_error_with_its_reason(text: str, reason: str) -> None:
    with pytest.raises(HandoverError, match=reason):
        decode_action_times(text)


def test_merging_counts_one_action_once_whichever_way_it_came() -> None:
    ours: ActionTimes = {"p": {CHAT: (1000.0001, 1500.0)}}
    handed_over: ActionTimes = {"p": {CHAT: (1000.0, 1200.0), CODE: (900.0,)}, "q": {CHAT: (10.0,)}}
    merged = merge_action_times(ours, handed_over)
    assert merged == {"p": {CHAT: (1000.0001, 1200.0, 1500.0), CODE: (900.0,)}, "q": {CHAT: (10.0,)}}
    state = with_action_times(PolicyState(actions_at={CHAT: (1000.0001,)}), handed_over["p"])
    assert state.actions_at == {CHAT: (1000.0001, 1200.0), CODE: (900.0,)}


# ----- unfinished actions (issue 23, item 5) ----------------------------------------------------------------


def test_pending_actions_round_trip_and_stay_within_their_bound() -> None:
    entries = [{"action": {"idempotency_key": f"d{i}:fire:0", "pad": "x" * 400}, "decision": {"id": f"d{i}"}}
               for i in range(10)]  # fmt: skip
    text, dropped = encode_pending(entries)
    assert dropped == 0 and decode_pending(text) == entries
    small, dropped = encode_pending(entries, max_bytes=1500)
    assert len(small) <= 1500 and dropped == 7
    assert [e["decision"]["id"] for e in decode_pending(small)] == ["d0", "d1", "d2"]  # the newest (first) kept


@pytest.mark.parametrize(
    ("text", "reason"),
    [
        ("{", "not JSON"),
        ('{"v": 2, "actions": []}', "version 2"),
        ('{"v": 1, "actions": [{"action": {}}]}', "decision"),
    ],
)
def test_unreadable_pending_actions_are_a_handover_error(text: str, reason: str) -> None:
    with pytest.raises(HandoverError, match=reason):
        decode_pending(text)
