"""The trace replayer against the tier's router: a healthy profile serves every request quickly."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from serving.load import main
from tests.integration.test_tier_process import CONFIG, TierProcess

pytestmark = pytest.mark.integration


def test_replay_through_the_router(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    config = tmp_path / "tier.yaml"
    config.write_text(CONFIG)
    tier = TierProcess(config, tmp_path / "state")
    try:
        out_csv, out_json = tmp_path / "r.csv", tmp_path / "s.json"
        code = main(["--url", tier.router, "--model", "llama-test", "--trace", "conv", "--speedup", "20",
                     "--max-requests", "30", "--csv", str(out_csv), "--summary-json", str(out_json),
                     "--no-progress"])
        assert code == 0
        summary = json.loads(out_json.read_text())
        assert (summary["count"], summary["ok"], summary["errors"]) == (30, 30, 0)
        assert 0 < summary["p50"] <= summary["p99"]
        assert len(out_csv.read_text().splitlines()) == 31
        assert "requests 30  ok 30  errors 0" in capsys.readouterr().out
    finally:
        tier.stop()
