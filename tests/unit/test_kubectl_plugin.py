"""`kubectl tailguard` (controller/app/kubectl_plugin.py, controller/app/reach.py): the operator commands reach a
real controller through the spec-validating fake Kubernetes API's service proxy with a kubeconfig (the API server
drops the Authorization header; the controller's token travels in X-Tailguard-Token), or directly with --url /
TAILGUARD_URL; every failure is one readable line; --version, completion."""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from tailguard.controller.app import cli, kubectl_plugin, operate
from tests.support.fake_kubernetes import RecordedRequest
from tests.support.operated import TOKEN, Operated, operated_controller
from tests.unit.test_operate import policy_yaml

REPO = Path(__file__).resolve().parents[2]
NS = "tailguard"


@pytest.fixture
def operated(tmp_path: Path) -> Iterator[Operated]:
    policy = policy_yaml().replace("checkout-p99", "chat-p99")
    with operated_controller(tmp_path, {"chat.yaml": policy}, namespace=NS) as running:
        yield running


def plugin(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str, str]:
    code = kubectl_plugin.main(list(argv))
    out, err = capsys.readouterr()
    return code, out, err


def said(err: str, prefix: str) -> list[str]:
    """The command's own lines on stderr."""
    return [line for line in err.splitlines() if line.startswith(prefix)]


def proxied(operated: Operated) -> list[tuple[str, str]]:
    return [(r.verb, r.resource) for r in operated.kube.requests if r.resource == "services/proxy"]


def test_status_goes_through_the_service_proxy_with_the_kubeconfig(
    operated: Operated, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("TAILGUARD_URL", raising=False)
    operated.controller.evaluate("chat-p99")
    code, out, err = plugin(capsys, "status", "--kubeconfig", str(operated.kubeconfig))
    assert code == 0, err
    assert "chat-p99" in out and "p99-high" in out
    # The controller's token came from its Secret (the user may read it) and passed the proxy in its own header.
    assert RecordedRequest("get", "", "secrets", NS, "tailguard-alertmanager") in operated.kube.requests
    assert proxied(operated) == [("get", "services/proxy")]


def test_pause_and_resume_through_the_proxy_are_journaled_with_who(
    operated: Operated, capsys: pytest.CaptureFixture[str]
) -> None:
    common = ["--kubeconfig", str(operated.kubeconfig), "--by", "alice"]
    code, out, err = plugin(capsys, "pause", "chat-p99", *common, "--reason", "INC-7")
    assert code == 0, err
    assert out.strip() == "paused chat-p99 (by alice (bearer token))"
    status = operated.controller.status()
    (policy,) = status["policies"]
    assert policy["paused"]["by"] == "alice (bearer token)" and policy["paused"]["reason"] == "INC-7"
    assert plugin(capsys, "resume", "chat-p99", *common)[0] == 0
    assert operated.controller.status()["policies"][0]["paused"] is None
    assert proxied(operated) == [("create", "services/proxy"), ("create", "services/proxy")]


def test_incidents_lists_what_fired_and_did_not_resolve(operated: Operated, capsys: pytest.CaptureFixture[str]) -> None:
    operated.controller.evaluate("chat-p99")
    fired = [d for d in operated.controller.recent_decisions(10) if d["kind"] == "fire"]
    assert len(fired) == 1
    code, out, err = plugin(capsys, "incidents", "--kubeconfig", str(operated.kubeconfig))
    assert code == 0, err
    (row,) = [line for line in out.splitlines() if "chat-p99" in line]
    assert "p99-high" in row and "service=chat" in row and fired[0]["id"] in row
    code, out, _ = plugin(capsys, "incidents", "--url", operated.api.url, "--token-file", str(_token_file(operated)))
    assert code == 0 and fired[0]["id"] in out


def test_incidents_are_closed_by_their_resolve() -> None:
    target = {"service": "chat"}
    decisions = [  # newest first, as /api/v1/decisions answers
        {"kind": "resolve", "policy": "p", "condition": "c", "target": target, "id": "b"},
        {"kind": "fire", "policy": "p", "condition": "c", "target": target, "id": "b"},
        {"kind": "fire", "policy": "q", "condition": "c", "target": target, "id": "a"},
    ]
    assert [d["id"] for d in kubectl_plugin.open_incidents(decisions)] == ["a"]


def _token_file(operated: Operated) -> Path:
    path = operated.kubeconfig.parent / "token"
    path.write_text(TOKEN)
    return path


def test_logs_read_the_leader_pods_log(operated: Operated, capsys: pytest.CaptureFixture[str]) -> None:
    operated.kube.put_object(
        {
            "apiVersion": "coordination.k8s.io/v1",
            "kind": "Lease",
            "metadata": {"name": "tailguard-leader", "namespace": NS},
            "spec": {"holderIdentity": "tailguard-7d9f-abcde", "leaseDurationSeconds": 15},
        }
    )
    operated.kube.set_pod_log(NS, "tailguard-7d9f-abcde", "level=info msg=evaluated policy=chat-p99\n")
    code, out, err = plugin(capsys, "logs", "--kubeconfig", str(operated.kubeconfig))
    assert code == 0, err
    assert out == "level=info msg=evaluated policy=chat-p99\n"
    assert "leader: tailguard/tailguard-7d9f-abcde" in err
    assert RecordedRequest("get", "", "pods/log", NS, "tailguard-7d9f-abcde") in operated.kube.requests


@pytest.mark.parametrize(
    ("setup", "expected"),
    [
        (lambda o: o.kube.inject("get", "services/proxy", status=403), "kubectl auth can-i create services/proxy"),
        (lambda o: o.kube.delete_object("services", NS, "tailguard"), "no Service tailguard in namespace tailguard"),
        (lambda o: o.kube.delete_object("endpoints", NS, "tailguard"), "no ready controller pod behind Service"),
        # The user may not read the token's Secret: the controller asks for its token, the line says where it is.
        (lambda o: o.kube.inject("get", "secrets", status=403), "pass --token-file (the token is in the Secret"),
    ],
    ids=["rbac-forbids-the-proxy", "no-service", "no-ready-pod", "no-token"],
)
def test_each_failure_through_the_cluster_is_one_line_saying_what_to_try(
    operated: Operated, capsys: pytest.CaptureFixture[str], setup: object, expected: str
) -> None:
    setup(operated)  # type: ignore[operator]
    code, out, err = plugin(capsys, "status", "--kubeconfig", str(operated.kubeconfig))
    assert code == 1 and out == ""
    (line,) = said(err, "kubectl tailguard status: ")  # one line (other lines: loggers other tests configured)
    assert expected in line and "urllib3" not in err and "HTTPConnectionPool" not in err


def test_a_wrong_url_is_one_line_naming_the_service_port(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("TAILGUARD_URL", "http://127.0.0.1:9")  # nothing listens on the discard port
    code, _, err = plugin(capsys, "pause", "--all", "--reason", "freeze")
    assert code == 1
    (line,) = said(err, "kubectl tailguard pause: ")
    assert line.startswith("kubectl tailguard pause: cannot reach http://127.0.0.1:9: connection refused")
    assert "9464" in line and "port-forward svc/tailguard 9464" in line and "HTTPConnectionPool" not in err
    code, _, err = plugin(capsys, "status", "--url", "127.0.0.1:9464")
    assert code == 1 and "is not an http(s) URL" in err


def test_help_examples_name_the_shipped_service_port() -> None:
    service = (REPO / "deploy" / "base" / "service.yaml").read_text()
    assert "port: 9464" in service
    for module in (operate, kubectl_plugin):
        assert ":9464" in (module.__doc__ or "") and ":8080" not in (module.__doc__ or "")
    parser_help = subprocess.run(
        [sys.executable, "-m", "tailguard.controller.app.kubectl_plugin", "status", "--help"],
        capture_output=True, text=True, timeout=60, check=False, cwd=REPO,
    )  # fmt: skip
    assert parser_help.returncode == 0 and "http://127.0.0.1:9464" in parser_help.stdout
    assert "8080" not in parser_help.stdout


def test_version_and_completion(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as done:
        kubectl_plugin.main(["--version"])
    assert done.value.code == 0
    assert capsys.readouterr().out.strip() == f"kubectl tailguard {kubectl_plugin.version()}"
    with pytest.raises(SystemExit):
        cli.main(["--version"])
    assert capsys.readouterr().out.strip() == f"tailguard {kubectl_plugin.version()}"
    code, out, _ = plugin(capsys, "completion", "bash")
    assert code == 0 and "kubectl-tailguard" in out and "complete " in out
    code, out, _ = plugin(capsys, "completion", "kubectl")
    assert code == 0 and 'exec kubectl-tailguard __complete "$@"' in out
    # kubectl's plugin completion protocol: candidates, then `:<directive>`.
    assert plugin(capsys, "__complete", "pa")[1] == "pause\n:4\n"
    assert plugin(capsys, "__complete", "status", "--out")[1] == "--output\n:4\n"
    assert plugin(capsys, "__complete", "status", "--output", "")[1] == "json\ntable\n:4\n"


def test_the_console_script_is_declared() -> None:
    text = (REPO / "pyproject.toml").read_text()
    assert 'kubectl-tailguard = "tailguard.controller.app.kubectl_plugin:plugin_main"' in text


def test_the_status_page_signs_in_behind_the_service_proxy(operated: Operated) -> None:
    """The sign-in form and its redirect are relative, so a browser reaching the page through the API server's
    service proxy (a path prefix; the user's Authorization header removed there) signs in and reads the page."""
    import requests

    base = f"{operated.kube.url}/api/v1/namespaces/{NS}/services/tailguard:9464/proxy"
    browser = requests.Session()
    browser.headers["Authorization"] = "Bearer kube-user-token"  # the kubeconfig's credential: not the controller's
    form = browser.get(f"{base}/status", timeout=10)
    assert form.status_code == 401 and "action=status/login" in form.text
    page = browser.post(f"{base}/status/login", data={"token": TOKEN}, timeout=10)
    assert page.status_code == 200 and page.url == f"{base}/status" and "chat-p99" in page.text
