"""`tailguard rules validate`'s parser check: every rendered signal query through the real Prometheus parser.

Two ways, the first that is available:

* `--prometheus URL`: each query is sent once as an instant query; one Prometheus answers `400 bad_data` for
  (a PromQL error) is an error at the file:line of that signal's `query`;
* `promtool` on PATH (Debian's `prometheus` package ships it): the queries become recording rules of a
  generated rules file (one group per query) and `promtool check rules` parses them; each failure is mapped back
  to its policy file and line.

Without either the command fails (exit 2: "install promtool or pass --prometheus"); `--skip-promql` skips the
check explicitly, and says so on stderr. The container image ships promtool (Dockerfile).
"""

from __future__ import annotations

import json
import re
import shutil
import subprocess
import tempfile
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from pydantic import ValidationError

from tailguard.controller.adapters.metrics.prometheus import PrometheusSettings, PrometheusSource, SourceConfigError
from tailguard.controller.core.policy_files import LoadedPolicy, PolicyError
from tailguard.controller.core.signals import refused_queries, render_signal_queries
from tailguard.controller.kit.clock import SystemClock
from tailguard.controller.kit.errors import SourceError

PROMTOOL_TIMEOUT_SECONDS = 60.0
# promtool check rules: `FILE: L:C: group "q3", rule 1, "tailguard:q3": could not parse expression: 1:17: ...`
_PROMTOOL_ERROR = re.compile(r'group "q(?P<index>\d+)", rule \d+, "[^"]*": (?P<message>.*)$')


class ParserUnavailable(SourceError):
    """The parser check could not run (promtool broke, Prometheus unreachable): why, in one sentence."""


@dataclass(frozen=True)
class _Query:
    loaded: LoadedPolicy
    signal: str
    text: str

    def error(self, message: str) -> PolicyError:
        return PolicyError(
            self.loaded.file,
            self.loaded.query_line(self.signal),
            self.loaded.query_field(self.signal),
            f"{message} (policy {self.loaded.policy.name!r}, signal {self.signal!r})",
        )


def _queries(loaded: Sequence[LoadedPolicy]) -> list[_Query]:
    return [
        _Query(entry, signal, text)
        for entry in loaded
        for signal, text in render_signal_queries(entry.policy).items()
    ]


def promtool_path() -> str | None:
    return shutil.which("promtool")


def promtool_errors(loaded: Sequence[LoadedPolicy], promtool: str) -> list[PolicyError]:
    """Parse every rendered query with `promtool check rules`; ParserUnavailable when promtool itself fails."""
    queries = _queries(loaded)
    if not queries:
        return []
    # JSON is YAML: every query is quoted exactly, whatever it holds.
    groups = [
        {"name": f"q{index}", "rules": [{"record": f"tailguard:q{index}", "expr": query.text}]}
        for index, query in enumerate(queries)
    ]
    with tempfile.TemporaryDirectory(prefix="tailguard-promtool-") as directory:
        rules = Path(directory) / "queries.rules.yaml"
        rules.write_text(json.dumps({"groups": groups}, indent=1), encoding="utf-8")
        try:
            done = subprocess.run(
                [promtool, "check", "rules", str(rules)],
                capture_output=True,
                text=True,
                timeout=PROMTOOL_TIMEOUT_SECONDS,
                check=False,
            )
        except (OSError, subprocess.TimeoutExpired) as broken:
            raise ParserUnavailable(f"promtool could not run: {broken}") from None
    if done.returncode == 0:
        return []
    errors: list[PolicyError] = []
    for line in (done.stdout + "\n" + done.stderr).splitlines():
        found = _PROMTOOL_ERROR.search(line)
        if found is None:
            continue
        index = int(found["index"])
        if 0 <= index < len(queries):
            errors.append(queries[index].error(f"PromQL does not parse (promtool): {found['message']}"))
    if not errors:
        shown = (done.stderr or done.stdout).strip().replace("\n", " ")[:300]
        raise ParserUnavailable(f"promtool check rules failed without naming a query (exit {done.returncode}): {shown}")
    return errors


def prometheus_errors(loaded: Sequence[LoadedPolicy], url: str, timeout: float = 10.0) -> list[PolicyError]:
    """Send every rendered query once to Prometheus at `url`; a `bad_data` refusal is an error of that query.

    ParserUnavailable when the URL is unusable or Prometheus does not answer.
    """
    try:
        settings = PrometheusSettings(url=url, timeout=timeout, retries=1)
        source = PrometheusSource(settings, SystemClock())
    except ValidationError:
        raise ParserUnavailable(f"--prometheus: expected an http(s):// URL, got {url!r}") from None
    except SourceConfigError as unusable:
        raise ParserUnavailable(str(unusable)) from None
    errors: list[PolicyError] = []
    with source:
        unreachable = source.probe()
        if unreachable is not None:
            raise ParserUnavailable(f"Prometheus is not usable: {unreachable}")
        for entry in loaded:
            for signal, why in sorted(refused_queries(source, entry.policy).items()):
                errors.append(_Query(entry, signal, "").error(f"Prometheus refuses the query: {why}"))
    return errors
