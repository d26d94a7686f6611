"""Watch the watcher (issue 24, item 2): deploy/components/self-monitoring renders with the base, its PrometheusRule
passes `promtool check rules` and `promtool test rules` (tests/fixtures/self-monitoring-rules.test.yaml: each
alert fires when it should and stays quiet when it should not), every alert has a runbook section in
docs/runbooks.md, and every controller metric an alert reads is one the controller exports."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
from pathlib import Path
from typing import Any

import pytest
import yaml

from tailguard.controller.loop.metrics import ControllerMetrics
from tailguard.serving.tier.manifests import render_kustomization

REPO = Path(__file__).resolve().parents[2]
BASE = REPO / "deploy" / "base"
COMPONENT = REPO / "deploy" / "components" / "self-monitoring"
PROMTOOL_TESTS = REPO / "tests" / "fixtures" / "self-monitoring-rules.test.yaml"
RUNBOOKS = REPO / "docs" / "runbooks.md"
ALERTS = {
    "TailguardDown",
    "TailguardBlind",
    "TailguardPolicyNotSeeing",
    "TailguardActionsFailing",
    "TailguardJournalErrors",
    "TailguardNoLeader",
    "TailguardWebhookRejects",
}


@pytest.fixture(scope="module")
def groups(tmp_path_factory: pytest.TempPathFactory) -> list[dict[str, Any]]:
    root = tmp_path_factory.mktemp("self-monitoring")
    shutil.copy(BASE / "namespace-transformer.yaml", root / "namespace.yaml")
    (root / "kustomization.yaml").write_text(
        f"resources: [{os.path.relpath(BASE, root)}]\ncomponents: [{os.path.relpath(COMPONENT, root)}]\n"
        "transformers: [namespace.yaml]\n"
    )
    objects = render_kustomization(root)
    (rule,) = [o for o in objects if o["kind"] == "PrometheusRule" and o["metadata"]["name"] == "tailguard-self"]
    assert rule["metadata"]["namespace"] == "tailguard"
    found: list[dict[str, Any]] = rule["spec"]["groups"]
    return found


def _promtool() -> str:
    promtool = shutil.which("promtool")
    assert promtool is not None, "promtool is installed by scripts/ensure-system-deps.sh"
    return promtool


def test_the_rules_pass_promtool_check_and_promtool_test(groups: list[dict[str, Any]], tmp_path: Path) -> None:
    (tmp_path / "rules.yaml").write_text(yaml.safe_dump({"groups": groups}))
    shutil.copy(PROMTOOL_TESTS, tmp_path / PROMTOOL_TESTS.name)
    checked = subprocess.run(
        [_promtool(), "check", "rules", "rules.yaml"],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert checked.returncode == 0, checked.stdout + checked.stderr
    tested = subprocess.run(
        [_promtool(), "test", "rules", PROMTOOL_TESTS.name],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert tested.returncode == 0, tested.stdout + tested.stderr
    assert "SUCCESS" in tested.stdout


def test_every_alert_is_tested_has_a_runbook_and_reads_exported_metrics(groups: list[dict[str, Any]]) -> None:
    rules = [rule for group in groups for rule in group["rules"]]
    assert {rule["alert"] for rule in rules} == ALERTS
    tested = {case["alertname"] for test in yaml.safe_load(PROMTOOL_TESTS.read_text())["tests"]
              for case in test.get("alert_rule_test", []) if case.get("exp_alerts")}  # fmt: skip
    assert tested == ALERTS  # each alert is seen firing in the promtool tests
    runbooks = RUNBOOKS.read_text()
    sections = {heading.strip() for heading in re.findall(r"^## (\w+)\s*$", runbooks, flags=re.MULTILINE)}
    for rule in rules:
        assert rule["alert"] in sections, f"no '## {rule['alert']}' in docs/runbooks.md"
        assert rule["annotations"]["runbook_url"] == f"docs/runbooks.md#{rule['alert'].lower()}"
        assert rule["labels"]["severity"] in ("critical", "warning")
    metrics = ControllerMetrics()
    metrics.watch_leadership(lambda: True, lambda: {0: True})
    exported = set(re.findall(r"^# TYPE (\w+)", metrics.exposition().decode(), flags=re.MULTILINE))
    exported |= {f"{name}_total" for name in exported}  # counters are exposed as NAME_total
    read = {name for rule in rules for name in re.findall(r"\b(tailguard_\w+)", rule["expr"])}
    assert read and read <= exported, read - exported
