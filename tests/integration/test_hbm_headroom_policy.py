"""The hbm-headroom example policy on DCGM expositions and on the simulator's HBM model, in a real Prometheus.

History (promtool backfill, 15 s steps): the DCGM gauges of a node serving `chat` (canary at
gpu_memory_utilization 0.98, stable at 0.90) and both versions' KV-cache usage ramping from 40% to 100% (where
vLLM starts preempting), then falling back. The policy must fire on the canary only (no HBM headroom), after its
KV cache passes 85% and before it reaches 100%; scale out without a rollout, shift the canary's traffic with one;
and resolve once the KV cache empties. The DCGM series come from the recorded expositions of both exporter
generations (DCGM_FI_DEV_FB_* and dcgm_fb_*; also both at once, as during an exporter upgrade), relabelled as
Prometheus would, and from serving.vllm_metrics.HbmModel/DcgmCollector driven through the same ramp.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

import pytest
import yaml
from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.parser import text_string_to_metric_families

from controller.adapters.metrics.prometheus import PrometheusSettings, PrometheusSource
from controller.core.attribution import Rollout
from controller.core.policy import Policy
from controller.core.policy_files import load_policies
from controller.kit.clock import ManualClock
from controller.tools.backtest import BacktestReport, run_backtest
from serving.profiles import resolve_profile
from serving.promstack import PrometheusServer, backfill_openmetrics
from serving.vllm_metrics import DcgmCollector, HbmModel
from tests.support.openmetrics import OpenMetricsWriter

pytestmark = pytest.mark.integration

ROOT = Path(__file__).resolve().parents[2]
POLICY_FILE = ROOT / "rules" / "examples" / "hbm-headroom.yaml"
FIXTURES = ROOT / "tests" / "fixtures" / "dcgm"
NEW_EXPOSITION = FIXTURES / "dcgm-exporter-4.2.3-kubernetes-pod-labels.txt"
OLD_EXPOSITION = FIXTURES / "dcgm-exporter-1.7.2-pod-mapping.txt"
SERVICE_MONITOR = ROOT / "serving" / "manifests" / "dcgm-exporter" / "servicemonitor.yaml"
# The 1.x exporter has no pod labels: the Deployment's name in the pod name gives service and version.
OLD_RELABELINGS: list[dict[str, Any]] = [
    {"sourceLabels": ["pod_namespace"], "targetLabel": "namespace", "action": "replace", "regex": "(.+)"},
    {"sourceLabels": ["pod_name"], "targetLabel": "service", "regex": "(.+)-(stable|canary)-[a-z0-9]+-[a-z0-9]+",
     "replacement": "$1"},
    {"sourceLabels": ["pod_name"], "targetLabel": "version", "regex": "(.+)-(stable|canary)-[a-z0-9]+-[a-z0-9]+",
     "replacement": "$2"},
]  # fmt: skip

T0 = 1_700_000_000.0
STEP = 15.0
STEPS = 161  # 40 minutes
KV_START, KV_PER_STEP = 0.40, 0.01  # above 0.85 from step 46, 1.0 (preemptions) from step 60
KV_DROP_AT = 100  # the burst ends: KV cache back to 30%
FULL_KV_AT = T0 + 60 * STEP


def kv_usage(step: int) -> float:
    return 0.30 if step >= KV_DROP_AT else min(1.0, round(KV_START + KV_PER_STEP * step, 4))


def times() -> list[float]:
    return [T0 + i * STEP for i in range(STEPS)]


def relabel(labels: Mapping[str, str], name: str, rules: Sequence[Mapping[str, Any]]) -> dict[str, str] | None:
    """Prometheus metric relabelling (replace, labeldrop, keep): None when a keep rule drops the series."""
    out = dict(labels, __name__=name)
    for rule in rules:
        action = rule.get("action", "replace")
        regex = re.compile(f"^(?:{rule.get('regex', '(.*)')})$")
        if action == "labeldrop":
            out = {k: v for k, v in out.items() if not regex.match(k)}
            continue
        value = ";".join(out.get(source, "") for source in rule.get("sourceLabels", []))
        match = regex.match(value)
        if action == "keep":
            if not match:
                return None
        elif action == "replace" and match:
            replacement = re.sub(r"\$(\d+)", r"\\\1", rule.get("replacement", "$1"))
            out[rule["targetLabel"]] = match.expand(replacement)
    out.pop("__name__")
    return out


def shipped_relabelings() -> list[dict[str, Any]]:
    monitor = yaml.safe_load(SERVICE_MONITOR.read_text(encoding="utf-8"))
    (endpoint,) = monitor["spec"]["endpoints"]
    return list(endpoint["metricRelabelings"])


Exposition = Callable[[int, float], str]  # (step, time) -> the exporter's /metrics text at that time


def add_exposition(writer: OpenMetricsWriter, exposition: Exposition, rules: Sequence[Mapping[str, Any]]) -> int:
    """Every gauge sample of the exposition at every step, relabelled; returns how many series."""
    series: dict[tuple[str, tuple[tuple[str, str], ...]], list[tuple[float, float]]] = {}
    for step, at in enumerate(times()):
        for family in text_string_to_metric_families(exposition(step, at)):
            for sample in family.samples:
                labels = relabel(sample.labels, sample.name, rules)
                if labels is not None:
                    series.setdefault((sample.name, tuple(sorted(labels.items()))), []).append((at, sample.value))
    for (name, labels), points in series.items():
        writer.gauge(name, dict(labels), points)
    return len(series)


def add_kv_usage(writer: OpenMetricsWriter, names: Sequence[str]) -> None:
    for version in ("canary", "stable"):
        labels = {"namespace": "llm", "service": "chat", "version": version, "model_name": "llama-3-8b-instruct"}
        for name in names:
            writer.gauge(name, labels, [(at, kv_usage(step)) for step, at in enumerate(times())])


def policy() -> Policy:
    loaded, errors = load_policies([POLICY_FILE])
    assert errors == []
    (item,) = loaded
    return item.policy


def backtest(tmp_path: Path, writer: OpenMetricsWriter, rollouts: Sequence[Rollout] = ()) -> BacktestReport:
    backfill_openmetrics(writer.render(), tmp_path / "data", expected_samples=writer.sample_count)
    with (
        PrometheusServer(data_dir=tmp_path / "data", workdir=tmp_path / "run").start() as server,
        PrometheusSource(PrometheusSettings(url=server.url), ManualClock()) as source,
    ):
        return run_backtest(source, [policy()], T0, T0 + (STEPS - 1) * STEP, None, rollouts=rollouts)


def fixture_text(path: Path) -> Exposition:
    text = path.read_text(encoding="utf-8")
    return lambda step, at: text


def assert_fires_on_the_canary_before_preemptions(report: BacktestReport, branch_action: str) -> dict[str, Any]:
    assert report.signal_errors == []
    # The policy's own decisions; the history does not react to the scale, so its incident also escalates (the
    # default ladder's notification, an entry of its own: tests/integration/test_backtest_prometheus.py).
    entries = [entry.to_json() for entry in report.decisions if entry.policy_fired]
    assert [e["target"] for e in entries] == [{"service": "chat", "version": "canary"}], entries
    (entry,) = entries
    # KV above 85% from step 46: two breaching evaluations fire at step 47, long before 100% (step 60).
    assert entry["onset"] == T0 + 46 * STEP
    assert entry["fired_at"] == T0 + 47 * STEP
    assert entry["fired_at"] < FULL_KV_AT
    assert entry["peak"] is not None and 0.95 < entry["peak"] < 1.0
    fired = [a for a in entry["actions"] if a["on"] == "fire"]
    assert [a["type"] for a in fired] == [branch_action, "annotate"]
    assert fired[0]["params"]["service"] == "chat"
    # The burst ends at step 100; recovery needs 5 minutes (21 evaluations) under the threshold.
    assert entry["resolved_at"] == T0 + (KV_DROP_AT + 20) * STEP
    assert [a["type"] for a in entry["actions"] if a["on"] == "resolve"] == ["restore", "annotate"]
    return entry


@pytest.mark.parametrize(
    ("expositions", "kv_names"),
    [
        pytest.param([(NEW_EXPOSITION, "new")], ["vllm:kv_cache_usage_perc"], id="dcgm-2.x+-names"),
        pytest.param([(OLD_EXPOSITION, "old")], ["vllm:gpu_cache_usage_perc"], id="dcgm-1.x-names"),
        pytest.param(
            [(NEW_EXPOSITION, "new"), (OLD_EXPOSITION, "old")],
            ["vllm:kv_cache_usage_perc", "vllm:gpu_cache_usage_perc"],
            id="both-exporters-and-both-kv-names",
        ),
    ],
)
def test_recorded_dcgm_expositions_scale_out_the_canary_before_it_preempts(
    tmp_path: Path, expositions: list[tuple[Path, str]], kv_names: list[str]
) -> None:
    writer = OpenMetricsWriter()
    for path, generation in expositions:
        rules = shipped_relabelings() if generation == "new" else OLD_RELABELINGS
        assert add_exposition(writer, fixture_text(path), rules) >= 8
    add_kv_usage(writer, kv_names)
    entry = assert_fires_on_the_canary_before_preemptions(backtest(tmp_path, writer), "scale")
    # The canary's fullest GPU: 79870 / (79870 + 1093).
    assert entry["peak"] == pytest.approx(79870 / 80963, abs=1e-6)


def test_a_recent_rollout_of_the_canary_shifts_its_traffic_instead(tmp_path: Path) -> None:
    writer = OpenMetricsWriter()
    add_exposition(writer, fixture_text(NEW_EXPOSITION), shipped_relabelings())
    add_kv_usage(writer, ["vllm:kv_cache_usage_perc"])
    rollout = Rollout(
        labels={"namespace": "llm", "service": "chat", "version": "canary"},
        revision="r8",
        previous_revision="r7",
        at=T0 + 30 * STEP,
        source="argocd",
        diff={"gpu_memory_utilization": {"from": 0.9, "to": 0.98}},
    )
    entry = assert_fires_on_the_canary_before_preemptions(backtest(tmp_path, writer, [rollout]), "shift_traffic")
    shift = next(a for a in entry["actions"] if a["type"] == "shift_traffic")
    assert shift["params"]["version"] == "canary" and shift["params"]["weight"] == 10


def simulated_exposition(profile_name: str, version: str) -> Exposition:
    """The simulator's DCGM gauges for one replica, its HBM model stepped with the ramp's batch and KV use."""
    profile = resolve_profile(profile_name)
    clock = [T0]
    hbm = HbmModel(profile, lambda: clock[0])
    registry = CollectorRegistry()
    registry.register(DcgmCollector(hbm, "gpu-node-07"))
    kv_capacity = profile.num_gpu_blocks() * profile.engineArgs.block_size

    def exposition(step: int, at: float) -> str:
        clock[0] = at
        hbm.record_step(at, profile.engineArgs.max_num_batched_tokens, int(kv_capacity * kv_usage(step)))
        text = generate_latest(registry).decode()
        # What --kubernetes --kubernetes-enable-pod-labels add for the pod that holds the GPU.
        pod = f'namespace="llm",pod="chat-{version}-0",pod_label_service="chat",pod_label_version="{version}"'
        return re.sub(r"\{(.*)\}", lambda m: "{" + m.group(1) + "," + pod + "}", text)

    return exposition


def test_the_simulators_hbm_model_fires_on_the_high_memory_profile_only(tmp_path: Path) -> None:
    writer = OpenMetricsWriter()
    add_exposition(writer, simulated_exposition("high-memory", "canary"), shipped_relabelings())
    add_exposition(writer, simulated_exposition("stable", "stable"), shipped_relabelings())
    add_kv_usage(writer, ["vllm:kv_cache_usage_perc"])
    entry = assert_fires_on_the_canary_before_preemptions(backtest(tmp_path, writer), "scale")
    assert entry["peak"] > 0.98  # 0.98 preallocated plus the activations of a full batch


def test_relabelling_gives_the_dcgm_series_the_policys_labels() -> None:
    families = text_string_to_metric_families(NEW_EXPOSITION.read_text())
    (family,) = [f for f in families if f.name == "DCGM_FI_DEV_FB_USED"]
    labels = relabel(family.samples[0].labels, family.name, shipped_relabelings())
    assert labels is not None
    assert (labels["namespace"], labels["service"], labels["version"]) == ("llm", "chat", "canary")
    assert not any(key.startswith("pod_label_") for key in labels)
    (old,) = [f for f in text_string_to_metric_families(OLD_EXPOSITION.read_text()) if f.name == "dcgm_fb_used"]
    labels = relabel(old.samples[2].labels, old.name, OLD_RELABELINGS)
    assert labels is not None
    assert (labels["namespace"], labels["service"], labels["version"]) == ("llm", "chat", "stable")
