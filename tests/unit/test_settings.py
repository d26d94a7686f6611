"""Controller configuration: strict, located errors, paths relative to the config file."""

from __future__ import annotations

from pathlib import Path

import pytest

from tailguard.controller.app.settings import ControllerSettings, SettingsError, load_settings

REPO = Path(__file__).resolve().parents[2]

VALID = """\
prometheus:
  url: http://127.0.0.1:9090
policies: [rules]
journal: data/journal.db
listen: 127.0.0.1:0
receivers:
  oncall:
    url: http://127.0.0.1:9/hook
    secretEnv: ONCALL_SECRET
limits:
  cooldown: 2m
  maxActionsPerHour: 5
reloadInterval: 2s
dryRun: true
"""


def write(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "controller.yaml"
    path.write_text(text)
    return path


def errors_of(path: Path) -> list[str]:
    with pytest.raises(SettingsError) as raised:
        load_settings(path)
    return [str(error) for error in raised.value.errors]


def test_valid_configuration_resolves_paths_against_the_config_file(tmp_path: Path) -> None:
    settings = load_settings(write(tmp_path, VALID))
    assert settings.policy_paths() == [tmp_path / "rules"]
    assert settings.journal_path() == tmp_path / "data" / "journal.db"
    assert settings.state_path() == tmp_path / "state"
    assert (settings.listen.host, settings.listen.port) == ("127.0.0.1", 0)
    assert settings.limits.cooldown == 120 and settings.limits.maxActionsPerHour == 5
    assert settings.reloadInterval == 2 and settings.dryRun is True
    assert settings.receivers["oncall"].secretEnv == "ONCALL_SECRET"
    assert settings.prometheus.url == "http://127.0.0.1:9090"


def test_defaults(tmp_path: Path) -> None:
    settings = load_settings(write(tmp_path, "prometheus: {url: 'http://127.0.0.1:9090'}\npolicies: [r.yaml]\n"))
    assert isinstance(settings, ControllerSettings)
    assert (settings.listen.host, settings.listen.port) == ("127.0.0.1", 9464)
    assert settings.dryRun is None and settings.tier is None and settings.logFormat == "text"


def test_unknown_field_is_reported_with_file_line_and_field(tmp_path: Path) -> None:
    path = write(tmp_path, VALID.replace("reloadInterval: 2s", "reloadIntervall: 2s"))
    assert errors_of(path) == [f"{path}:13: reloadIntervall: unknown field (not part of the controller configuration)"]


def test_nested_errors_point_at_their_line(tmp_path: Path) -> None:
    text = (
        VALID.replace("url: http://127.0.0.1:9090", "url: 127.0.0.1:9090")
        .replace("maxActionsPerHour: 5", "maxActionsPerHour: -1")
        .replace("listen: 127.0.0.1:0", "listen: localhost")
    )
    errors = errors_of(write(tmp_path, text))
    assert len(errors) == 3
    assert errors[0].split(": ", 1)[0].endswith(":2") and ": prometheus.url: " in errors[0]
    assert ":5: listen: expected host:port such as '127.0.0.1:9464', got 'localhost'" in errors[1]
    assert ":12: limits.maxActionsPerHour: " in errors[2]


def test_receiver_needs_a_secret_source(tmp_path: Path) -> None:
    errors = errors_of(write(tmp_path, VALID.replace("    secretEnv: ONCALL_SECRET\n", "")))
    assert len(errors) == 1 and ":8: receivers.oncall: set exactly one of secretEnv" in errors[0]


def test_missing_required_fields_and_bad_yaml(tmp_path: Path) -> None:
    assert errors_of(write(tmp_path, "policies: [x]\n")) == [
        f"{tmp_path / 'controller.yaml'}:1: prometheus: required field is missing"
    ]
    assert "invalid YAML" in errors_of(write(tmp_path, "prometheus: [\n"))[0]
    assert errors_of(write(tmp_path, "- a\n"))[0].endswith("expected a mapping (the controller configuration)")
    assert errors_of(write(tmp_path, ""))[0].endswith("the configuration file is empty")
    duplicate = errors_of(write(tmp_path, VALID + "journal: other.db\n"))
    assert duplicate == [f"{tmp_path / 'controller.yaml'}:15: journal: duplicate key"]
    assert "cannot read the configuration file" in errors_of(tmp_path / "absent.yaml")[0]


def test_the_shipped_local_example_is_valid() -> None:
    settings = load_settings(REPO / "deploy" / "local" / "controller.yaml")
    assert settings.policy_paths() == [REPO / "rules" / "examples"]
    assert settings.tier is not None and settings.annotations is not None
