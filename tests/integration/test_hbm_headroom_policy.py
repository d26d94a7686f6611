"""The hbm-headroom example policy on a recorded H200's DCGM series and on the simulator's HBM model, in Prometheus.

History (promtool backfill, 15 s steps): the DCGM gauges of two versions of `chat` and both versions' KV-cache
usage ramping from 40% to 100% (where vLLM starts preempting), then falling back. The stable version's GPU is the
recording of a real H200 under vLLM's memory model (tests/fixtures/dcgm/h200-2026-12-04/: NVML sampled under
dcgm-exporter's names; a 0.9 pool, ratio flat at 0.900 busy or idle), replayed on the 15 s grid with the pod
labels dcgm-exporter's --kubernetes adds. The canary runs gpu_memory_utilization 0.98 on the same card: no
recording exists at 0.98, so its series come from tailguard.serving.tier.vllm_metrics.HbmModel/DcgmCollector on the
H200-calibrated profile (checked against the recording's 0.9 pool in tests/unit/test_gpu_calibration.py).
The policy must fire on the canary only (no HBM headroom), after its KV cache passes 85% and before it reaches
100%; scale out without a rollout, shift the canary's traffic with one; and resolve once the KV cache empties.
Both exporter generations: the series under dcgm-exporter 2.x+ names (DCGM_FI_DEV_FB_*) and renamed as the 1.x
exporter publishes them (dcgm_fb_*, pod_name), and both at once, as during an exporter upgrade.
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

import pytest
import yaml
from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.parser import text_string_to_metric_families

from tailguard.controller.adapters.metrics.prometheus import PrometheusSettings, PrometheusSource
from tailguard.controller.core.attribution import Rollout
from tailguard.controller.core.policy import Policy
from tailguard.controller.core.policy_files import load_policies
from tailguard.controller.kit.clock import ManualClock
from tailguard.controller.tools.backtest import BacktestReport, run_backtest
from tailguard.serving.lab.promstack import PrometheusServer, backfill_openmetrics
from tailguard.serving.tier.profiles import EngineProfile, resolve_profile
from tailguard.serving.tier.vllm_metrics import DcgmCollector, HbmModel
from tests.support.openmetrics import OpenMetricsWriter

pytestmark = pytest.mark.integration

ROOT = Path(__file__).resolve().parents[2]
POLICY_FILE = ROOT / "rules" / "examples" / "hbm-headroom.yaml"
RECORDING = ROOT / "tests" / "fixtures" / "dcgm" / "h200-2026-12-04"
SERVICE_MONITOR = ROOT / "serving" / "tier" / "manifests" / "dcgm-exporter" / "servicemonitor.yaml"
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
    for (name, label_items), points in series.items():
        writer.gauge(name, dict(label_items), points)
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


POD_NAMES = {"canary": "chat-canary-6d9f7c8b5-x2kqp", "stable": "chat-stable-7b4c9d6f8-m8rtz"}


def with_pod_labels(text: str, version: str) -> str:
    """What dcgm-exporter's --kubernetes --kubernetes-enable-pod-labels add for the pod that holds the GPU."""
    pod = (f'container="vllm",namespace="llm",pod="{POD_NAMES[version]}",'
           f'pod_label_service="chat",pod_label_version="{version}"')  # fmt: skip
    return re.sub(r"\{(.*)\}", lambda m: "{" + m.group(1) + "," + pod + "}", text)


def recorded_rounds() -> list[str]:
    """The H200 recording as expositions, one per NVML sampling round (every family has one sample a round)."""
    families: dict[str, list[str]] = {}
    headers: dict[str, list[str]] = {}
    for line in (RECORDING / "hbm.om").read_text(encoding="utf-8").splitlines():
        if line.startswith("# EOF") or not line.strip():
            continue
        if line.startswith("#"):
            headers.setdefault(line.split()[2], []).append(line)
            continue
        name, rest = line.split("{", 1)
        labels, value, _timestamp = rest.rsplit(" ", 2)
        families.setdefault(name, []).append(f"{name}{{{labels} {value}")
    rounds = {len(samples) for samples in families.values()}
    assert len(rounds) == 1, rounds
    return ["\n".join(line for name in families for line in [*headers[name], families[name][i]]) + "\n"
            for i in range(rounds.pop())]  # fmt: skip


def recorded_exposition(version: str) -> Exposition:
    """The recorded H200 replayed on the 15 s grid: start-up (idle, weights, benchmark) one second a step, then the
    preallocated pool's rounds in turn (idle and decoding) for as long as the history lasts."""
    rounds = recorded_rounds()
    phases = json.loads((RECORDING / "phases.json").read_text(encoding="utf-8"))["phases"]
    starts = {name: at for at, name in phases}
    first = phases[0][0]
    per_second = len(rounds) / (phases[-1][0] - first)

    def index(at: float) -> int:
        return min(len(rounds) - 1, int((at - first) * per_second))

    startup = rounds[: index(starts["kv-pool-preallocated-0.9"]) : 4]
    settled = index(starts["kv-pool-preallocated-0.9"]) + 2  # half a second after the pool's allocation
    pool = rounds[settled : index(starts["pool-freed"])]
    replay = [with_pod_labels(text, version) for text in startup] + [with_pod_labels(text, version) for text in pool]
    head = len(startup)
    return lambda step, at: replay[step] if step < head else replay[head + (step - head) % len(pool)]


DCGM_1X_NAMES = {"DCGM_FI_DEV_FB_USED": "dcgm_fb_used", "DCGM_FI_DEV_FB_FREE": "dcgm_fb_free"}
DCGM_1X_DROPPED = ("pod_label_service", "pod_label_version", "modelName", "Hostname", "device")
DCGM_1X_LABELS = {"UUID": "uuid", "pod": "pod_name", "namespace": "pod_namespace", "container": "container_name"}


def as_dcgm_1x(exposition: Exposition) -> Exposition:
    """The same gauges as the 1.x exporter (gpu-monitoring-tools) publishes them: lower-case dcgm_* names (the FB
    fields the policy reads), `uuid`, and the pod as pod_name/pod_namespace/container_name, no pod labels."""

    def renamed(step: int, at: float) -> str:
        lines = []
        for family in text_string_to_metric_families(exposition(step, at)):
            if family.name not in DCGM_1X_NAMES:
                continue
            name = DCGM_1X_NAMES[family.name]
            lines += [f"# HELP {name} {family.documentation}", f"# TYPE {name} gauge"]
            for sample in family.samples:
                labels = {DCGM_1X_LABELS.get(k, k): v for k, v in sample.labels.items() if k not in DCGM_1X_DROPPED}
                text = ",".join(f'{k}="{v}"' for k, v in labels.items())
                lines.append(f"{name}{{{text}}} {sample.value}")
        return "\n".join(lines) + "\n"

    return renamed


def h200_at(gpu_memory_utilization: float) -> EngineProfile:
    calibrated = resolve_profile("h200-llama-3-8b")
    args = calibrated.engineArgs.model_copy(update={"gpu_memory_utilization": gpu_memory_utilization})
    return calibrated.model_copy(update={"engineArgs": args})


def h200_canary_ratio() -> float:
    """The canary's FB_USED / (FB_USED + FB_FREE) as its DcgmCollector exports it (whole MiB)."""
    hbm = HbmModel(h200_at(0.98), lambda: T0)
    used, free = round(hbm.fb_used_mib()), round(hbm.fb_free_mib())
    return used / (used + free)


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


def h200_node(generation: str) -> list[tuple[Exposition, Sequence[Mapping[str, Any]]]]:
    """(exposition, relabelling) of the node's two GPUs: the recorded stable one and the simulated canary."""
    stable, canary = recorded_exposition("stable"), simulated_exposition(h200_at(0.98), "canary")
    if generation == "new":
        return [(stable, shipped_relabelings()), (canary, shipped_relabelings())]
    return [(as_dcgm_1x(stable), OLD_RELABELINGS), (as_dcgm_1x(canary), OLD_RELABELINGS)]


@pytest.mark.parametrize(
    ("generations", "kv_names"),
    [
        pytest.param(["new"], ["vllm:kv_cache_usage_perc"], id="dcgm-2.x+-names"),
        pytest.param(["old"], ["vllm:gpu_cache_usage_perc"], id="dcgm-1.x-names"),
        pytest.param(
            ["new", "old"],
            ["vllm:kv_cache_usage_perc", "vllm:gpu_cache_usage_perc"],
            id="both-exporters-and-both-kv-names",
        ),
    ],
)
def test_the_recorded_h200_keeps_its_headroom_and_the_098_canary_scales_out_before_it_preempts(
    tmp_path: Path, generations: list[str], kv_names: list[str]
) -> None:
    writer = OpenMetricsWriter()
    for generation in generations:
        for exposition, rules in h200_node(generation):
            assert add_exposition(writer, exposition, rules) >= 2  # FB_USED and FB_FREE at least
    add_kv_usage(writer, kv_names)
    entry = assert_fires_on_the_canary_before_preemptions(backtest(tmp_path, writer), "scale")
    assert entry["peak"] == pytest.approx(h200_canary_ratio(), abs=1e-6)
    assert 0.975 < entry["peak"] < 0.981


def test_the_recorded_pool_is_flat_at_0_9_through_the_replay() -> None:
    """The stable version's replayed ratio: weights only at start-up, then 0.900 for the rest of the history,
    so its KV ramp to 100% never fires (the assertion above that only the canary fires relies on it)."""
    exposition = recorded_exposition("stable")
    ratios = []
    for step, at in enumerate(times()):
        values = {f.name: f.samples[0].value for f in text_string_to_metric_families(exposition(step, at))}
        ratios.append(values["DCGM_FI_DEV_FB_USED"] / (values["DCGM_FI_DEV_FB_USED"] + values["DCGM_FI_DEV_FB_FREE"]))
    assert max(ratios[:10]) < 0.2
    assert ratios[30:] == pytest.approx([0.900] * (STEPS - 30), abs=5e-4)


def test_a_recent_rollout_of_the_canary_shifts_its_traffic_instead(tmp_path: Path) -> None:
    writer = OpenMetricsWriter()
    for exposition, rules in h200_node("new"):
        add_exposition(writer, exposition, rules)
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


def simulated_exposition(profile: EngineProfile, version: str) -> Exposition:
    """The simulator's DCGM gauges for one replica, its HBM model stepped with the ramp's KV use."""
    clock = [T0]
    hbm = HbmModel(profile, lambda: clock[0])
    registry = CollectorRegistry()
    registry.register(DcgmCollector(hbm, "gpu-node-07"))
    kv_capacity = profile.num_gpu_blocks() * profile.engineArgs.block_size

    def exposition(step: int, at: float) -> str:
        clock[0] = at
        hbm.record_step(at, int(kv_capacity * kv_usage(step)))
        return with_pod_labels(generate_latest(registry).decode(), version)

    return exposition


def test_the_simulators_hbm_model_fires_on_the_high_memory_profile_only(tmp_path: Path) -> None:
    writer = OpenMetricsWriter()
    add_exposition(writer, simulated_exposition(resolve_profile("high-memory"), "canary"), shipped_relabelings())
    add_exposition(writer, simulated_exposition(resolve_profile("stable"), "stable"), shipped_relabelings())
    add_kv_usage(writer, ["vllm:kv_cache_usage_perc"])
    entry = assert_fires_on_the_canary_before_preemptions(backtest(tmp_path, writer), "scale")
    # 0.98 preallocated, less the pool's rounding to whole blocks; a full batch adds nothing (activations live
    # inside the budget, as the recorded H200 shows).
    assert 0.975 < entry["peak"] <= 0.98


def test_relabelling_gives_the_dcgm_series_the_policys_labels() -> None:
    families = text_string_to_metric_families(recorded_exposition("canary")(40, T0))
    (family,) = [f for f in families if f.name == "DCGM_FI_DEV_FB_USED"]
    labels = relabel(family.samples[0].labels, family.name, shipped_relabelings())
    assert labels is not None
    assert (labels["namespace"], labels["service"], labels["version"]) == ("llm", "chat", "canary")
    assert labels["modelName"] == "NVIDIA H200"
    assert not any(key.startswith("pod_label_") for key in labels)
    (reserved,) = [f for f in text_string_to_metric_families(recorded_exposition("canary")(40, T0))
                   if f.name == "DCGM_FI_DEV_FB_RESERVED"]  # fmt: skip
    assert relabel(reserved.samples[0].labels, reserved.name, shipped_relabelings()) is None  # not kept
    old = as_dcgm_1x(recorded_exposition("stable"))(40, T0)
    (used,) = [f for f in text_string_to_metric_families(old) if f.name == "dcgm_fb_used"]
    labels = relabel(used.samples[0].labels, used.name, OLD_RELABELINGS)
    assert labels is not None
    assert (labels["namespace"], labels["service"], labels["version"]) == ("llm", "chat", "stable")
