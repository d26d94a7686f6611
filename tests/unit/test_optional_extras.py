"""The cluster and ml extras are optional (controller/app/extras.py): `tailguard run` starts without them when the
configuration has no section that needs them, and refuses a section that needs a missing one with one sentence
naming the extra (exit 2).

Each run is a fresh interpreter whose import system refuses the extras' modules (a finder first in
sys.meta_path), so an import of kubernetes, grafana_client, sklearn or skops anywhere on the way fails, and is
also written to stderr where the test sees it even if some caller swallowed the ImportError.
"""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
POLICY = REPO / "rules" / "examples" / "p99-rollback.yaml"

BLOCKED = ("kubernetes", "grafana_client", "sklearn", "skops", "threadpoolctl")

RUN_WITHOUT_EXTRAS = f"""
import sys

BLOCKED = {BLOCKED!r}


class BlockExtras:
    def find_spec(self, name, path=None, target=None):
        if name.split(".")[0] in BLOCKED:
            print(f"BLOCKED IMPORT {{name}}", file=sys.stderr, flush=True)
            raise ModuleNotFoundError(f"No module named {{name!r}}", name=name)
        return None


sys.meta_path.insert(0, BlockExtras())
from tailguard.controller.app.cli import main

sys.exit(main(["run", "--config", sys.argv[1]]))
"""


def _config(tmp_path: Path, extra: str = "") -> Path:
    (tmp_path / "p.yaml").write_text(POLICY.read_text())
    config = tmp_path / "controller.yaml"
    config.write_text(
        "prometheus: {url: 'http://127.0.0.1:9', retries: 0}\npolicies: [p.yaml]\n"
        "journal: j.db\nlisten: 127.0.0.1:0\ntier: {url: 'http://127.0.0.1:9'}\n" + extra
    )
    return config


def _start(config: Path) -> subprocess.Popen[str]:
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    return subprocess.Popen(
        [sys.executable, "-c", RUN_WITHOUT_EXTRAS, str(config)],
        cwd=config.parent,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


def test_run_serves_without_the_extras_when_no_section_needs_them(tmp_path: Path) -> None:
    process = _start(_config(tmp_path))
    assert process.stderr is not None
    lines: list[str] = []
    try:
        deadline = time.monotonic() + 60
        url = None
        while url is None and time.monotonic() < deadline:
            line = process.stderr.readline()
            if not line:
                break
            lines.append(line)
            found = re.search(r"serving on (http://\S+)", line)
            url = found.group(1) if found else None
        assert url is not None, "".join(lines)
        with urllib.request.urlopen(f"{url.rstrip('/')}/healthz", timeout=10) as answer:
            assert answer.status == 200
            json.loads(answer.read() or b"{}")
        process.send_signal(signal.SIGTERM)
        _out, rest = process.communicate(timeout=60)
        lines.append(rest)
    finally:
        if process.poll() is None:
            process.kill()
            process.communicate()
    assert process.returncode == 0, "".join(lines)
    assert "BLOCKED IMPORT" not in "".join(lines)


@pytest.mark.parametrize(
    ("section", "extra", "needed_by"),
    [
        ("kubernetes: {inCluster: false}\n", "cluster", "kubernetes"),
        ("leaderElection: {namespace: tailguard}\n", "cluster", "leaderElection"),
        ("annotations: {path: a.jsonl, grafana: {url: 'http://127.0.0.1:9'}}\n", "cluster", "annotations.grafana"),
        ("predictors: {p99: {path: models/p99}}\n", "ml", "predictors"),
    ],
)
def test_a_section_that_needs_a_missing_extra_names_it(
    tmp_path: Path, section: str, extra: str, needed_by: str
) -> None:
    config = _config(tmp_path, section)
    process = _start(config)
    _out, err = process.communicate(timeout=60)
    assert process.returncode == 2, err
    message = err.strip().splitlines()[-1]
    assert message.startswith(f"{config}: {needed_by} needs the {extra} extra (")
    assert message.endswith(f"not installed): pip install 'tailguard[{extra}]'")
    assert "Traceback" not in err  # (the extras' finder is asked first, so BLOCKED lines are expected here)
