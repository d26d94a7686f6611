"""Metrics sources: Prometheus (prometheus.py) and a scripted fake for tests (fakes.py)."""
