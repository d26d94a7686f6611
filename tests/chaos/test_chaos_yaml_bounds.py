"""Issue 16 (3): bounded YAML inputs. An alias bomb, deep nesting, an oversized file and a huge text value are
refused with a file:line: error before anything is expanded; a reload keeps the last good set, parses outside the
controller lock, and /readyz answers while 2,000 policies load.

Bounded and deterministic: memory is measured with tracemalloc around the load; the only timing assertion is the
readiness latency the issue names (< 2 s), with CPU time used only as a generous guard.
"""

from __future__ import annotations

import subprocess
import sys
import threading
import time
import tracemalloc
from pathlib import Path
from typing import Any

import pytest
import yaml
from prometheus_client import CollectorRegistry

from tailguard.controller.adapters.stores.journal import Journal
from tailguard.controller.app.settings import SettingsError, load_settings
from tailguard.controller.core.model import SignalResult
from tailguard.controller.core.policy_files import load_policies, parse_policy_text
from tailguard.controller.kit.clock import ManualClock
from tailguard.controller.kit.located_yaml import (
    MAX_DEPTH,
    MAX_FILE_BYTES,
    MAX_NODES,
    MAX_TEXT,
    BoundedLoader,
    construct,
)
from tailguard.controller.loop.metrics import ControllerMetrics
from tailguard.controller.loop.policy_set import PolicyLoadError
from tailguard.controller.loop.runtime import Controller
from tailguard.controller.testing import FakeDispatcher, FakeSource

ROOT = Path(__file__).resolve().parent.parent.parent
MB = 1024 * 1024


def alias_bomb(levels: int = 9, key: str = "description") -> str:
    """The classic "billion laughs": each level is 9 aliases of the previous one (9**levels scalars), ~500 bytes."""
    lines = ["apiVersion: tailguard.io/v1alpha1", "kind: Policy", "name: bomb", "x: &l0 [lol,lol,lol,lol,lol]"]
    for level in range(1, levels):
        refs = ",".join([f"*l{level - 1}"] * 9)
        lines.append(f"x{level}: &l{level} [{refs}]")
    lines.append(f"{key}: *l{levels - 1}")
    return "\n".join(lines) + "\n"


def policy_yaml(name: str, *, description: str = "") -> str:
    return f"""\
apiVersion: tailguard.io/v1alpha1
kind: Policy
name: {name}
description: "{description}"
targets:
  groupBy: [service]
signals:
  - name: p99
    query: histogram_quantile(0.99, sum by (le, service) (rate(lat_bucket{{name="{name}"}}[1m])))
conditions:
  - name: p99-high
    signal: p99
    when: {{op: ">", value: 0.8}}
    for: 2
    noData: hold
    actions:
      - type: annotate
        text: "p99 high"
"""


def measured(load: Any) -> tuple[Any, int, float]:
    """`load()`'s result, the peak of Python allocations during it (bytes) and its CPU seconds."""
    tracemalloc.start()
    tracemalloc.reset_peak()
    cpu = time.process_time()
    try:
        result = load()
        _current, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    return result, peak, time.process_time() - cpu


def test_the_alias_bomb_is_refused_before_it_expands(tmp_path: Path) -> None:
    text = alias_bomb()
    assert len(text.encode()) < 600  # the bomb was 497 bytes
    path = tmp_path / "bomb.yaml"
    path.write_text(text)
    (policies, errors), peak, cpu = measured(lambda: load_policies([path]))
    assert policies == []
    assert len(errors) == 1
    message = str(errors[0])
    assert message.startswith(f"{path}:") and "refused" in message and "alias" in message
    # The error names the line where the budget ran out: an alias line, not line 1.
    assert errors[0].line > 4
    assert peak < 50 * MB, f"peak Python allocations {peak / MB:.1f} MB"
    assert cpu < 1.0, f"{cpu:.2f}s of CPU"  # a generous guard; the count below is the real bound


def test_the_loader_stops_once_the_expanded_node_budget_is_spent() -> None:
    loader = BoundedLoader(alias_bomb())
    with pytest.raises(yaml.YAMLError, match="more than 100,000 nodes"):
        loader.get_single_node()
    # It stopped as the budget ran out: it never counted a whole further level (9x) past it.
    assert MAX_NODES < loader._nodes <= 9 * MAX_NODES


def test_aliases_within_the_limits_still_work() -> None:
    loader = BoundedLoader("a: &shared [1, 2]\nb: [*shared, *shared]\n")
    node = loader.get_single_node()
    assert node is not None
    assert construct(node, loader).value == {"a": [1, 2], "b": [[1, 2], [1, 2]]}


def test_deep_nesting_is_refused_with_its_line() -> None:
    text = "name: deep\nvalue: " + "[" * 1000 + "]" * 1000 + "\n"
    policies, errors = parse_policy_text(text, "deep.yaml")
    assert policies == []
    assert [str(e) for e in errors] == [f"deep.yaml:2: refused: nesting deeper than {MAX_DEPTH} levels"]


def test_nesting_built_from_aliases_is_refused_too() -> None:
    half = MAX_DEPTH // 2 + 2
    text = f"a: &a {'[' * half}1{']' * half}\nb: {'[' * half}*a{']' * half}\n"
    with pytest.raises(yaml.YAMLError, match="nesting deeper"):
        BoundedLoader(text).get_single_node()


def test_an_oversized_file_is_refused_unread(tmp_path: Path) -> None:
    path = tmp_path / "big.yaml"
    path.write_text(policy_yaml("big") + "#" * MAX_FILE_BYTES + "\n")
    policies, errors = load_policies([path])
    assert policies == []
    assert [str(e) for e in errors] == [
        f"{path}:1: refused: the file is larger than {MAX_FILE_BYTES:,} bytes (the limit of a tailguard YAML file)"
    ]


def test_a_20_mb_description_is_refused(tmp_path: Path) -> None:
    path = tmp_path / "desc.yaml"
    path.write_text(policy_yaml("desc", description="x" * (20 * MB)))
    (policies, errors), peak, _cpu = measured(lambda: load_policies([path]))
    assert policies == [] and len(errors) == 1 and "refused: the file is larger" in str(errors[0])
    assert peak < 5 * MB  # read no further than the limit


def test_a_long_text_value_within_the_file_limit_is_refused_with_its_line(tmp_path: Path) -> None:
    path = tmp_path / "desc.yaml"
    path.write_text(policy_yaml("desc", description="x" * (MAX_TEXT + 1)))
    policies, errors = load_policies([path])
    assert policies == []
    assert [str(e) for e in errors] == [
        f"{path}:4: refused: a text value of {MAX_TEXT + 1:,} characters (the limit is {MAX_TEXT:,})"
    ]


def test_the_controller_configuration_is_bounded_too(tmp_path: Path) -> None:
    path = tmp_path / "controller.yaml"
    path.write_text(alias_bomb(key="prometheus"))
    with pytest.raises(SettingsError, match=rf"^{path}:\d+: refused: .*alias"):
        load_settings(path)


def test_rules_validate_exits_1_on_the_bomb(tmp_path: Path) -> None:
    path = tmp_path / "bomb.yaml"
    path.write_text(alias_bomb())
    done = subprocess.run(
        [sys.executable, "-m", "tailguard.controller", "rules", "validate", str(path)],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert done.returncode == 1
    assert f"{path}:" in done.stdout + done.stderr and "Traceback" not in done.stderr


def make_controller(rules: Path, tmp_path: Path) -> Controller:
    return Controller(
        policy_paths=[rules],
        source=FakeSource(default=SignalResult({})),
        journal=Journal(tmp_path / "journal.db"),
        dispatcher=FakeDispatcher(),
        clock=ManualClock(),
        metrics=ControllerMetrics(CollectorRegistry()),
        schedule=False,
    )


def test_the_controller_refuses_to_start_on_the_bomb(tmp_path: Path) -> None:
    rules = tmp_path / "rules"
    rules.mkdir()
    (rules / "bomb.yaml").write_text(alias_bomb())
    controller = make_controller(rules, tmp_path)
    with pytest.raises(PolicyLoadError, match="refused"):  # the CLI exits 2 on it
        controller.start()


def test_a_reload_with_the_bomb_keeps_the_last_good_set(tmp_path: Path) -> None:
    rules = tmp_path / "rules"
    rules.mkdir()
    (rules / "a.yaml").write_text(policy_yaml("lat-a"))
    controller = make_controller(rules, tmp_path)
    controller.start()
    try:
        (rules / "b.yaml").write_text(alias_bomb())
        outcome, peak, _cpu = measured(controller.reload)
        assert outcome.changed and not outcome.applied
        assert list(controller.policies()) == ["lat-a"]
        assert any("refused" in str(error) for error in controller.reload_errors())
        assert peak < 50 * MB
    finally:
        controller.stop()


def test_readiness_answers_while_2000_policies_load(tmp_path: Path) -> None:
    rules = tmp_path / "rules"
    rules.mkdir()
    (rules / "a.yaml").write_text(policy_yaml("lat-a"))
    controller = make_controller(rules, tmp_path)
    controller.start()
    try:
        for file in range(20):  # 100 policies per file keeps each file under the 1 MiB limit
            documents = [policy_yaml(f"p-{file}-{index}") for index in range(100)]
            (rules / f"bulk-{file}.yaml").write_text("---\n".join(documents))
        result: dict[str, Any] = {}
        reload = threading.Thread(target=lambda: result.setdefault("outcome", controller.reload()))
        reload.start()
        slowest = 0.0
        while reload.is_alive():
            started = time.monotonic()
            controller.readiness()
            slowest = max(slowest, time.monotonic() - started)
            time.sleep(0.01)
        reload.join(timeout=120)
        assert result["outcome"].applied and len(controller.policies()) == 2001
        assert slowest < 2.0, f"/readyz waited {slowest:.2f}s for the reload"
    finally:
        controller.stop()
