"""The controller's log output: text for people, one JSON object per line for log pipelines."""

from __future__ import annotations

import json
import logging
from typing import Any

from tailguard.controller.kit.redact import redact_text

# Client libraries that log each request's path at DEBUG (a Slack-style receiver's path is its secret).
PATH_LOGGING_LIBRARIES = ("urllib3", "urllib3_future", "niquests", "kubernetes.client.rest")


class RedactingFilter(logging.Filter):
    """Every URL in a log line (message and exception text) is cut to scheme+host (tailguard.controller.kit.redact): a
    receiver URL's secret may be its path, and a message may carry a URL from anywhere."""

    def filter(self, record: logging.LogRecord) -> bool:
        message = record.getMessage()
        if "://" in message:
            record.msg, record.args = redact_text(message), None
        if record.exc_info and not record.exc_text:
            record.exc_text = logging.Formatter().formatException(record.exc_info)
        if record.exc_text and "://" in record.exc_text:
            record.exc_text = redact_text(record.exc_text)
        return True


class JsonLogFormatter(logging.Formatter):
    """One JSON object per line; structured fields passed as extra={"fields": {...}} are merged in."""

    def format(self, record: logging.LogRecord) -> str:
        entry: dict[str, Any] = {
            "ts": round(record.created, 3),
            "level": record.levelname.lower(),
            "logger": record.name,
            "msg": record.getMessage(),
        }
        fields = getattr(record, "fields", None)
        if isinstance(fields, dict):
            entry.update({key: value for key, value in fields.items() if key not in entry})
        if record.exc_info:
            entry["exception"] = record.exc_text or self.formatException(record.exc_info)
        return json.dumps(entry, default=str, sort_keys=False)


def configure_logging(log_format: str = "text", level: str = "INFO") -> None:
    handler = logging.StreamHandler()
    if log_format == "json":
        handler.setFormatter(JsonLogFormatter())
    else:
        handler.setFormatter(logging.Formatter("%(asctime)s %(levelname)s %(name)s: %(message)s"))
    handler.addFilter(RedactingFilter())
    root = logging.getLogger()
    root.handlers[:] = [handler]
    root.setLevel(level.upper())
    # APScheduler logs every job run at INFO; the controller logs its own evaluation line instead.
    logging.getLogger("apscheduler").setLevel(logging.WARNING)
    for library in PATH_LOGGING_LIBRARIES:
        logging.getLogger(library).setLevel(max(logging.INFO, logging.getLogger().level))
