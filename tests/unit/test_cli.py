"""The tailguard command line: exit codes and messages, never a traceback."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tailguard.controller.app import cli
from tailguard.controller.core.policy import policy_json_schema

REPO = Path(__file__).resolve().parents[2]
INVALID = REPO / "tests" / "fixtures" / "policies" / "invalid"


def test_validate_accepts_the_examples(capsys: pytest.CaptureFixture[str]) -> None:
    assert cli.main(["rules", "validate", str(REPO / "rules" / "examples")]) == 0
    out, err = capsys.readouterr()
    count = len(list((REPO / "rules" / "examples").glob("*.yaml")))
    assert out == f"ok: {count} policies in {count} file(s)\n" and err == ""


def test_validate_reports_every_error_with_file_and_line(capsys: pytest.CaptureFixture[str]) -> None:
    files = [INVALID / "bad-op.yaml", INVALID / "unknown-field.yaml"]
    assert cli.main(["rules", "validate", *map(str, files)]) == 1
    out, err = capsys.readouterr()
    lines = err.splitlines()
    assert out == ""
    assert lines[0].startswith(f"{files[0]}:12: conditions[0].when.op: ")
    assert lines[1] == f"{files[1]}:15: conditions[0].treshold: unknown field (not part of the policy schema)"
    assert lines[2] == "2 error(s) in 2 of 2 file(s)"
    assert "Traceback" not in err


def test_validate_with_nothing_to_validate(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert cli.main(["rules", "validate", str(tmp_path)]) == 1
    assert "no policy files" in capsys.readouterr().err
    assert cli.main(["rules", "validate", str(tmp_path / "missing.yaml")]) == 1
    assert "cannot read policy file" in capsys.readouterr().err


def test_schema_is_written_pretty_sorted_with_a_trailing_newline(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    output = tmp_path / "out" / "schema.json"
    assert cli.main(["rules", "schema", "--output", str(output)]) == 0
    text = output.read_text()
    assert text == json.dumps(policy_json_schema(), indent=2, sort_keys=True) + "\n"
    assert text == (REPO / "rules" / "schema.json").read_text()
    capsys.readouterr()
    assert cli.main(["rules", "schema"]) == 0
    assert capsys.readouterr().out == text


def test_delegated_commands_get_their_arguments(monkeypatch: pytest.MonkeyPatch) -> None:
    import tailguard.controller.app.ml_commands

    seen: list[list[str]] = []

    def fake_main(argv: list[str]) -> int:
        seen.append(argv)
        return 3

    monkeypatch.setattr(tailguard.controller.app.ml_commands, "backtest_main", fake_main)
    assert cli.main(["backtest", "--rules", "r.yaml", "--help"]) == 3
    assert seen == [["--rules", "r.yaml", "--help"]]


def test_a_missing_delegate_fails_with_a_clear_message(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setitem(cli.DELEGATED, "report", ("controller.no_such_report", "main", "report"))
    assert cli.main(["report", "--fast"]) == 2
    assert capsys.readouterr().err == (
        "tailguard report: not available in this installation (controller.no_such_report is missing)\n"
    )


def test_the_installed_command_adds_the_labs_demo_and_load(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """`tailguard` (serving/cli.py) is the controller's command line plus the lab's commands, passed in by import
    (tailguard.serving.cli.LAB_COMMANDS), never named by a string the layer contracts cannot see."""
    import tailguard.serving.cli

    seen: list[list[str]] = []
    monkeypatch.setitem(
        tailguard.serving.cli.LAB_COMMANDS, "demo", cli.Command(lambda argv: seen.append(argv) or 5, "demo")
    )
    assert tailguard.serving.cli.main(["demo", "--no-wait"]) == 5
    assert seen == [["--no-wait"]]
    with pytest.raises(SystemExit):
        tailguard.serving.cli.main(["--help"])
    listed = capsys.readouterr().out
    assert "demo" in listed and "load" in listed and "backtest" in listed
    # the controller alone has no lab commands
    with pytest.raises(SystemExit) as refused:
        cli.main(["demo"])
    assert refused.value.code == 2


def test_usage_errors_exit_2(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as raised:
        cli.main(["run"])
    assert raised.value.code == 2
    assert "--config" in capsys.readouterr().err


def _config(tmp_path: Path, policies: str, extra: str = "") -> Path:
    config = tmp_path / "controller.yaml"
    config.write_text(
        f"prometheus: {{url: 'http://127.0.0.1:9', retries: 0}}\npolicies: [{policies}]\n"
        f"journal: j.db\nlisten: 127.0.0.1:0\n{extra}"
    )
    return config


def test_run_refuses_a_bad_configuration(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    config = _config(tmp_path, "rules", "listen_port: 1\n")
    assert cli.main(["run", "--config", str(config)]) == 2
    assert capsys.readouterr().err == (
        f"{config}:5: listen_port: unknown field (not part of the controller configuration)\n"
    )


def test_run_refuses_broken_policies(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    config = _config(tmp_path, str(INVALID / "bad-op.yaml"))
    assert cli.main(["run", "--config", str(config)]) == 2
    assert capsys.readouterr().err.startswith(f"{INVALID / 'bad-op.yaml'}:12: conditions[0].when.op: ")
    assert not (tmp_path / "j.db").exists()


def test_run_refuses_a_notify_action_with_an_unknown_receiver(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    policy = (
        (REPO / "rules" / "examples" / "p99-rollback.yaml")
        .read_text()
        .replace(
            "      - type: rollback\n",
            "      - type: notify\n        receiver: pager\n      - type: rollback\n",
        )
    )
    (tmp_path / "p.yaml").write_text(policy)
    config = _config(tmp_path, "p.yaml")
    assert cli.main(["run", "--config", str(config)]) == 2
    err = capsys.readouterr().err
    assert "conditions[0].actions[1].receiver: unknown receiver 'pager' in policy p99-rollback" in err
