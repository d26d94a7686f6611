"""The idempotency record every Kubernetes actuator writes on the object it changes.

The idempotency key of every change is written in the same PUT/PATCH to the annotation
`tailguard.io/action-keys` (the last few keys, JSON), so a replayed key is a no-op.
"""

from __future__ import annotations

import json
from collections.abc import Mapping

ANNOTATION_KEYS = "tailguard.io/action-keys"
KEYS_KEPT = 16  # enough for a burst of replays; the journal is the real record


def recorded_keys(annotations: Mapping[str, str] | None) -> list[str]:
    raw = (annotations or {}).get(ANNOTATION_KEYS)
    if not raw:
        return []
    try:
        keys = json.loads(raw)
    except ValueError:
        return []  # a human mangled it: treat as no record rather than failing the action
    return [str(k) for k in keys] if isinstance(keys, list) else []


def with_key(annotations: Mapping[str, str] | None, key: str) -> dict[str, str]:
    """The annotations with `key` appended to the recorded idempotency keys (the last KEYS_KEPT kept)."""
    keys = [k for k in recorded_keys(annotations) if k != key]
    keys.append(key)
    return {**(annotations or {}), ANNOTATION_KEYS: json.dumps(keys[-KEYS_KEPT:], separators=(",", ":"))}
