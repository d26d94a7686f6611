"""The wheel the controller image is built from (Dockerfile, first stage) holds everything the code reads, under
one import package.

Built offline from a copy of the sources with the same command the Dockerfile runs (minus the
dependencies), then imported from the unpacked wheel instead of the working tree: a data file the
code reads at run time but `[tool.setuptools.package-data]` leaves out fails here, not in a cluster.
The wheel installs exactly one top-level name, `tailguard` (tailguard.controller, tailguard.serving,
tailguard.predictors, mapped from the folders of the same names), so nothing in site-packages is called
`controller` or `serving` (issue 26).
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
import tomllib
import zipfile
from pathlib import Path

import pytest

pytestmark = pytest.mark.integration

REPO = Path(__file__).resolve().parents[2]
NAMESPACE = "tailguard"
PACKAGES = ("controller", "serving", "predictors")  # folders at the root, installed as tailguard.<folder>
# The non-Python files the packages read at run time (tailguard.serving.tier.profiles,
# tailguard.serving.lab.calibration, tailguard.serving.lab.load).
DATA_GLOBS = (
    "serving/tier/profiles/*.yaml",
    "serving/tier/calibrations/*.yaml",
    "serving/tier/calibrations/**/*",
    "serving/lab/data/**/*",
)


def _installed(path: Path) -> str:
    """The wheel entry of a file of the tree: serving/x.py -> tailguard/serving/x.py."""
    return f"{NAMESPACE}/{path.relative_to(REPO).as_posix()}"


@pytest.fixture(scope="module")
def wheel(tmp_path_factory: pytest.TempPathFactory) -> Path:
    source = tmp_path_factory.mktemp("source")
    for name in ("pyproject.toml", "README.md"):
        shutil.copy2(REPO / name, source / name)
    for package in PACKAGES:
        shutil.copytree(REPO / package, source / package, ignore=shutil.ignore_patterns("__pycache__"))
    out = tmp_path_factory.mktemp("wheels")
    built = subprocess.run(
        [sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "--no-index", "-q"]
        + ["-w", str(out), str(source)],
        check=False,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert built.returncode == 0, built.stderr
    (path,) = out.glob("tailguard-*.whl")
    return path


def test_wheel_holds_every_module_and_data_file(wheel: Path) -> None:
    names = set(zipfile.ZipFile(wheel).namelist())
    expected = {
        _installed(path)
        for package in PACKAGES
        for path in (REPO / package).rglob("*.py")
        if "__pycache__" not in path.parts
    }
    expected |= {_installed(p) for glob in DATA_GLOBS for p in REPO.glob(glob) if p.is_file()}
    assert any(name.startswith(f"{NAMESPACE}/serving/tier/calibrations/") for name in expected)
    assert any(name.startswith(f"{NAMESPACE}/serving/tier/profiles/") for name in expected)
    assert any(name.startswith(f"{NAMESPACE}/serving/lab/data/") for name in expected)
    assert expected - names == set()


def test_wheel_installs_one_top_level_package(wheel: Path) -> None:
    names = zipfile.ZipFile(wheel).namelist()
    top = {name.split("/")[0] for name in names}
    (dist_info,) = {name for name in top if name.endswith(".dist-info")}
    assert top - {dist_info} == {NAMESPACE}
    # no `tailguard/__init__.py`: an implicit namespace package holding exactly the three folders
    assert {name.split("/")[1] for name in names if name.startswith(f"{NAMESPACE}/")} == set(PACKAGES)
    if f"{dist_info}/top_level.txt" in names:
        assert set(zipfile.ZipFile(wheel).read(f"{dist_info}/top_level.txt").decode().split()) == {NAMESPACE}


def test_pyproject_lists_every_package_of_the_tree() -> None:
    """setuptools cannot discover packages under a prefix, so [tool.setuptools] lists them: a new folder with an
    __init__.py must be added there (or the wheel and the image silently lack it)."""
    listed = set(tomllib.loads((REPO / "pyproject.toml").read_text(encoding="utf-8"))["tool"]["setuptools"]["packages"])
    tree = {
        ".".join((NAMESPACE, *init.parent.relative_to(REPO).parts))
        for package in PACKAGES
        for init in (REPO / package).rglob("__init__.py")
        if "__pycache__" not in init.parts
    }
    assert tree - listed == set(), "add these to [tool.setuptools] packages in pyproject.toml"
    assert listed - tree == set(), "these packages are listed in pyproject.toml but have no folder"


def test_wheel_declares_the_console_script_and_the_extras_the_dockerfile_installs(wheel: Path) -> None:
    archive = zipfile.ZipFile(wheel)
    dist_info = next(n.split("/")[0] for n in archive.namelist() if n.endswith(".dist-info/METADATA"))
    entry_points = archive.read(f"{dist_info}/entry_points.txt").decode()
    # the controller's commands plus the serving lab's demo and load (serving/cli.py)
    assert re.search(r"^tailguard = tailguard\.serving\.cli:main$", entry_points, re.MULTILINE)
    # The kubectl plugin: kubectl runs `kubectl-tailguard` from PATH for `kubectl tailguard ...`.
    assert re.search(
        r"^kubectl-tailguard = tailguard\.controller\.app\.kubectl_plugin:plugin_main$", entry_points, re.MULTILINE
    )
    metadata = archive.read(f"{dist_info}/METADATA").decode()
    extras = set(re.findall(r"^Provides-Extra: (\S+)$", metadata, re.MULTILINE))
    dockerfile = (REPO / "Dockerfile").read_text(encoding="utf-8")
    installed = re.findall(r"tailguard\[([a-z,]+)\]", dockerfile) + re.findall(r"'\.\[([a-z,]+)\]'", dockerfile)
    assert installed, "the Dockerfile no longer installs the project with extras"
    for group in installed:
        assert set(group.split(",")) <= extras


def test_the_unpacked_wheel_finds_its_own_data(wheel: Path, tmp_path: Path) -> None:
    zipfile.ZipFile(wheel).extractall(tmp_path)
    probe = (
        "import tailguard.serving.tier.profiles as p, tailguard.serving.lab.load as l, tailguard.controller.app.cli;"
        f"assert p.__file__.startswith({str(tmp_path)!r}), p.__file__;"
        "print(p.resolve_profile('tiny-cpu-stable').hardware.decode_step_base_s,"
        " len(l.read_trace(l.BUILTIN_TRACES['conv'])) > 1000)"
    )
    result = subprocess.run(
        [sys.executable, "-I", "-c", f"import sys; sys.path.insert(0, {str(tmp_path)!r}); {probe}"],
        check=False,
        capture_output=True,
        text=True,
        timeout=120,
        cwd=tmp_path,
    )
    assert result.returncode == 0, result.stderr
    base, trace_read = result.stdout.split()
    assert float(base) > 0 and trace_read == "True"


def test_the_development_install_imports_tailguard_from_the_folders(tmp_path: Path) -> None:
    """`pip install -e .` (make venv): setuptools' editable finder maps tailguard.controller onto a checkout's
    controller/ folder, and nothing is importable as a top-level `controller`, `serving` or `predictors`."""
    probe = (
        "import importlib.util as u, json;"
        "print(json.dumps({n: (s.origin if (s := u.find_spec(n)) else None)"
        " for n in ('controller', 'serving', 'predictors', 'tailguard.controller', 'tailguard.serving',"
        " 'tailguard.predictors')}))"
    )
    env = {key: value for key, value in os.environ.items() if key != "PYTHONPATH"}
    result = subprocess.run(
        [sys.executable, "-c", probe], check=False, capture_output=True, text=True, timeout=60, cwd=tmp_path, env=env
    )
    assert result.returncode == 0, result.stderr
    found = json.loads(result.stdout)
    assert {name: found[name] for name in PACKAGES} == dict.fromkeys(PACKAGES), "old top-level names are installed"
    for package in PACKAGES:
        origin = Path(found[f"{NAMESPACE}.{package}"])
        assert origin.name == "__init__.py" and origin.parent.name == package, origin
