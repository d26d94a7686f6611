"""Regenerate rules/schema.json from the policy models (run by `make schema`).

The file is what editors validate against; tests/unit/test_schema.py fails when it is out of date.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

from tailguard.controller.core.policy import policy_json_schema

SCHEMA_PATH = Path(__file__).resolve().parent.parent / "rules" / "schema.json"


def render_schema() -> str:
    """Pretty, sorted keys, trailing newline: stable output, so diffs show only real changes."""
    return json.dumps(policy_json_schema(), indent=2, sort_keys=True) + "\n"


def main() -> int:
    text = render_schema()
    if SCHEMA_PATH.exists() and SCHEMA_PATH.read_text(encoding="utf-8") == text:
        print(f"{SCHEMA_PATH} is up to date")
        return 0
    SCHEMA_PATH.write_text(text, encoding="utf-8")
    print(f"wrote {SCHEMA_PATH}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
