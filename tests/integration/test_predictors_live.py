"""`python -m tailguard.serving.lab.dataset generate --live`: the real tier process, the trace replayer and a real
Prometheus, for a short while; its TSDB is queryable afterwards. The output directory already holds a
previous run's tier log (another port in its ready line): the run must use its own tier, not that one."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import requests

from tailguard.serving.lab.dataset import generate_live
from tailguard.serving.lab.promstack import PrometheusServer, write_prometheus_config

pytestmark = pytest.mark.integration


def test_live_generation_scrapes_the_real_tier_despite_a_stale_log(tmp_path: Path) -> None:
    out = tmp_path / "live"
    out.mkdir()
    stale = {"event": "ready", "control_url": "http://127.0.0.1:9", "router_url": "http://127.0.0.1:9"}
    (out / "tier.log").write_text(json.dumps(stale) + "\n", encoding="utf-8")

    result = generate_live(out, minutes=0.5, rate_scale=2.0, replicas=1, profile="stable")

    assert result["replay"]["ok"] > 0 and result["replay"]["errors"] == 0
    config = write_prometheus_config(tmp_path / "empty.yml", scrape_interval="15s", scrape_configs=[])
    with PrometheusServer(config, Path(result["data"]), workdir=tmp_path / "prometheus").start() as prometheus:
        answer = requests.get(
            f"{prometheus.url}/api/v1/series",
            params={"match[]": 'vllm:num_requests_running{namespace="llm"}'},
            timeout=10,
        ).json()
    assert answer["status"] == "success" and answer["data"], answer
