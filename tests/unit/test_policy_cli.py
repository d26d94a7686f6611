"""`tailguard rules validate` as a user runs it: a subprocess, its exit code, stdout and stderr."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent.parent
FIXTURES = ROOT / "tests" / "fixtures" / "policies"


def validate(*paths: Path | str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "tailguard.controller", "rules", "validate", *map(str, paths)],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )


def test_valid_policies_exit_0() -> None:
    done = validate("rules/examples", FIXTURES / "valid")
    examples = len(list((ROOT / "rules" / "examples").glob("*.yaml")))
    valid_files = len(list((FIXTURES / "valid").glob("*.yaml")))
    # Every example holds one policy; the valid fixtures hold three policies in two files.
    expected = f"ok: {examples + 3} policies in {examples + valid_files} file(s)\n"
    assert (done.returncode, done.stdout, done.stderr) == (0, expected, "")


def test_each_error_is_one_line_and_the_exit_code_is_1() -> None:
    prefix = "tests/fixtures/policies/invalid/"
    done = validate(f"{prefix}for-zero.yaml", f"{prefix}bad-op.yaml")
    assert done.returncode == 1
    assert done.stdout == ""
    assert done.stderr.splitlines() == [
        f"{prefix}for-zero.yaml:13: conditions[0].for: a count of evaluations must be at least 1",
        f"{prefix}bad-op.yaml:12: conditions[0].when.op: Input should be '>', '>=', '<' or '<=', got '=>'",
        "2 error(s) in 2 of 2 file(s)",
    ]


def test_every_invalid_fixture_fails_without_a_traceback() -> None:
    done = validate("tests/fixtures/policies/invalid")
    assert done.returncode == 1
    assert "Traceback" not in done.stderr
    lines = done.stderr.splitlines()
    count = len(list((FIXTURES / "invalid").glob("*.yaml")))
    assert lines[-1] == f"{count} error(s) in {count} of {count} file(s)"
    assert all(line.startswith("tests/fixtures/policies/invalid/") for line in lines[:-1])


def test_duplicate_names_across_files_fail() -> None:
    done = validate("tests/fixtures/policies/duplicate-names")
    assert done.returncode == 1
    assert done.stderr.splitlines()[0] == (
        "tests/fixtures/policies/duplicate-names/b.yaml:1: name: policy name 'same-name' is already used at "
        "tests/fixtures/policies/duplicate-names/a.yaml:1"
    )


def test_nothing_to_validate_fails(tmp_path: Path) -> None:
    done = validate(tmp_path)
    assert done.returncode == 1
    assert done.stderr == f"no policy files (*.yaml, *.yml) under {tmp_path}\n"


def test_usage_error_exits_2() -> None:
    done = validate()
    assert done.returncode == 2
    assert "usage:" in done.stderr and "Traceback" not in done.stderr
