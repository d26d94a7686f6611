"""Control is never anonymous (issue 24 item 4). At 7710821, without a `webhook:` section, pause-all (the kill
switch), per-policy pause/resume, abort, decisions and status answered anyone who could reach the port, and the
controller started on 0.0.0.0 with only a warning about the alert receiver.

Now: without a token those endpoints answer loopback only (403 to any other peer, asked here from this machine's
own non-loopback address), probes and /metrics stay open, and `tailguard run` refuses a `listen` address that is
not loopback with one line (no traceback) unless a token is set."""

from __future__ import annotations

import logging
import socket
from collections.abc import Iterator
from pathlib import Path

import pytest
import requests

from tailguard.controller.app import cli
from tailguard.controller.app.api import ControllerAPI
from tailguard.controller.app.settings import parse_settings_text
from tailguard.controller.kit.net import is_loopback_host
from tests.unit.test_api_forwarding import OperatorController

REPO = Path(__file__).resolve().parents[2]
TIMEOUT = 10
PROTECTED = [
    ("POST", "/api/v1/pause"),
    ("POST", "/api/v1/resume"),
    ("POST", "/api/v1/policies/p99-rollback/pause"),
    ("POST", "/api/v1/policies/p99-rollback/resume"),
    ("POST", "/api/v1/decisions/d-1/abort"),
    ("POST", "/api/v1/alerts"),
    ("GET", "/api/v1/decisions"),
    ("GET", "/api/v1/status"),
    ("GET", "/status"),
]
OPEN = ["/healthz", "/readyz", "/metrics"]


def outside_address() -> str:
    """This machine's address on its first non-loopback interface (a UDP 'connect' sends nothing)."""
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as probe:
        probe.connect(("192.0.2.1", 9))  # TEST-NET-1: only picks the interface of the default route
        address = str(probe.getsockname()[0])
    assert not is_loopback_host(address), "the test needs a non-loopback interface"
    return address


@pytest.fixture
def open_api(tmp_path: Path) -> Iterator[ControllerAPI]:
    """An API with no token on every interface (what the settings refuse; the API holds the line on its own)."""
    api = ControllerAPI(OperatorController("tailguard-a", tmp_path), "0.0.0.0", 0)
    api.start()
    try:
        yield api
    finally:
        api.stop()


def ask(method: str, url: str) -> requests.Response:
    body = b'{"by": "mallory", "reason": "because"}' if method == "POST" else None
    return requests.request(method, url, data=body, headers={"Content-Type": "application/json"}, timeout=TIMEOUT)


def test_without_a_token_control_answers_only_loopback(
    open_api: ControllerAPI, caplog: pytest.LogCaptureFixture
) -> None:
    outside = f"http://{outside_address()}:{open_api.port}"
    controller = open_api.controller
    assert isinstance(controller, OperatorController)
    with caplog.at_level(logging.WARNING, logger="tailguard.api"):
        for method, path in PROTECTED:
            refused = ask(method, outside + path)
            assert refused.status_code == 403, (method, path, refused.status_code, refused.text)
            assert "answers requests from its own host only" in refused.json()["error"]
    assert controller.paused == [] and controller.status_reads == 0 and controller.triggered == []
    assert sum("no token is configured" in record.getMessage() for record in caplog.records) == len(PROTECTED)
    for path in OPEN:  # probes and Prometheus carry no token
        assert requests.get(outside + path, timeout=TIMEOUT).status_code == 200, path
    # The same requests from loopback are served (an operator on the host, kubectl port-forward).
    local = f"http://127.0.0.1:{open_api.port}"
    assert ask("POST", local + "/api/v1/pause").status_code == 200
    assert ask("GET", local + "/api/v1/status").status_code == 200
    assert controller.paused == [(None, True, "mallory")] and controller.status_reads == 1


def test_a_token_serves_every_peer_that_presents_it(tmp_path: Path) -> None:
    api = ControllerAPI(OperatorController("tailguard-a", tmp_path), "0.0.0.0", 0, webhook_token="s3cret")
    api.start()
    try:
        outside = f"http://{outside_address()}:{api.port}"
        assert requests.get(outside + "/api/v1/status", timeout=TIMEOUT).status_code == 401
        answer = requests.get(outside + "/api/v1/status", headers={"Authorization": "Bearer s3cret"}, timeout=TIMEOUT)
        assert answer.status_code == 200
    finally:
        api.stop()


def _config(tmp_path: Path, listen: str, extra: str = "") -> Path:
    config = tmp_path / "controller.yaml"
    config.write_text(
        f"prometheus: {{url: 'http://127.0.0.1:9', retries: 0}}\npolicies: [{REPO / 'rules' / 'examples'}]\n"
        f"journal: j.db\nlisten: {listen}\n{extra}"
    )
    return config


@pytest.mark.parametrize("listen", ["0.0.0.0:0", "'[::]:0'", "192.0.2.2:0", "tailguard.example.com:0"])
def test_run_refuses_to_listen_beyond_loopback_without_a_token(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], listen: str
) -> None:
    config = _config(tmp_path, listen)
    assert cli.main(["run", "--config", str(config)]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "Traceback" not in err, err
    assert err.startswith(f"{config}: listen: ") and "no `webhook` token is set" in err
    assert "set webhook.bearerTokenFile or webhook.bearerTokenEnv, or listen on 127.0.0.1" in err
    assert not (tmp_path / "j.db").exists(), "refused before anything was opened"


@pytest.mark.parametrize("listen", ["127.0.0.1:0", "'[::1]:0'", "localhost:0", "127.0.0.2:0"])
def test_loopback_listen_without_a_token_is_allowed(tmp_path: Path, listen: str) -> None:
    config = _config(tmp_path, listen)
    settings = parse_settings_text(config.read_text(), str(config), tmp_path)
    assert settings.listen.loopback and settings.anonymous_control_error() is None


def test_a_token_allows_any_listen_address(tmp_path: Path) -> None:
    config = _config(tmp_path, "0.0.0.0:0", "webhook: {bearerTokenEnv: TG_TOKEN}\n")
    settings = parse_settings_text(config.read_text(), str(config), tmp_path)
    assert settings.anonymous_control_error() is None


def test_the_start_up_warning_names_every_endpoint_and_loopback(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """With no token on loopback the controller starts and says what that means (stopped at once here)."""
    config = _config(tmp_path, "127.0.0.1:0")
    monkeypatch.setattr(cli, "check_policies", lambda _settings: None)  # the examples' receivers are not set up
    monkeypatch.setattr(cli, "build", _stop_here)
    assert cli.main(["run", "--config", str(config)]) == 2
    err = capsys.readouterr().err
    [warning] = [line for line in err.splitlines() if "no `webhook` section" in line]
    assert "alerts, pause/resume, abort, decisions and status answer only requests from this machine" in warning
    assert "(loopback, 127.0.0.1:0)" in warning


def _stop_here(*_args: object, **_kwargs: object) -> object:
    from tailguard.controller.kit.errors import ConfigError

    raise ConfigError("stopped by the test after the start-up checks")


@pytest.mark.parametrize(
    ("host", "loopback"),
    [
        ("127.0.0.1", True),
        ("127.9.9.9", True),
        ("::1", True),
        ("[::1]", True),
        ("::ffff:127.0.0.1", True),
        ("localhost", True),
        ("0.0.0.0", False),
        ("::", False),
        ("10.0.0.7", False),
        ("::ffff:10.0.0.7", False),
        ("evil.localhost.example", False),
        ("", False),
        (None, False),
    ],
)
def test_loopback_addresses(host: str | None, loopback: bool) -> None:
    assert is_loopback_host(host) is loopback
