"""Backtest of a prediction policy against a real Prometheus backfilled with the features' raw series.

The same history and tiny model as tests/integration/test_prediction_controller.py: service `hot` runs at
19 s P99 inference time (the model predicts a GPU breach), `cool` at 0.5 s. The backtest must fire for `hot`
exactly where the live controller fires (its second evaluation above 0.8), never for `cool`; without the
model, the signals are no-data for the whole backtest, the report says why and the exit code is 1.
"""

from __future__ import annotations

import json
import shutil
from collections.abc import Iterator
from pathlib import Path

import pytest

from tailguard.controller.adapters.metrics.prometheus import PrometheusSettings, PrometheusSource
from tailguard.controller.app.ml_commands import backtest_main
from tailguard.controller.core.policy_files import load_policies
from tailguard.controller.kit.clock import ManualClock
from tailguard.controller.tools.backtest import EXIT_SIGNAL_ERRORS, run_backtest
from tailguard.predictors.history import HistoricalPredictions
from tailguard.predictors.serving import ModelSpec
from tests.integration.test_prediction_controller import EXAMPLE, HOT, STEP, T0, history, train_artifact

pytestmark = pytest.mark.integration

START = T0 + 10 * 60  # the features' 5m windows are full by then
END = T0 + 15 * 60


@pytest.fixture(scope="module")
def prometheus_url(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    from tailguard.serving.lab.promstack import PrometheusServer, backfill_openmetrics

    work = tmp_path_factory.mktemp("backtest-prediction-prometheus")
    writer = history()
    backfill_openmetrics(writer.render(), work / "data", expected_samples=writer.sample_count)
    with PrometheusServer(data_dir=work / "data", workdir=work / "run").start() as server:
        yield server.url


def test_backtest_fires_where_the_live_controller_would(prometheus_url: str, tmp_path: Path) -> None:
    model_dir = train_artifact(tmp_path / "models" / "sla")
    (loaded,) = load_policies([EXAMPLE])[0]
    source = PrometheusSource(PrometheusSettings(url=prometheus_url), ManualClock(END))
    with source:
        predictions = HistoricalPredictions({"sla": ModelSpec("sla", model_dir)}, END)
        report = run_backtest(source, [loaded.policy], START, END, STEP, predictions)
    assert report.signal_errors == []
    assert report.evaluations == 21
    (entry,) = report.decisions
    assert entry.target == HOT and entry.condition == "gpu-breach-predicted"
    # `for: 2`: above 0.8 at START (first evaluation) and fired at the second, as the live controller does.
    assert entry.onset == START and entry.fired_at == START + STEP and entry.resolved_at is None
    assert entry.peak is not None and entry.peak > 0.8
    assert [action.type.value for _kind, action in entry.actions] == ["scale", "annotate"]


def test_cli_with_the_model_and_without_it(
    prometheus_url: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    model_dir = train_artifact(tmp_path / "models" / "sla")
    common = ["--prometheus", prometheus_url, "--rules", str(EXAMPLE), "--start", str(START), "--end", str(END)]
    assert backtest_main([*common, "--predictors", f"sla={model_dir}"]) == 0
    fired = json.loads(capsys.readouterr().out)["decisions"]
    assert [(d["target"], d["fired_at"]) for d in fired] == [({"service": "hot"}, START + STEP)]

    shutil.rmtree(model_dir)
    assert backtest_main([*common, "--predictors", f"sla={model_dir}"]) == EXIT_SIGNAL_ERRORS
    captured = capsys.readouterr()
    report = json.loads(captured.out)
    assert report["decisions"] == [] and report["evaluations"] == 21
    (error,) = report["signal_errors"]
    assert "gpu-breach-probability: model sla: missing" in error and "for the whole backtest" in error
    assert "signal error:" in captured.err

    assert backtest_main(common) == EXIT_SIGNAL_ERRORS  # no --predictors: the model is not configured
    (error,) = json.loads(capsys.readouterr().out)["signal_errors"]
    assert "model sla: unconfigured" in error

    assert backtest_main([*common, "--predictors", "sla"]) == 2
    assert "--predictors: expected NAME=DIR" in capsys.readouterr().err
