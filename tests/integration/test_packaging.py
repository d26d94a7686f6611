"""The wheel the controller image is built from (Dockerfile, first stage) holds everything the code reads.

Built offline from a copy of the sources with the same command the Dockerfile runs (minus the
dependencies), then imported from the unpacked wheel instead of the working tree: a data file the
code reads at run time but `[tool.setuptools.package-data]` leaves out fails here, not in a cluster.
"""

from __future__ import annotations

import re
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

pytestmark = pytest.mark.integration

REPO = Path(__file__).resolve().parents[2]
PACKAGES = ("controller", "serving", "predictors")
# The non-Python files the packages read at run time (serving.tier.profiles, serving.lab.calibration, serving.lab.load).
DATA_GLOBS = (
    "serving/tier/profiles/*.yaml",
    "serving/tier/calibrations/*.yaml",
    "serving/tier/calibrations/**/*",
    "serving/lab/data/**/*",
)


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
        str(path.relative_to(REPO))
        for package in PACKAGES
        for path in (REPO / package).rglob("*.py")
        if "__pycache__" not in path.parts
    }
    expected |= {str(p.relative_to(REPO)) for glob in DATA_GLOBS for p in REPO.glob(glob) if p.is_file()}
    assert any(name.startswith("serving/tier/calibrations/") for name in expected)
    assert expected - names == set()


def test_wheel_declares_the_console_script_and_the_extras_the_dockerfile_installs(wheel: Path) -> None:
    archive = zipfile.ZipFile(wheel)
    dist_info = next(n.split("/")[0] for n in archive.namelist() if n.endswith(".dist-info/METADATA"))
    entry_points = archive.read(f"{dist_info}/entry_points.txt").decode()
    # the controller's commands plus the serving lab's demo and load (serving/cli.py)
    assert re.search(r"^tailguard = serving\.cli:main$", entry_points, re.MULTILINE)
    # The kubectl plugin: kubectl runs `kubectl-tailguard` from PATH for `kubectl tailguard ...`.
    assert re.search(r"^kubectl-tailguard = controller\.app\.kubectl_plugin:plugin_main$", entry_points, re.MULTILINE)
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
        "import serving.tier.profiles as p, serving.lab.load as l, controller.app.cli;"
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
