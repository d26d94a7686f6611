"""Check (and with --repair, restore) that `urllib3` in this environment is urllib3's own files.

urllib3-future (a dependency of niquests, which grafana-client 4 and later use) installs itself under the name
`urllib3`, over urllib3's files, and a `.pth` file copies it there again at every interpreter start: `requests`,
`kubernetes` and prometheus-api-client then run on it. tailguard pins grafana-client below 4 (docs/architecture.md,
"HTTP libraries"), so a fresh install never gets it; an environment that had it installed keeps the override until
it is repaired. `make venv` runs this with --repair after installing; tests/unit/test_http_stack.py runs the check.

    python scripts/check_http_stack.py [--repair]

Exit 0: urllib3 is urllib3's own files (after the repair, with --repair); 1: it is not (what is wrong is printed).
"""

from __future__ import annotations

import argparse
import base64
import hashlib
import importlib.metadata
import shutil
import subprocess
import sys
from pathlib import Path

OVERRIDING = ("urllib3-future",)  # distributions that install themselves as `urllib3` (niquests needs one)
OVERRIDE_USERS = ("niquests", "wassima", "qh3", "jh2")  # only there for urllib3-future / niquests


def _digest(path: Path) -> str:
    return "sha256=" + base64.urlsafe_b64encode(hashlib.sha256(path.read_bytes()).digest()).rstrip(b"=").decode()


def problems() -> list[str]:
    """What makes the installed `urllib3` something other than urllib3's own files (empty: nothing)."""
    try:
        dist = importlib.metadata.distribution("urllib3")
    except importlib.metadata.PackageNotFoundError:
        return ["urllib3 is not installed"]
    found: list[str] = []
    changed = []
    for file in dist.files or []:
        if not str(file).startswith("urllib3/") or not str(file).endswith(".py") or file.hash is None:
            continue
        path = Path(str(file.locate()))
        if not path.is_file() or _digest(path) != f"{file.hash.mode}={file.hash.value}":
            changed.append(str(file))
    if changed:
        found.append(f"{len(changed)} of urllib3 {dist.version}'s files are not its own (e.g. {changed[0]})")
    for name in OVERRIDING:
        try:
            other = importlib.metadata.distribution(name)
        except importlib.metadata.PackageNotFoundError:
            continue
        overrides = [str(f) for f in other.files or [] if str(f).endswith(".pth") or str(f).startswith("urllib3/")]
        if overrides:
            found.append(f"{name} {other.version} is installed over urllib3 ({', '.join(overrides[:3])})")
    return found


def repair() -> None:
    """Uninstall urllib3-future (and what only needs it) and reinstall urllib3's own files, in this interpreter's
    environment. The directory is removed first: the override left files urllib3's record does not list."""
    pip = [sys.executable, "-m", "pip"]
    installed = []
    for name in OVERRIDING + OVERRIDE_USERS:
        try:
            importlib.metadata.distribution(name)
        except importlib.metadata.PackageNotFoundError:
            continue
        installed.append(name)
    if installed:
        subprocess.run([*pip, "uninstall", "-y", "-q", *installed], check=True)
    version = importlib.metadata.version("urllib3")
    located = importlib.metadata.distribution("urllib3").locate_file("urllib3")
    shutil.rmtree(Path(str(located)), ignore_errors=True)
    subprocess.run([*pip, "install", "-q", "--force-reinstall", "--no-deps", f"urllib3=={version}"], check=True)


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--repair", action="store_true", help="uninstall the override and reinstall urllib3")
    args = parser.parse_args(argv)
    found = problems()
    if found and args.repair:
        print("urllib3 is overridden; repairing: " + "; ".join(found), file=sys.stderr)
        repair()
        found = problems()
    for problem in found:
        print(f"check_http_stack: {problem}", file=sys.stderr)
    return 1 if found else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
