"""scripts/ensure-system-deps.sh and the Makefile: `make demo` never installs chromium (a fresh clone's demo stays
within its time), `make test` does (the status page's browser test needs it). The script runs with a PATH of stubs:
Prometheus, Alertmanager and Python present, chromium absent, apt-get recording what it was asked to install."""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
SCRIPT = REPO / "scripts" / "ensure-system-deps.sh"


@pytest.fixture
def stub_path(tmp_path: Path) -> Path:
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    for tool in ("bash", "env", "awk", "tr", "printf", "id", "cat"):
        found = shutil.which(tool)
        assert found is not None, tool
        (bin_dir / tool).symlink_to(found)
    for present in ("prometheus", "promtool", "prometheus-alertmanager", "python3"):  # python3: with venv
        (bin_dir / present).write_text("#!/bin/sh\nexit 0\n")
        (bin_dir / present).chmod(0o755)
    log = tmp_path / "apt.log"
    (bin_dir / "apt-get").write_text(f'#!/bin/sh\necho "$@" >> {log}\n')
    (bin_dir / "apt-get").chmod(0o755)
    return bin_dir


def run(stub_path: Path, *args: str) -> tuple[subprocess.CompletedProcess[str], list[str]]:
    env = {"PATH": str(stub_path), "HOME": str(stub_path.parent)}
    done = subprocess.run([str(stub_path / "bash"), str(SCRIPT), *args], env=env, capture_output=True, text=True,
                          timeout=60, check=False)  # fmt: skip
    log = stub_path.parent / "apt.log"
    return done, log.read_text().splitlines() if log.exists() else []


@pytest.mark.skipif(os.geteuid() != 0, reason="the stubbed apt-get path is the root one (no sudo stub)")
def test_chromium_only_with_the_browser_flag(stub_path: Path) -> None:
    done, apt = run(stub_path)
    assert done.returncode == 0, done.stderr
    assert apt == [], "everything else is present: nothing to install, and never chromium for the demo"
    done, apt = run(stub_path, "--with-browser")
    assert done.returncode == 0, done.stderr
    assert apt[0] == "update -qq" and "chromium" in apt[1].split()
    assert run(stub_path, "--bogus")[0].returncode == 2


def test_make_demo_does_not_ask_for_the_browser_and_make_test_does() -> None:
    make = shutil.which("make")
    assert make is not None
    demo = subprocess.run([make, "-n", "demo"], cwd=REPO, capture_output=True, text=True, timeout=60, check=False)
    test = subprocess.run([make, "-n", "test"], cwd=REPO, capture_output=True, text=True, timeout=60, check=False)
    assert demo.returncode == 0 and test.returncode == 0, demo.stderr + test.stderr
    assert "ensure-system-deps.sh" in demo.stdout and "--with-browser" not in demo.stdout
    assert "ensure-system-deps.sh --with-browser" in test.stdout
