"""The journal's flapping load of issue 24 (item 8), shared by tests/unit/test_journal_flapping.py and
tests/bench/bench_journal_soak.py: 1,000 targets, 200 of them in a long incident (breaching at every evaluation,
so firing: their evidence window slides at every evaluation), and 0.5% of the targets changing phase at each
evaluation: 5 targets start a one-evaluation breach (OK -> PENDING; `for: 2` is not reached) and the 5 of the
evaluation before go back to OK. Every value moves at every evaluation."""

from __future__ import annotations

from tailguard.controller.core.model import TargetKey, target_key
from tailguard.controller.core.policy import Policy

TARGETS = 1000
CHANGING = 5  # 0.5% of the targets change phase at each evaluation
INCIDENT = 200  # targets breaching throughout


def flapping_policy() -> Policy:
    return Policy.model_validate(
        {
            "apiVersion": "tailguard.io/v1alpha1",
            "kind": "Policy",
            "name": "flap",
            "interval": "15s",
            "targets": {"groupBy": ["service"]},
            "signals": [{"name": "p99", "query": "p99"}],
            "conditions": [
                {
                    "name": "p99-high",
                    "signal": "p99",
                    "when": {"op": ">", "value": 0.8},
                    "for": 2,
                    "noData": "hold",
                    "actions": [{"type": "annotate", "text": "{{ value }}"}],
                }
            ],
        }
    )


def flapping_targets(count: int = TARGETS) -> list[TargetKey]:
    return [target_key({"service": f"svc-{i:04d}"}) for i in range(count)]


def flapping_values(
    cycle: int, keys: list[TargetKey], changing: int = CHANGING, incident: int = INCIDENT
) -> dict[TargetKey, float]:
    """The p99 of every target at evaluation `cycle` (> 0.8 breaches)."""
    flapping = {(cycle * changing + k) % (len(keys) - incident) + incident for k in range(changing)}
    return {
        key: (1.0 + (cycle % 10) / 100 if i < incident or i in flapping else 0.2 + ((i + cycle) % 7) / 100)
        for i, key in enumerate(keys)
    }
