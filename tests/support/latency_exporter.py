"""A tiny vLLM-like exporter in the test process: request-latency histograms whose latency a test switches.

Each scrape adds `requests_per_scrape` requests at the current latency of every service, so the histogram's
rate over any window is exactly what the test set (no background thread, no timing luck). The exposition is the
Prometheus text format 0.0.4 whatever the scraper asks for, so `vllm:` names keep their colons.
"""

from __future__ import annotations

import bisect
import threading
from collections.abc import Iterator, Mapping
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any, Self

from prometheus_client import CONTENT_TYPE_PLAIN_0_0_4, CollectorRegistry, generate_latest
from prometheus_client.core import GaugeMetricFamily, HistogramMetricFamily, Metric
from prometheus_client.registry import Collector

LATENCY_METRIC = "vllm:e2e_request_latency_seconds"
WAITING_METRIC = "vllm:num_requests_waiting"
BUCKETS = (0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0)


class _ServiceSeries:
    def __init__(self, latency: float, waiting: float) -> None:
        self.latency = latency
        self.waiting = waiting
        self.bucket_counts = [0] * (len(BUCKETS) + 1)  # per bucket (not cumulative); the last one is +Inf
        self.total = 0.0


class LatencyCollector(Collector):
    """The histograms and queue gauges of the services; thread-safe against the scrape handler."""

    def __init__(self, labels: Mapping[str, str], requests_per_scrape: int) -> None:
        self.labels = dict(labels)
        self.requests_per_scrape = requests_per_scrape
        self.lock = threading.Lock()
        self.services: dict[str, _ServiceSeries] = {}
        self.scrapes = 0

    def set(self, service: str, latency: float, waiting: float = 1.0) -> None:
        with self.lock:
            series = self.services.setdefault(service, _ServiceSeries(latency, waiting))
            series.latency, series.waiting = latency, waiting

    def collect(self) -> Iterator[Metric]:
        names = sorted(self.labels)
        label_names = ["service", *names]
        with self.lock:
            self.scrapes += 1
            histogram = HistogramMetricFamily(LATENCY_METRIC, "End-to-end request latency.", labels=label_names)
            waiting = GaugeMetricFamily(WAITING_METRIC, "Requests waiting to be scheduled.", labels=label_names)
            for service, series in sorted(self.services.items()):
                # bisect_left: an observation equal to a bound belongs to that bucket (le = "less or equal").
                series.bucket_counts[bisect.bisect_left(BUCKETS, series.latency)] += self.requests_per_scrape
                series.total += series.latency * self.requests_per_scrape
                cumulative: list[tuple[str, float]] = []
                running = 0
                for bound, count in zip([*map(str, BUCKETS), "+Inf"], series.bucket_counts, strict=True):
                    running += count
                    cumulative.append((bound, float(running)))
                values = [service, *(self.labels[name] for name in names)]
                histogram.add_metric(values, cumulative, series.total)
                waiting.add_metric(values, series.waiting)
        yield histogram
        yield waiting


class LatencyExporter:
    """`with LatencyExporter({"namespace": "llm"}) as exporter: exporter.set("svc", 2.0)`; `exporter.target`."""

    def __init__(self, labels: Mapping[str, str], requests_per_scrape: int = 50) -> None:
        self.collector = LatencyCollector(labels, requests_per_scrape)
        self.registry = CollectorRegistry()
        self.registry.register(self.collector)
        self.server = ThreadingHTTPServer(("127.0.0.1", 0), self._handler())
        self.server.daemon_threads = True
        self.thread = threading.Thread(
            target=self.server.serve_forever, kwargs={"poll_interval": 0.05}, name="latency-exporter", daemon=True
        )
        self.thread.start()

    @property
    def target(self) -> str:
        """host:port for a Prometheus static scrape config."""
        host, port = self.server.server_address[:2]
        return f"{host!s}:{port}"

    def set(self, service: str, latency: float, waiting: float = 1.0) -> None:
        self.collector.set(service, latency, waiting)

    @property
    def scrapes(self) -> int:
        with self.collector.lock:
            return self.collector.scrapes

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()
        self.thread.join(timeout=5)

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _handler(self) -> type[BaseHTTPRequestHandler]:
        registry = self.registry

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self) -> None:
                if self.path.split("?")[0] != "/metrics":
                    self.send_error(404)
                    return
                data = generate_latest(registry)
                self.send_response(200)
                self.send_header("Content-Type", CONTENT_TYPE_PLAIN_0_0_4)
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def log_message(self, format: str, *args: Any) -> None:
                pass

        return Handler
