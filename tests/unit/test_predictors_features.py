"""Features are batched (one query per feature, grouped by the target labels) and shared by train and serve."""

from __future__ import annotations

import math
import re

import numpy as np

from tailguard.controller.core.model import SignalResult, target_key
from tailguard.predictors.features import (
    FEATURES,
    feature_hash,
    feature_matrix,
    feature_names,
    feature_queries,
    sli_queries,
)


def test_one_query_per_feature_grouped_by_the_target_labels() -> None:
    queries = feature_queries({"namespace": "llm"}, ["service", "version"])
    assert list(queries) == feature_names()
    assert len(set(feature_names())) == len(FEATURES)
    for name, query in queries.items():
        assert "{{" not in query, name
        assert "by (service,version)" in query or "by (le, service,version)" in query, name
        # every selector carries the policy's matcher
        for selector in re.findall(r"\{([^{}]*)\}", query):
            if selector.strip():
                assert 'namespace="llm"' in selector, (name, selector)


def test_label_values_are_escaped() -> None:
    queries = feature_queries({"namespace": 'a"b'}, ["service"])
    assert 'namespace="a\\"b"' in queries["queue_waiting"]


def test_sli_queries_are_the_current_sli_features() -> None:
    features = feature_queries({}, ["service"])
    slis = sli_queries({}, ["service"])
    assert slis["cpu"] == features["queue_time_p99"]
    assert slis["gpu"] == features["inference_time_p99"]
    assert slis["network"] == features["network_overhead_p99"]


def test_feature_hash_depends_on_names_and_order() -> None:
    names = feature_names()
    assert feature_hash() == feature_hash(names)
    assert feature_hash(names[:-1]) != feature_hash()
    assert feature_hash(list(reversed(names))) != feature_hash()
    assert re.fullmatch(r"[0-9a-f]{64}", feature_hash())


def test_feature_matrix_nan_for_missing_errored_and_infinite() -> None:
    a, b = target_key({"service": "a"}), target_key({"service": "b"})
    results = {
        "request_rate": SignalResult({a: 2.0, b: 3.0}),
        "queue_waiting": SignalResult({a: math.inf}),
        "kv_cache_usage": SignalResult.failed("boom"),
    }
    matrix = feature_matrix(results, [a, b])
    names = feature_names()
    assert matrix.shape == (2, len(names))
    assert matrix[0, names.index("request_rate")] == 2.0
    assert matrix[1, names.index("request_rate")] == 3.0
    assert np.isnan(matrix[0, names.index("queue_waiting")])
    assert np.isnan(matrix[:, names.index("kv_cache_usage")]).all()
    assert np.isnan(matrix[:, names.index("replicas")]).all()
