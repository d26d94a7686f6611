from __future__ import annotations

from pathlib import Path

import pytest

from tailguard.serving.lab.load import (
    BUILTIN_TRACES,
    RequestResult,
    TraceError,
    main,
    plan,
    quantile,
    read_trace,
    summarize,
)

HEADER = "TIMESTAMP,ContextTokens,GeneratedTokens\n"


def _trace(tmp_path: Path, body: str) -> Path:
    path = tmp_path / "t.csv"
    path.write_text(HEADER + body)
    return path


def test_vendored_traces_parse() -> None:
    conv = read_trace(BUILTIN_TRACES["conv"])
    assert len(conv) > 19000 and conv[0].offset == 0.0
    assert (conv[0].prompt_tokens, conv[0].output_tokens) == (374, 44)
    assert abs(conv[1].offset - 4.314579) < 1e-6  # 7-digit fractions are kept


@pytest.mark.parametrize(
    "body, message",
    [
        ("2023-11-16 18:15:46.1,12\n", "t.csv:2: expected 3 columns"),
        (
            "2023-11-16 18:15:46.1,12,x\n",
            "t.csv:2: GeneratedTokens: expected a non-negative integer, got 'x'",
        ),
        ("yesterday,1,2\n", "t.csv:2: TIMESTAMP: expected a time like"),
        (
            "2023-11-16 18:15:47.0,1,2\n2023-11-16 18:15:46.0,1,2\n",
            "t.csv:3: TIMESTAMP: expected times in ascending",
        ),
        ("", "the trace has no requests"),
    ],
)
def test_bad_traces_name_file_and_line(tmp_path: Path, body: str, message: str) -> None:
    with pytest.raises(TraceError, match=message.replace(".", r"\.")):
        read_trace(_trace(tmp_path, body))


def test_bad_header(tmp_path: Path) -> None:
    path = tmp_path / "t.csv"
    path.write_text("time,prompt,output\n")
    with pytest.raises(TraceError, match="t.csv:1: expected the header"):
        read_trace(path)


def test_cli_reports_a_bad_trace_with_exit_2_and_no_traceback(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = _trace(tmp_path, "2023-11-16 18:15:46.1,-3,2\n")
    code = main(["--url", "http://127.0.0.1:9", "--model", "m", "--trace", str(path), "--no-progress"])
    err = capsys.readouterr().err
    assert code == 2
    assert "t.csv:2: ContextTokens: expected a non-negative integer, got '-3'" in err
    assert "Traceback" not in err


def test_plan_compresses_time_scales_tokens_and_rate(tmp_path: Path) -> None:
    trace = read_trace(_trace(tmp_path, "".join(f"2023-11-16 18:00:{s:02d}.0,100,40\n" for s in range(0, 40, 2))))
    schedule = plan(trace, speedup=10, token_scale=0.1, start_offset=4, duration=2.0)
    assert [round(p.at, 3) for p in schedule] == [round(0.2 * i, 3) for i in range(11)]
    assert {(p.prompt_tokens, p.max_tokens) for p in schedule} == {(10, 4)}
    assert len(plan(trace, rate_scale=0.5)) == 10
    assert len(plan(trace, rate_scale=2.0)) == 40
    assert len(plan(trace, max_requests=3)) == 3


def test_summary_counts_errors_and_quantiles() -> None:
    results = [RequestResult(0, 0, latency, 200, 1, 1, None) for latency in (0.1, 0.2, 0.3, 0.4)]
    results.append(RequestResult(0, 0, 1.0, 500, 1, 1, "http 500"))
    summary = summarize(results, 2.0)
    assert (summary.count, summary.ok, summary.errors) == (5, 4, 1)
    assert summary.error_kinds == {"http 500": 1}
    assert summary.p50 == pytest.approx(0.25) and summary.throughput_rps == 2.5
    assert quantile([], 0.5) is None
