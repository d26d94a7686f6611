"""Real Prometheus and Alertmanager on 127.0.0.1, for tests, the demo and the benchmark.

Each server runs in its own process group with its own temp dirs and is a
context manager that always kills the whole group, on success or failure.
`backfill_openmetrics` writes history with promtool and checks the sample count
(promtool drops out-of-order samples silently).
"""

from __future__ import annotations

import json
import os
import re
import shutil
import signal
import socket
import subprocess
import tempfile
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from types import TracebackType
from typing import Any, Self

import yaml

from tailguard.serving.errors import LabError

INSTALL_HINT = "apt-get install prometheus prometheus-alertmanager"
HTTP_TIMEOUT = 2.0
START_ATTEMPTS = 3


class PromStackError(LabError, RuntimeError):
    pass


class MissingBinaryError(PromStackError):
    pass


def find_binary(name: str, *alternatives: str) -> str:
    for candidate in (name, *alternatives):
        found = shutil.which(candidate)
        if found:
            return found
    raise MissingBinaryError(
        f"{name} is not installed (looked for {', '.join((name, *alternatives))} on PATH); "
        f"install it with: {INSTALL_HINT}"
    )


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


def http_get(url: str, timeout: float = HTTP_TIMEOUT) -> tuple[int, bytes]:
    """A GET that reports connection failures as status 0 instead of raising."""
    try:
        with urllib.request.urlopen(url, timeout=timeout) as response:
            return int(response.status), bytes(response.read())
    except urllib.error.HTTPError as failed:
        return int(failed.code), failed.read()
    except (urllib.error.URLError, OSError):
        return 0, b""


def wait_until(
    predicate: Callable[[], bool],
    timeout: float,
    what: str,
    interval: float = 0.1,
    alive: Callable[[], str | None] | None = None,
) -> None:
    """Poll `predicate` until true; raise PromStackError naming `what` on timeout or when `alive` says it died."""
    deadline = time.monotonic() + timeout
    while True:
        if predicate():
            return
        if alive is not None:
            death = alive()
            if death is not None:
                raise PromStackError(f"while waiting for {what}: {death}")
        if time.monotonic() >= deadline:
            raise PromStackError(f"timed out after {timeout:g}s waiting for {what}")
        time.sleep(interval)


# -- configuration ----------------------------------------------------------------------------------


def static_scrape_config(
    job: str,
    targets: Sequence[str],
    *,
    metrics_path: str = "/metrics",
    labels: Mapping[str, str] | None = None,
    scrape_interval: str | None = None,
) -> dict[str, Any]:
    config: dict[str, Any] = {
        "job_name": job,
        "metrics_path": metrics_path,
        "static_configs": [{"targets": list(targets), "labels": dict(labels or {})}],
    }
    if scrape_interval:
        config["scrape_interval"] = scrape_interval
    return config


def http_sd_scrape_config(
    job: str,
    sd_url: str,
    *,
    refresh_interval: str = "5s",
    metrics_path: str = "/metrics",
    scrape_interval: str | None = None,
) -> dict[str, Any]:
    config: dict[str, Any] = {
        "job_name": job,
        "metrics_path": metrics_path,
        "http_sd_configs": [{"url": sd_url, "refresh_interval": refresh_interval}],
    }
    if scrape_interval:
        config["scrape_interval"] = scrape_interval
    return config


def write_prometheus_config(
    path: str | Path,
    *,
    scrape_configs: Sequence[Mapping[str, Any]] = (),
    scrape_interval: str = "15s",
    evaluation_interval: str = "15s",
    rule_files: Sequence[str | Path] = (),
    alertmanagers: Sequence[str] = (),
) -> Path:
    """Write prometheus.yml; `alertmanagers` are host:port targets."""
    config: dict[str, Any] = {
        "global": {"scrape_interval": scrape_interval, "evaluation_interval": evaluation_interval},
        "scrape_configs": [dict(c) for c in scrape_configs],
    }
    if rule_files:
        config["rule_files"] = [str(p) for p in rule_files]
    if alertmanagers:
        config["alerting"] = {"alertmanagers": [{"static_configs": [{"targets": list(alertmanagers)}]}]}
    target = Path(path)
    target.write_text(yaml.safe_dump(config, sort_keys=False), encoding="utf-8")
    return target


def write_alertmanager_config(
    path: str | Path,
    webhook_url: str | None = None,
    *,
    group_wait: str = "0s",
    group_interval: str = "1s",
    repeat_interval: str = "1h",
) -> Path:
    receiver: dict[str, Any] = {"name": "default"}
    if webhook_url:
        receiver["webhook_configs"] = [{"url": webhook_url, "send_resolved": True}]
    config = {
        "route": {
            "receiver": "default",
            "group_by": ["alertname"],
            "group_wait": group_wait,
            "group_interval": group_interval,
            "repeat_interval": repeat_interval,
        },
        "receivers": [receiver],
    }
    target = Path(path)
    target.write_text(yaml.safe_dump(config, sort_keys=False), encoding="utf-8")
    return target


# -- backfill ---------------------------------------------------------------------------------------

_BLOCK_ROW = re.compile(r"^[0-9A-Z]{26}\s+(\d+)\s+(\d+)\s+\S+\s+(\d+)\s+(\d+)\s+(\d+)", re.MULTILINE)


@dataclass(frozen=True)
class BackfillResult:
    samples: int
    series_per_block: tuple[int, ...]
    blocks: int


def backfill_openmetrics(
    text_or_path: str | Path,
    data_dir: str | Path,
    *,
    expected_samples: int | None = None,
    timeout: float = 300.0,
) -> BackfillResult:
    """Create TSDB blocks in `data_dir` from OpenMetrics text (or a file) with promtool.

    Raises PromStackError when promtool fails or, given `expected_samples`, when it wrote a different
    number of samples (out-of-order or millisecond timestamps are dropped or misplaced silently).
    """
    promtool = find_binary("promtool")
    data = Path(data_dir)
    data.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix="tailguard-om-") as scratch:
        if isinstance(text_or_path, Path):
            source = text_or_path
        else:
            source = Path(scratch) / "history.om"
            source.write_text(text_or_path, encoding="utf-8")
        completed = subprocess.run(
            [
                promtool,
                "tsdb",
                "create-blocks-from",
                "openmetrics",
                "--max-block-duration=24h",
                str(source),
                str(data),
            ],
            capture_output=True,
            text=True,
            timeout=timeout,
            check=False,
        )
    if completed.returncode != 0:
        raise PromStackError(
            f"promtool create-blocks-from failed ({completed.returncode}): "
            f"{(completed.stderr or completed.stdout).strip()[:1000]}"
        )
    rows = _BLOCK_ROW.findall(completed.stdout)
    samples = sum(int(row[2]) for row in rows)
    result = BackfillResult(samples, tuple(int(row[4]) for row in rows), len(rows))
    if expected_samples is not None and samples != expected_samples:
        raise PromStackError(
            f"promtool wrote {samples} samples, expected {expected_samples}: samples out of "
            "order, duplicated, or with millisecond timestamps are dropped silently"
        )
    return result


# -- servers ----------------------------------------------------------------------------------------


class ProcessNotReady(LabError, RuntimeError):
    """A managed process exited, or did not say it was ready in time; str() says which, with its log's tail."""


@dataclass
class ManagedProcess:
    """A server process in its own process group; stop() kills the group and waits."""

    name: str
    args: list[str]
    log_path: Path
    process: subprocess.Popen[bytes] | None = None
    _log: Any = field(default=None, repr=False)
    # Where this run's output starts in the log: the log is appended to, so an earlier run's lines (a stale
    # "ready" line with another port) are before it and never read as this run's.
    log_offset: int = 0

    def start(self) -> None:
        self._log = open(self.log_path, "ab")  # noqa: SIM115 - closed in stop()
        self.log_offset = self._log.seek(0, os.SEEK_END)
        self.process = subprocess.Popen(
            self.args,
            stdout=self._log,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            start_new_session=True,
        )

    def exited(self) -> str | None:
        if self.process is None:
            return f"{self.name} was not started"
        code = self.process.poll()
        if code is None:
            return None
        return f"{self.name} exited with {code}: {self.log_tail()}"

    def log_text(self) -> str:
        """What this run wrote to the log so far (not what earlier runs left in the same file)."""
        try:
            with self.log_path.open("rb") as handle:
                handle.seek(self.log_offset)
                return handle.read().decode("utf-8", errors="replace")
        except OSError:
            return ""

    def log_tail(self, limit: int = 1500) -> str:
        return self.log_text()[-limit:].strip()

    def wait_ready(self, timeout: float) -> dict[str, Any]:
        """The JSON `{"event": "ready", ...}` line this run printed (the tier prints its ports in it).

        ProcessNotReady (saying why) if the process exits or prints none within `timeout` seconds.
        """
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            failure = self.exited()  # before reading: a line printed just before exiting is still seen
            for line in self.log_text().splitlines():
                if line.startswith("{") and '"ready"' in line:
                    event: dict[str, Any] = json.loads(line)
                    return event
            if failure is not None:
                raise ProcessNotReady(failure)
            time.sleep(0.1)
        raise ProcessNotReady(f"{self.name} did not become ready within {timeout:g}s: {self.log_tail()}")

    def stop(self, grace: float = 5.0) -> None:
        process = self.process
        if process is not None:
            for sig, wait in ((signal.SIGTERM, grace), (signal.SIGKILL, grace)):
                if process.poll() is not None:
                    break
                try:
                    os.killpg(process.pid, sig)
                except ProcessLookupError:
                    break
                try:
                    process.wait(timeout=wait)
                except subprocess.TimeoutExpired:
                    continue
            # Children left in the group (none expected) go too.
            try:
                os.killpg(process.pid, signal.SIGKILL)
            except (ProcessLookupError, PermissionError):
                pass
            if process.poll() is None:
                process.wait(timeout=grace)
        if self._log is not None:
            self._log.close()
            self._log = None


class _Server:
    name = "server"

    def __init__(self, workdir: Path, keep_workdir: bool):
        self.workdir = workdir
        self._keep = keep_workdir
        self.port = 0
        self._process: ManagedProcess | None = None

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    @property
    def running(self) -> bool:
        return self._process is not None and self._process.exited() is None

    def log_tail(self) -> str:
        return self._process.log_tail() if self._process else ""

    def _args(self, port: int) -> list[str]:
        raise NotImplementedError

    def start(self, timeout: float = 30.0) -> Self:
        last_error = ""
        for _ in range(START_ATTEMPTS):  # another process can grab the free port before we bind it
            self.port = free_port()
            self._process = ManagedProcess(self.name, self._args(self.port), self.workdir / f"{self.name}.log")
            self._process.start()
            try:
                wait_until(self._ready, timeout, f"{self.name} ready on {self.url}", alive=self._process.exited)
                return self
            except PromStackError as failed:
                last_error = str(failed)
                self._process.stop()
                if "address already in use" not in last_error:
                    break
        self.stop()
        raise PromStackError(last_error)

    def _ready(self) -> bool:
        status, _ = http_get(f"{self.url}/-/ready")
        return status == 200

    def stop(self) -> None:
        if self._process is not None:
            self._process.stop()
        if not self._keep:
            shutil.rmtree(self.workdir, ignore_errors=True)

    def __enter__(self) -> Self:
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.stop()


class PrometheusServer(_Server):
    """`with PrometheusServer(config=..., data_dir=...).start() as prom: prom.url`"""

    name = "prometheus"

    def __init__(
        self,
        config: str | Path | None = None,
        data_dir: str | Path | None = None,
        *,
        workdir: str | Path | None = None,
        extra_args: Sequence[str] = (),
        keep_workdir: bool = False,
    ):
        self.binary = find_binary("prometheus")
        work = Path(workdir) if workdir is not None else Path(tempfile.mkdtemp(prefix="tailguard-prom-"))
        work.mkdir(parents=True, exist_ok=True)
        super().__init__(work, keep_workdir or workdir is not None)
        self.data_dir = Path(data_dir) if data_dir is not None else work / "data"
        self.config = Path(config) if config is not None else write_prometheus_config(work / "prometheus.yml")
        self.extra_args = list(extra_args)

    def _args(self, port: int) -> list[str]:
        return [
            self.binary,
            f"--config.file={self.config}",
            f"--storage.tsdb.path={self.data_dir}",
            f"--web.listen-address=127.0.0.1:{port}",
            "--storage.tsdb.retention.time=100y",
            "--web.enable-lifecycle",
            *self.extra_args,
        ]

    def api(self, path: str) -> Any:
        status, body = http_get(f"{self.url}{path}")
        if status != 200:
            raise PromStackError(f"GET {path} answered {status}: {body[:300]!r}")
        return json.loads(body)["data"]

    def wait_target_up(self, job: str, timeout: float = 30.0, count: int = 1) -> None:
        def up() -> bool:
            try:
                targets = self.api("/api/v1/targets?state=active")["activeTargets"]
            except (PromStackError, ValueError, KeyError):
                return False
            healthy = [t for t in targets if t.get("labels", {}).get("job") == job and t.get("health") == "up"]
            return len(healthy) >= count

        wait_until(up, timeout, f"{count} target(s) of job {job!r} up", interval=0.25, alive=self._alive)

    def wait_series(self, query: str, timeout: float = 30.0) -> None:
        """Wait until an instant query returns at least one series (e.g. the first scrape landed)."""

        def present() -> bool:
            from urllib.parse import quote

            try:
                return bool(self.api(f"/api/v1/query?query={quote(query)}")["result"])
            except (PromStackError, ValueError, KeyError):
                return False

        wait_until(present, timeout, f"series for {query!r}", interval=0.25, alive=self._alive)

    def wait_alertmanagers_discovered(self, count: int = 1, timeout: float = 30.0) -> None:
        def discovered() -> bool:
            try:
                return len(self.api("/api/v1/alertmanagers")["activeAlertmanagers"]) >= count
            except (PromStackError, ValueError, KeyError):
                return False

        wait_until(discovered, timeout, f"{count} alertmanager(s) discovered", interval=0.25, alive=self._alive)

    def _alive(self) -> str | None:
        return self._process.exited() if self._process else "prometheus was not started"


class AlertmanagerServer(_Server):
    name = "alertmanager"

    def __init__(
        self,
        config: str | Path | None = None,
        *,
        webhook_url: str | None = None,
        workdir: str | Path | None = None,
        keep_workdir: bool = False,
    ):
        self.binary = find_binary("prometheus-alertmanager", "alertmanager")
        work = Path(workdir) if workdir is not None else Path(tempfile.mkdtemp(prefix="tailguard-am-"))
        work.mkdir(parents=True, exist_ok=True)
        super().__init__(work, keep_workdir or workdir is not None)
        self.config = (
            Path(config) if config is not None else write_alertmanager_config(work / "alertmanager.yml", webhook_url)
        )

    @property
    def address(self) -> str:
        return f"127.0.0.1:{self.port}"

    def _args(self, port: int) -> list[str]:
        return [
            self.binary,
            f"--config.file={self.config}",
            f"--storage.path={self.workdir / 'data'}",
            f"--web.listen-address=127.0.0.1:{port}",
            "--cluster.listen-address=",
        ]


def start_prometheus(
    config: str | Path | None = None, data_dir: str | Path | None = None, **kwargs: Any
) -> PrometheusServer:
    return PrometheusServer(config, data_dir, **kwargs).start()


def start_alertmanager(config: str | Path | None = None, **kwargs: Any) -> AlertmanagerServer:
    return AlertmanagerServer(config, **kwargs).start()
