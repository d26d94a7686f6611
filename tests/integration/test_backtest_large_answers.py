"""Issue 22 (1): `tailguard backtest` over 100 targets on a real Prometheus, its range answers of the size that
was cut short (5-10 MB: one chunk of 2,880 points x 100 targets), read whole, run to the end.

The history is bench_backtest.py's (4 signals: P99 from vLLM's histogram buckets, a queue gauge, an error ratio,
an HBM ratio; three targets with a 30-minute latency episode on day 2), over 2 days rather than 7: a 60 s step
fills one whole chunk of the grid (2,880 points) per request in 2 days, so each answer is as large as the
week-long run's; 7 days would only repeat them. Prometheus sends them gzip-compressed in HTTP chunks (asserted:
the framing that was cut). The backtest must exit 0 with every evaluation of the window and exactly the three
episodes' incidents.

Where the cut falls depends on how the answer's bytes arrive (a read that gets only bytes decoding to nothing):
on this machine, 7710821 under urllib3-future read these answers whole (2 days, and 7 days too), so this test
guards the size and the whole run; the cut itself is reproduced deterministically, on every client path, by
tests/integration/test_large_answers.py (its gzip-chunked answers fail on 7710821) and
tests/unit/test_http_body.py (whatever urllib3 is installed)."""

from __future__ import annotations

import io
import json
import shutil
from collections.abc import Iterator
from contextlib import redirect_stdout
from pathlib import Path
from typing import Any

import pytest
import requests

from tailguard.controller.core.policy import Policy
from tailguard.controller.core.signals import range_chunks, render_signal_queries
from tailguard.controller.kit.durations import format_duration
from tailguard.controller.tools.backtest import backtest_main
from tailguard.controller.tools.backtest_feed import CHUNK_POINTS
from tests.bench.bench_backtest import BAD_TARGETS, EPISODE, T0, policy_document, write_history

pytestmark = pytest.mark.integration

DAYS = 2
TARGETS = 100
SCRAPE = 300.0
STEP = 60.0
FAILING_SIZE = 5_000_000  # the smallest answer that came back cut (bytes, uncompressed)


@pytest.fixture(scope="module")
def prometheus(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    if shutil.which("prometheus") is None or shutil.which("promtool") is None:
        pytest.fail("prometheus/promtool are not installed: apt-get install prometheus")
    from tailguard.serving.lab.promstack import PrometheusServer, backfill_openmetrics

    work = tmp_path_factory.mktemp("backtest-large")
    history = work / "history.om"
    samples = write_history(history, TARGETS, DAYS, SCRAPE)
    backfill_openmetrics(history, work / "data", expected_samples=samples, timeout=600)
    history.unlink()
    with PrometheusServer(data_dir=work / "data", workdir=work / "run").start() as server:
        yield server.url


def window() -> tuple[float, float]:
    return T0 + 2 * SCRAPE, T0 + DAYS * 86_400.0


def test_the_range_answers_are_of_the_size_that_was_cut(prometheus: str) -> None:
    policy = Policy.model_validate(policy_document(SCRAPE, STEP))
    start, end = window()
    chunk_start, chunk_end = next(iter(range_chunks(start, end, STEP, CHUNK_POINTS)))
    query = render_signal_queries(policy)["p99"]
    params = {"query": query, "start": f"{chunk_start:.3f}", "end": f"{chunk_end:.3f}", "step": format_duration(STEP)}
    response = requests.get(
        f"{prometheus}/api/v1/query_range", params=params, headers={"Accept-Encoding": "gzip"}, timeout=300
    )
    assert response.status_code == 200
    assert len(response.content) >= FAILING_SIZE, len(response.content)
    assert response.headers.get("Content-Encoding") == "gzip"
    assert response.headers.get("Transfer-Encoding") == "chunked"


def test_the_backtest_runs_to_the_end(prometheus: str, tmp_path: Path) -> None:
    rules = tmp_path / "policy.yaml"
    rules.write_text(json.dumps(policy_document(SCRAPE, STEP)), encoding="utf-8")  # JSON is YAML
    start, end = window()
    out = io.StringIO()
    with redirect_stdout(out):
        code = backtest_main(
            ["--prometheus", prometheus, "--rules", str(rules), "--start", f"{start:.0f}", "--end", f"{end:.0f}"]
            + ["--timeout", "300"]
        )
    assert code == 0, out.getvalue()[-2000:]
    report: dict[str, Any] = json.loads(out.getvalue())
    assert report["evaluations"] == int((end - start) // STEP) + 1
    incidents = sorted((d["target"]["service"], d["condition"]) for d in report["decisions"])
    assert incidents == [(f"svc-{index:05d}", "p99-high") for index in range(BAD_TARGETS)]
    for decision in report["decisions"]:
        # the episode: day 2 (index 1) at 10:00 for EPISODE seconds; `for: 3` at 60 s fires on its third minute
        assert T0 + 86_400 + 36_000 <= decision["onset"] <= T0 + 86_400 + 36_000 + EPISODE
