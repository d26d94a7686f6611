"""A seeded dataset backfilled into a REAL Prometheus -> feature queries -> train -> evaluate, end to end.

The easy synthetic pattern: one slow replica, load that ramps from calm to over capacity every two
minutes, so the queue time (CPU SLI) breaches after each ramp. Queue growth and the surge ratio announce a
breach before it shows in the P99; persistence (the last horizon repeats) is late at every onset and end.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pytest

from tailguard.controller.adapters.metrics.prometheus import PrometheusSettings, PrometheusSource
from tailguard.controller.app.ml_commands import evaluate_main, train_main
from tailguard.controller.kit.clock import SystemClock
from tailguard.predictors.artifact import load_artifact
from tailguard.predictors.data import build_rows
from tailguard.predictors.features import FEATURES, feature_names, feature_queries, sli_queries
from tailguard.serving.lab.dataset import DEFAULT_START, Segment, generate, write_dataset
from tailguard.serving.lab.promstack import PrometheusServer
from tailguard.serving.tier.profiles import EngineArgs, EngineProfile, Hardware

pytestmark = pytest.mark.integration

SLOW = EngineProfile(
    name="slow",
    model="m",
    engineArgs=EngineArgs(max_num_seqs=8),
    hardware=Hardware(decode_step_base_s=0.05, decode_per_seq_s=0.01),
)
DURATION = 16 * 60.0
STEP = 5.0
POLICY = """
apiVersion: tailguard.io/v1alpha1
kind: Policy
name: sla-chat
targets:
  groupBy: [service]
  match: {namespace: llm}
vars:
  sla_cpu_seconds: "1"
signals:
  - name: cpu-breach
    predict: {model: sla, dimension: cpu}
conditions:
  - name: predicted-cpu-breach
    signal: cpu-breach
    when: {op: ">", value: 0.8}
    for: 2
    noData: hold
    actions:
      - type: annotate
        text: "predicted CPU breach on {{ service }}"
"""


def _easy_segments() -> list[Segment]:
    segments, t = [], 0.0
    while t < DURATION:
        segments.append(Segment(t, t + 80, "slow", 1, 0.05, 0.05, 1.0, 1.0, 0.005, 0.005, 0.002))
        segments.append(Segment(t + 80, t + 120, "slow", 1, 0.05, 0.35, 1.0, 1.0, 0.005, 0.005, 0.002))
        t += 120
    return segments


@dataclass
class Stack:
    url: str
    rules: Path


@pytest.fixture(scope="module")
def stack(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Stack]:
    work = tmp_path_factory.mktemp("sla")
    dataset = generate(5, DURATION, segments=_easy_segments(), scrape_interval_s=STEP, profiles={"slow": SLOW})
    write_dataset(dataset, work / "dataset", backfill=True)
    rules = work / "rules"
    rules.mkdir()
    (rules / "sla.yaml").write_text(POLICY, encoding="utf-8")
    with PrometheusServer(data_dir=work / "dataset" / "data", workdir=work / "prom").start() as prom:
        yield Stack(prom.url, rules)


def test_feature_queries_parse_in_prometheus_and_are_batched(stack: Stack) -> None:
    queries: list[str] = []
    source = PrometheusSource(
        PrometheusSettings(url=stack.url), SystemClock(), on_query=lambda query, _s, _ok: queries.append(query)
    )
    with source:
        at = DEFAULT_START + 300
        for name, query in {
            **feature_queries({"namespace": "llm"}, ["service"]),
            **sli_queries({}, ["service"]),
        }.items():
            result = source.instant(query, ["service"], at)
            assert result.error is None, (name, result.error)
        queries.clear()
        rows = build_rows(
            source,
            {"namespace": "llm"},
            ["service"],
            DEFAULT_START,
            DEFAULT_START + 600,
            STEP,
            20.0,
            {"cpu": 1.0, "gpu": 20.0, "network": 0.5},
        )
    # one range query per feature and per SLI, for every target at once
    assert len(queries) == len(FEATURES) + 3
    assert len(rows.targets) == 1
    present = {name for i, name in enumerate(feature_names()) if (rows.X[:, i] == rows.X[:, i]).any()}
    assert {
        "request_rate",
        "queue_waiting",
        "queue_time_p99",
        "kv_cache_usage",
        "hbm_used_ratio",
        "process_cpu",
        "network_jitter",
        "prompt_token_entropy",
        "queue_time_p50",
    } <= present
    # The median and the tail of the same queue-time histogram: never above it, and below it somewhere.
    median = rows.X[:, feature_names().index("queue_time_p50")]
    tail = rows.X[:, feature_names().index("queue_time_p99")]
    both = np.isfinite(median) & np.isfinite(tail)
    assert both.any() and (median[both] <= tail[both]).all() and (median[both] < tail[both]).any()


def test_train_then_evaluate_end_to_end(stack: Stack, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    split_at = DEFAULT_START + 11 * 60
    model_dir, report_dir = tmp_path / "model", tmp_path / "report"
    code = train_main(
        [
            "--prometheus",
            stack.url,
            "--policy",
            "sla-chat",
            "--rules",
            str(stack.rules),
            "--start",
            str(DEFAULT_START),
            "--end",
            str(split_at),
            "--out",
            str(model_dir),
            "--horizon",
            "20s",
            "--step",
            "5s",
        ]
    )
    captured = capsys.readouterr()
    assert code == 0, captured.err
    assert "gpu: not trained: the training part has only one class" in captured.err
    artifact = load_artifact(model_dir)
    assert artifact.dimensions == ["cpu"]
    assert artifact.thresholds["cpu"] == 1.0  # from the policy's vars
    assert artifact.horizon_s == 20.0
    assert artifact.report["threshold_objectives"] == {"cpu": "accuracy"}  # CPU's target is accuracy
    assert artifact.report["held_out"]["dimensions"]["cpu"]["methods"]["model"]["rows"] > 0

    code = evaluate_main(
        [
            "--model",
            str(model_dir),
            "--prometheus",
            stack.url,
            "--start",
            str(split_at),
            "--end",
            str(DEFAULT_START + DURATION),
            "--out",
            str(report_dir),
        ]
    )
    assert code == 0, capsys.readouterr().err
    report = json.loads((report_dir / "report.json").read_text())
    cpu = report["dimensions"]["cpu"]["methods"]
    assert set(cpu) == {"model", "logistic", "reactive", "persistence"}
    for scores in cpu.values():
        assert {
            "accuracy",
            "precision",
            "recall",
            "f1",
            "roc_auc",
            "brier",
            "lead_time_s",
            "missed_breaches",
            "false_alarms_per_hour",
        } <= set(scores)
    assert cpu["model"]["f1"] > cpu["persistence"]["f1"]
    assert cpu["model"]["accuracy"] > cpu["persistence"]["accuracy"]
    assert report["latency"]["batch_size"] == 1000
    markdown = (report_dir / "report.md").read_text()
    assert "| cpu | model |" in markdown and "| cpu | persistence |" in markdown
    for plot in ("reliability.png", "lead-time.png", "timeline.png"):
        assert (report_dir / plot).read_bytes()[:4] == b"\x89PNG"


def test_train_bad_policy_name_is_a_usage_error(
    stack: Stack, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    code = train_main(
        [
            "--prometheus",
            stack.url,
            "--policy",
            "nope",
            "--rules",
            str(stack.rules),
            "--start",
            "0",
            "--end",
            "60",
            "--out",
            str(tmp_path),
        ]
    )
    assert code == 2
    assert "no policy named 'nope'" in capsys.readouterr().err


def test_a_rollout_shows_in_the_start_up_features_before_the_new_version_serves(tmp_path: Path) -> None:
    """The new version's replica is listed (up 0) for 17-48 s before it answers, then warms up, then serves:
    the up-based features see the rollout coming, in a real Prometheus, and so do the engine-arg features
    (the new version's max_num_seqs 2, from the tier's tailguard_serving_engine_arg)."""
    slow2 = SLOW.model_copy(update={"name": "slow2", "engineArgs": EngineArgs(max_num_seqs=2)})
    segments = [
        Segment(0.0, 90.0, "slow", 1, 0.05, 0.05, 1.0, 1.0, 0.005, 0.005, 0.002),
        Segment(90.0, 240.0, "slow2", 1, 0.05, 0.05, 1.0, 1.0, 0.005, 0.005, 0.002),
    ]
    dataset = generate(5, 240.0, segments=segments, scrape_interval_s=STEP, profiles={"slow": SLOW, "slow2": slow2})
    write_dataset(dataset, tmp_path / "dataset", backfill=True)
    names = [
        "replicas_starting",
        "versions_starting",
        "versions_listed",
        "newest_version_samples_10m",
        "versions",
        "seq_limit_min",
        "load_over_seq_limit",
    ]
    server = PrometheusServer(data_dir=tmp_path / "dataset" / "data", workdir=tmp_path / "prom")
    with server.start() as prom, PrometheusSource(PrometheusSettings(url=prom.url), SystemClock()) as source:
        rows = build_rows(
            source,
            {"namespace": "llm"},
            ["service"],
            DEFAULT_START,
            DEFAULT_START + 240.0,
            STEP,
            20.0,
            {"cpu": 1.0, "gpu": 20.0, "network": 0.5},
        )
    column = {name: feature_names().index(name) for name in names}
    seconds = rows.times - DEFAULT_START
    starting = rows.X[:, column["versions_starting"]]
    before = (seconds > 30) & (seconds < 90)
    assert (starting[before] == 0).all() and (rows.X[before, column["versions_listed"]] == 1).all()
    rollout = seconds[(seconds >= 90) & (starting == 1)]
    assert rollout.size >= 2 and rollout.min() <= 105.0  # listed at once, not up for 17-48 s
    assert (rows.X[np.isin(seconds, rollout), column["replicas_starting"]] == 1).all()
    assert (rows.X[np.isin(seconds, rollout), column["versions_listed"]] == 2).all()
    # The rollout's age counts from its first listing, while the old version is still the one serving.
    assert rows.X[seconds == rollout.min() + STEP, column["newest_version_samples_10m"]][0] <= 3
    assert (starting[seconds > rollout.max() + STEP] == 0).all()
    # The new version's scheduler limit is known from its first listing, while the old one (8) still serves.
    limit = rows.X[:, column["seq_limit_min"]]
    assert (limit[before] == 8).all()
    assert (limit[np.isin(seconds, rollout)] == 2).all()
    # Sequences per serving replica over the smallest listed limit: the new version's 2, before it serves.
    load_ratio = rows.X[:, column["load_over_seq_limit"]]
    per_replica = (
        rows.X[:, feature_names().index("queue_running")] + rows.X[:, feature_names().index("queue_waiting")]
    ) / rows.X[:, feature_names().index("replicas")]
    busy = np.isin(seconds, rollout) & (per_replica > 0)
    assert busy.any()
    np.testing.assert_allclose(load_ratio[busy], per_replica[busy] / 2)
    np.testing.assert_allclose(load_ratio[before], per_replica[before] / 8)
