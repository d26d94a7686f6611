"""Issue 22 (2): one HTTP stack, chosen on purpose: `urllib3` in the installed environment is urllib3's own files.

grafana-client 4 and later pull in niquests and so urllib3-future, which installs itself as `urllib3` (over its
files, and again at each interpreter start through a .pth file): `requests`, `kubernetes` and prometheus-api-client
then ran on it, and its read1 cut gzip answers short (tests/integration/test_large_answers.py). The project pins
grafana-client below 4 (docs/architecture.md, "HTTP libraries"); `make venv` repairs an environment that had the
override (scripts/check_http_stack.py --repair). Here: the check finds nothing wrong, the modules the clients
import are those files, and `pip check` passes."""

from __future__ import annotations

import importlib.metadata
import importlib.util
import subprocess
import sys
from pathlib import Path
from types import ModuleType

import requests.adapters
import urllib3

ROOT = Path(__file__).resolve().parents[2]


def check_module() -> ModuleType:
    spec = importlib.util.spec_from_file_location("check_http_stack", ROOT / "scripts" / "check_http_stack.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_urllib3_is_urllib3s_own_files() -> None:
    assert check_module().problems() == []
    assert urllib3.__version__ == importlib.metadata.version("urllib3")
    recorded = Path(str(importlib.metadata.distribution("urllib3").locate_file("urllib3/__init__.py")))
    assert Path(urllib3.__file__ or "").resolve() == recorded.resolve()
    assert importlib.util.find_spec("urllib3.backend") is None  # urllib3-future's own subpackage


def test_requests_and_kubernetes_run_on_that_urllib3() -> None:
    from kubernetes.client import rest

    assert requests.adapters.PoolManager.__module__ == "urllib3.poolmanager"
    assert sys.modules[requests.adapters.PoolManager.__module__].__file__ == sys.modules["urllib3.poolmanager"].__file__
    assert rest.urllib3 is urllib3


def test_grafana_client_is_on_requests_too() -> None:
    requirements = importlib.metadata.requires("grafana-client") or []
    assert not [r for r in requirements if r.startswith(("niquests", "urllib3-future", "urllib3.future"))]
    assert any(r.startswith("requests") for r in requirements)


def test_pip_check_passes() -> None:
    checked = subprocess.run(
        [sys.executable, "-m", "pip", "check"], capture_output=True, text=True, timeout=120, check=False
    )
    assert checked.returncode == 0, checked.stdout + checked.stderr
