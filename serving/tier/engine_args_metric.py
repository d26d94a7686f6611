"""`tailguard_serving_engine_arg`: the numeric engine arguments of every replica the tier lists.

vLLM exports its KV-cache configuration (`vllm:cache_config_info`, as label values, and only once the
replica answers) but not its scheduler limits: nothing vLLM exports says that a replica runs with
`max_num_seqs 2`. The tier knows it from the revision's profile from the moment it lists a replica, 17-48 s
before vLLM answers, so the router's /metrics carries one gauge per listed replica and numeric argument.
The SLA model reads it (predictors/features.py, `seq_limit_min` and `load_over_seq_limit`) to see a rollout
whose limits cannot carry the current load before that rollout takes traffic.

Labels are the router's (`service`, `version`) plus `replica` and `arg`; the scrape job adds `namespace`, as
it does for the router's other series. The virtual-time dataset generator (serving/lab/dataset.py) exports
the same family from the same collector.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass

from prometheus_client.core import GaugeMetricFamily
from prometheus_client.registry import Collector

from tailguard.serving.tier.profiles import EngineArgs

ENGINE_ARG_METRIC = "tailguard_serving_engine_arg"
# The numeric arguments that bound a replica's capacity; an argument left unset (None) is not exported.
NUMERIC_ENGINE_ARGS = (
    "max_num_seqs",
    "max_num_batched_tokens",
    "gpu_memory_utilization",
    "max_model_len",
    "block_size",
    "num_gpu_blocks_override",
)


@dataclass(frozen=True)
class ListedReplica:
    """A replica the tier's service discovery lists (starting, warming up or serving) and its engine args."""

    service: str
    version: str
    replica: str
    args: EngineArgs


class EngineArgCollector(Collector):
    """Collects `tailguard_serving_engine_arg` from `listed()` at scrape time (no state of its own)."""

    def __init__(self, listed: Callable[[], Iterable[ListedReplica]]):
        self._listed = listed

    def collect(self) -> Iterator[GaugeMetricFamily]:
        family = GaugeMetricFamily(
            ENGINE_ARG_METRIC,
            "Numeric vLLM engine argument a replica listed by the tier was started with (from its revision's profile).",
            labels=["service", "version", "replica", "arg"],
        )
        for listed in self._listed():
            for arg in NUMERIC_ENGINE_ARGS:
                value = getattr(listed.args, arg)
                if value is not None:
                    family.add_metric([listed.service, listed.version, listed.replica, arg], float(value))
        yield family
