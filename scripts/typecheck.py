"""mypy on the source tree under the installed names (`make typecheck`; extra arguments go to mypy).

The project installs one import package, `tailguard`, mapped from the folders controller/, serving/ and
predictors/ (pyproject.toml, [tool.setuptools.package-dir]); the editable install's finder is an import hook,
which mypy does not run. So mypy is started in a directory outside the tree that holds `tailguard/`: an empty
`__init__.py` and three links, controller -> this checkout's controller/, and so on. There
`tailguard.controller` is the folder controller/, mypy checks the modules under their real names, and its
messages read `tailguard/controller/...`. (A single link `tailguard -> checkout` is not enough: under a
namespace package without `__init__.py` mypy takes the data folder serving/profiles/ for the module
serving/profiles.py.) The directory is one per checkout (under the system's temporary directory) and is
kept, so mypy's cache (.mypy_cache in the checkout) stays warm.

    .venv/bin/python scripts/typecheck.py [MYPY ARGS...]
"""

from __future__ import annotations

import hashlib
import os
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


PACKAGES = ("controller", "serving", "predictors")


def _link(link: Path, target: Path) -> None:
    if link.is_symlink() and link.resolve() == target:
        return
    temporary = link.with_name(f".{link.name}-{os.getpid()}")
    temporary.symlink_to(target, target_is_directory=True)
    temporary.replace(link)  # atomic: a concurrent run never sees a missing link


def link_root(root: Path = ROOT) -> Path:
    """A directory holding `tailguard/` (`__init__.py` and a link per package folder of `root`), made or repaired."""
    digest = hashlib.sha256(str(root).encode()).hexdigest()[:12]
    base = Path(tempfile.gettempdir()) / f"tailguard-typecheck-{os.getuid()}-{digest}"
    base.mkdir(mode=0o700, exist_ok=True)
    package = base / "tailguard"
    if package.is_symlink():
        package.unlink()
    package.mkdir(exist_ok=True)
    init = package / "__init__.py"
    if not init.is_file():
        init.write_text('"""The installed namespace, as scripts/typecheck.py shows it to mypy."""\n', encoding="utf-8")
    for name in PACKAGES:
        _link(package / name, root / name)
    return base


def main(argv: list[str]) -> int:
    base = link_root()
    command = [
        sys.executable,
        "-m",
        "mypy",
        "--config-file",
        str(ROOT / "pyproject.toml"),
        "--cache-dir",
        str(ROOT / ".mypy_cache"),
        *argv,
    ]
    # MYPYPATH empty: only the link directory (mypy's working directory) names `tailguard`.
    env = {**os.environ, "MYPYPATH": ""}
    return subprocess.run(command, cwd=base, env=env, check=False).returncode


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
