"""tailguard_serving_engine_arg: one gauge per listed replica and numeric engine argument, read at scrape time."""

from __future__ import annotations

from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.parser import text_string_to_metric_families

from tailguard.serving.tier.engine_args_metric import (
    ENGINE_ARG_METRIC,
    NUMERIC_ENGINE_ARGS,
    EngineArgCollector,
    ListedReplica,
)
from tailguard.serving.tier.profiles import EngineArgs


def _samples(registry: CollectorRegistry) -> dict[tuple[str, str], float]:
    page = generate_latest(registry).decode()
    return {
        (s.labels["replica"], s.labels["arg"]): s.value
        for family in text_string_to_metric_families(page)
        for s in family.samples
        if s.name == ENGINE_ARG_METRIC
    }


def test_every_listed_replica_and_set_argument_is_exported_at_scrape_time() -> None:
    listed: list[ListedReplica] = []
    registry = CollectorRegistry()
    registry.register(EngineArgCollector(lambda: listed))
    assert _samples(registry) == {}

    listed.append(ListedReplica("chat", "r1", "chat-r1-0", EngineArgs(max_num_seqs=64)))
    listed.append(ListedReplica("chat", "r2", "chat-r2-1", EngineArgs(max_num_seqs=2, num_gpu_blocks_override=48)))
    samples = _samples(registry)
    assert samples[("chat-r1-0", "max_num_seqs")] == 64 and samples[("chat-r2-1", "max_num_seqs")] == 2
    assert samples[("chat-r2-1", "num_gpu_blocks_override")] == 48
    # An argument left unset is not exported (no made-up default for the KV pool size).
    assert ("chat-r1-0", "num_gpu_blocks_override") not in samples
    assert {arg for _, arg in samples} == set(NUMERIC_ENGINE_ARGS)

    listed.pop(0)  # no longer listed: its series goes with it
    assert {replica for replica, _ in _samples(registry)} == {"chat-r2-1"}
