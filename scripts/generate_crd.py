"""Regenerate deploy/crds/tailguardpolicy.yaml from the policy models (like scripts/generate_schema.py).

tests/unit/test_policy_crd.py fails when the file is out of date.
"""

from __future__ import annotations

import sys
from pathlib import Path

from tailguard.controller.adapters.policies.crd_schema import render_crd

CRD_PATH = Path(__file__).resolve().parent.parent / "deploy" / "crds" / "tailguardpolicy.yaml"


def main() -> int:
    text = render_crd()
    if CRD_PATH.exists() and CRD_PATH.read_text(encoding="utf-8") == text:
        print(f"{CRD_PATH} is up to date")
        return 0
    CRD_PATH.parent.mkdir(parents=True, exist_ok=True)
    CRD_PATH.write_text(text, encoding="utf-8")
    print(f"wrote {CRD_PATH}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
