"""An alert storm through a real Alertmanager into the controller's webhook (issue 24 item 7).

`GROUPS` alerts, each in its own group (route `group_by: [alertname, group]`, `group_wait: 0s`), are posted to a
real Alertmanager (Debian's prometheus-alertmanager) at once: every group flushes its notification to the webhook
at the same moment, as after an Alertmanager restart or a cluster-wide outage. Counted from Alertmanager itself:
notifications delivered and failed (`alertmanager_notifications_*`), notification requests and failed requests
(`alertmanager_notification_requests_*`: each failed attempt, which Alertmanager retries), and in its log the
failed attempts by cause: `connection reset by peer` (an RST from the controller) and `EOF` / `server closed idle
connection` (a kept-alive connection closed by the controller as it was reused).
"""

from __future__ import annotations

import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import requests
import yaml

from tailguard.serving.lab.promstack import AlertmanagerServer


@dataclass(frozen=True)
class StormResult:
    groups: int
    delivered: int  # notifications that reached the webhook and were answered 2xx
    failed_notifications: int  # given up on (Alertmanager gave up retrying)
    requests: int  # notification attempts
    failed_requests: int  # attempts that failed (retried by Alertmanager)
    resets: int  # failed attempts: connection reset by peer
    closed: int  # failed attempts: EOF / server closed idle connection
    seconds: float  # from the post of the alerts to the last delivery

    def to_json(self) -> dict[str, Any]:
        return asdict(self)


def _metric(text: str, name: str) -> float:
    total = 0.0
    for line in text.splitlines():
        if line.startswith(name + "{") and 'integration="webhook"' in line:
            total += float(line.rsplit(" ", 1)[1])
    return total


def run_storm(webhook_url: str, groups: int, workdir: Path, *, timeout: float = 120.0) -> StormResult:
    """Post `groups` alerts in as many groups to a fresh Alertmanager that notifies `webhook_url`."""
    workdir.mkdir(parents=True, exist_ok=True)
    config = {
        "route": {
            "receiver": "tailguard",
            "group_by": ["alertname", "group"],
            "group_wait": "0s",
            "group_interval": "5m",
            "repeat_interval": "1h",
        },
        "receivers": [{"name": "tailguard", "webhook_configs": [{"url": webhook_url, "send_resolved": True}]}],
    }
    (workdir / "alertmanager.yml").write_text(yaml.safe_dump(config), encoding="utf-8")
    alertmanager = AlertmanagerServer(workdir / "alertmanager.yml", workdir=workdir / "am").start()
    try:
        alerts = [
            {"labels": {"alertname": "TailguardStorm", "group": f"g{n}", "service": "checkout", "namespace": "llm"}}
            for n in range(groups)
        ]
        started = time.monotonic()
        posted = requests.post(f"http://{alertmanager.address}/api/v2/alerts", json=alerts, timeout=30)
        posted.raise_for_status()
        deadline = started + timeout
        while True:
            text = requests.get(f"http://{alertmanager.address}/metrics", timeout=10).text
            sent = _metric(text, "alertmanager_notifications_total")
            failed = _metric(text, "alertmanager_notifications_failed_total")
            answered = _metric(text, "alertmanager_notification_requests_total") - _metric(
                text, "alertmanager_notification_requests_failed_total"
            )  # counted a moment after the notification's own
            if (sent - failed >= groups and answered >= groups) or time.monotonic() > deadline:
                break
            time.sleep(0.2)
        seconds = time.monotonic() - started
        log_file = alertmanager.workdir / "alertmanager.log"
        log = log_file.read_text(encoding="utf-8", errors="replace") if log_file.exists() else ""
        attempts = [line for line in log.splitlines() if "Notify attempt failed" in line]
        return StormResult(
            groups=groups,
            delivered=int(sent - failed),
            failed_notifications=int(failed),
            requests=int(_metric(text, "alertmanager_notification_requests_total")),
            failed_requests=int(_metric(text, "alertmanager_notification_requests_failed_total")),
            resets=sum("connection reset" in line for line in attempts),
            closed=sum("EOF" in line or "server closed idle connection" in line for line in attempts),
            seconds=seconds,
        )
    finally:
        alertmanager.stop()
