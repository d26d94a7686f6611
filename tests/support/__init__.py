"""Helpers shared by the integration tests and the benchmark (not collected as tests)."""
