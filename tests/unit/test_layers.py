"""The layer contracts in pyproject.toml ([tool.importlinter]) hold, and each one fails when its forbidden import
is added: a copy of the three packages gets one import that breaks one contract, and `lint-imports` run on that
contract alone must report it broken (and, on the untouched copy, kept)."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
LINT_IMPORTS = Path(sys.executable).with_name("lint-imports")

# contract id -> (module file, the import that breaks it)
FORBIDDEN = {
    "controller-layers": ("controller/kit/durations.py", "import tailguard.controller.loop.metrics"),
    "adapters-on-a-ground-floor": (
        "controller/adapters/kube/events.py",
        "import tailguard.controller.adapters.lease.peers",
    ),
    # the sideways import the ground floor removed: change tracking reaching into the rollback adapter
    "adapter-ports-independent": (
        "controller/adapters/changes/tracker.py",
        "import tailguard.controller.adapters.rollback.argocd",
    ),
    "core-layers": ("controller/core/model.py", "import tailguard.controller.core.engine"),
    # the array library the backtest grid uses, pulled into a core port again (it lives in adapters/metrics/grid.py)
    "core-without-io-types": ("controller/core/ports/metrics.py", "import numpy"),
    "controller-not-serving": ("controller/loop/metrics.py", "import tailguard.serving.lab.load"),
    "controller-reaches-models-through-the-app": ("controller/loop/metrics.py", "import tailguard.predictors.modeling"),
    "predictors-on-kit-and-core": ("predictors/modeling.py", "import tailguard.controller.loop.dispatcher"),
    # serving reaching past the controller's public face into a layer
    "serving-through-the-face": ("serving/tier/profiles.py", "import tailguard.controller.kit.errors"),
    # the tier that ships importing an experiment of the lab
    "serving-lab-on-the-tier": ("serving/tier/profiles.py", "import tailguard.serving.lab.load"),
    "no-circles": ("serving/tier/profiles.py", "import tailguard.serving.tier.server"),
}


def lint(tree: Path, contract: str | None = None) -> subprocess.CompletedProcess[str]:
    command = [str(LINT_IMPORTS), str(tree / "pyproject.toml"), "--no-cache", "--no-logo"]
    if contract is not None:
        command += ["--contract", contract]
    # The copy comes first on the path, before the editable install's finder.
    env = {**os.environ, "PYTHONPATH": str(tree)}
    return subprocess.run(command, cwd=tree, env=env, capture_output=True, text=True, timeout=120, check=False)


@pytest.fixture(scope="module")
def copy(tmp_path_factory: pytest.TempPathFactory) -> Path:
    tree = tmp_path_factory.mktemp("layers")
    for package in ("controller", "predictors", "serving"):
        # under the installed name: tree/tailguard/controller is tailguard.controller on PYTHONPATH=tree
        shutil.copytree(
            REPO / package,
            tree / "tailguard" / package,
            ignore=shutil.ignore_patterns("__pycache__", "data", "calibrations", "profiles", "manifests"),
        )
    shutil.copy(REPO / "pyproject.toml", tree / "pyproject.toml")
    return tree


def test_every_contract_is_kept_on_the_tree() -> None:
    result = lint(REPO)
    assert result.returncode == 0, result.stdout + result.stderr
    assert "0 broken" in result.stdout


def test_the_contracts_in_pyproject_are_the_ones_tested() -> None:
    text = (REPO / "pyproject.toml").read_text()
    declared = {line.split('"')[1] for line in text.splitlines() if line.startswith("id = ")}
    assert declared == set(FORBIDDEN)


@pytest.mark.parametrize("contract", sorted(FORBIDDEN))
def test_a_forbidden_import_breaks_its_contract(copy: Path, contract: str) -> None:
    module, statement = FORBIDDEN[contract]
    path = copy / "tailguard" / module
    original = path.read_text()
    assert lint(copy, contract).returncode == 0
    path.write_text(original + f"\n{statement}  # added by test_layers\n")
    try:
        result = lint(copy, contract)
    finally:
        path.write_text(original)
    assert result.returncode == 1, result.stdout + result.stderr
    assert "BROKEN" in result.stdout
