"""How a command on a laptop reaches the controller: directly (`--url`, `TAILGUARD_URL`), or through the Kubernetes
API's service proxy with the user's kubeconfig (`kubectl tailguard`: RBAC decides who may).

Through the proxy, the request goes to
`<API server>/api/v1/namespaces/<namespace>/services/<service>:<port>/proxy/<path>`, authenticated with the
kubeconfig's credential (token, client certificate, exec plugin: the kubernetes client's loader reads it). The API
server sends it to one ready controller pod; a standby forwards reads and controls to the leader (one view across
replicas, docs/deploy.md), so whichever pod answers, the answer is the leader's. The API server removes the
`Authorization` header before proxying, so the controller's own token travels in `X-Tailguard-Token`
(controller/app/api_auth.py). The user needs `get` (reads) and `create` (pause, resume, abort) on `services/proxy`
in the controller's namespace.

Every failure is one line, `OperateError`: what failed and what to try; never a urllib3 traceback.
"""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any
from urllib.parse import quote, urlsplit

import requests

from tailguard.controller.app.api_auth import TOKEN_HEADER
from tailguard.controller.kit.errors import TailguardError

TIMEOUT_SECONDS = 10.0
DEFAULT_NAMESPACE = "tailguard"
DEFAULT_SERVICE = "tailguard"
DEFAULT_PORT = "9464"  # deploy/base/service.yaml
TOKEN_SECRET = "tailguard-alertmanager"  # the controller's bearer token (deploy/base/deployment.yaml)
URL_ENV = "TAILGUARD_URL"
PORT_FORWARD_HINT = (
    f"or reach it through the cluster: `kubectl -n {DEFAULT_NAMESPACE} port-forward svc/{DEFAULT_SERVICE} "
    f"{DEFAULT_PORT}` and --url http://127.0.0.1:{DEFAULT_PORT}"
)


class OperateError(TailguardError):
    """The controller (or the Kubernetes API on the way) refused a request or could not be reached: one line."""


@dataclass(frozen=True)
class KubeAccess:
    """The user's kubeconfig, resolved: the API server and how to authenticate to it."""

    server: str
    headers: Mapping[str, str]
    verify: bool | str
    cert: tuple[str, str] | None
    namespace: str
    service: str
    port: str

    def api_url(self, path: str) -> str:
        return self.server.rstrip("/") + path

    def proxy_base(self) -> str:
        return self.api_url(
            f"/api/v1/namespaces/{quote(self.namespace, safe='')}/services/"
            f"{quote(self.service, safe='')}:{quote(self.port, safe='')}/proxy"
        )


@dataclass(frozen=True)
class ControllerAddress:
    """Where the controller's API answers and with which token; `kube` when it is reached through the cluster."""

    base_url: str
    token: str | None = None
    kube: KubeAccess | None = None
    source: str = "--url"
    extra_headers: Mapping[str, str] = field(default_factory=dict)

    @property
    def where(self) -> str:
        if self.kube is None:
            return f"the controller at {self.base_url} ({self.source})"
        return (
            f"Service {self.kube.namespace}/{self.kube.service}:{self.kube.port} through the Kubernetes API at "
            f"{self.kube.server}"
        )


def load_kube_access(
    kubeconfig: str | None, context: str | None, namespace: str, service: str, port: str
) -> KubeAccess:
    """The kubeconfig's server and credential (the kubernetes client's own loader: tokens, client certificates,
    exec plugins); OperateError when there is none or it is unusable."""
    try:
        from kubernetes import client as k8s
        from kubernetes import config as k8s_config
    except ModuleNotFoundError:
        raise OperateError(
            "the kubernetes client is not installed: `pip install 'tailguard[cluster]'`, or pass --url "
            f"(or {URL_ENV}) to reach the controller directly"
        ) from None
    configuration = k8s.Configuration()
    where = kubeconfig or os.environ.get("KUBECONFIG") or "~/.kube/config"
    try:
        k8s_config.load_kube_config(  # type: ignore[no-untyped-call]
            config_file=kubeconfig, context=context, client_configuration=configuration
        )
    except Exception as unusable:  # noqa: BLE001 - the loader raises many types (ConfigException, OSError, YAML)
        reason = " ".join(str(unusable).split()) or type(unusable).__name__
        raise OperateError(
            f"no usable kubeconfig ({where}): {reason}; pass --kubeconfig/--context, or --url (or {URL_ENV}) to "
            "reach the controller directly"
        ) from None
    headers: dict[str, str] = {}
    authorization = configuration.get_api_key_with_prefix("authorization")
    if authorization:
        headers["Authorization"] = authorization
    elif configuration.username or configuration.password:
        headers["Authorization"] = str(configuration.get_basic_auth_token())
    verify: bool | str = bool(configuration.verify_ssl)
    if configuration.verify_ssl and configuration.ssl_ca_cert:
        verify = str(configuration.ssl_ca_cert)
    cert = (
        (str(configuration.cert_file), str(configuration.key_file))
        if configuration.cert_file and configuration.key_file
        else None
    )
    return KubeAccess(str(configuration.host), headers, verify, cert, namespace, service, port)


def resolve(
    *,
    url: str | None,
    token_file: Path | None,
    kubeconfig: str | None = None,
    context: str | None = None,
    namespace: str = DEFAULT_NAMESPACE,
    service: str = DEFAULT_SERVICE,
    port: str = DEFAULT_PORT,
    environ: Mapping[str, str] | None = None,
) -> ControllerAddress:
    """--url, else $TAILGUARD_URL, else the service proxy of the user's kubeconfig. The token: --token-file, else
    (through the cluster) the Secret tailguard-alertmanager if the user may read it, else none."""
    env = os.environ if environ is None else environ
    token = read_token(token_file)
    chosen, source = (url, "--url") if url else (env.get(URL_ENV) or None, URL_ENV)
    if chosen:
        parts = urlsplit(chosen)
        if parts.scheme not in ("http", "https") or not parts.netloc:
            raise OperateError(
                f"{source} {chosen!r} is not an http(s) URL: e.g. http://127.0.0.1:{DEFAULT_PORT} "
                "(the Service listens on 9464)"
            )
        return ControllerAddress(chosen.rstrip("/"), token, None, source)
    kube = load_kube_access(kubeconfig, context, namespace, service, port)
    if token is None:
        token = _token_from_secret(kube)
    return ControllerAddress(kube.proxy_base(), token, kube, "kubeconfig")


def read_token(path: Path | None) -> str | None:
    if path is None:
        return None
    try:
        return path.read_text(encoding="utf-8").strip() or None
    except OSError as unreadable:
        raise OperateError(f"{path}: cannot read the token: {unreadable.strerror or unreadable}") from None


def _token_from_secret(kube: KubeAccess) -> str | None:
    """The controller's token from its Secret, when the user's RBAC allows reading it (else None: the controller
    says whether it needs one, and the error names this Secret)."""
    import base64
    import binascii

    path = f"/api/v1/namespaces/{quote(kube.namespace, safe='')}/secrets/{TOKEN_SECRET}"
    try:
        answer = send("GET", kube.api_url(path), kube, {}, None)
    except OperateError:
        return None
    if answer.status_code != 200:
        return None
    try:
        encoded = answer.json().get("data", {}).get("token")
        return base64.b64decode(encoded).decode().strip() or None if isinstance(encoded, str) else None
    except (ValueError, binascii.Error, UnicodeDecodeError, AttributeError):
        return None


def send(
    method: str, target: str, kube: KubeAccess | None, headers: Mapping[str, str], body: Mapping[str, Any] | None
) -> requests.Response:
    sent = dict(headers)
    verify: bool | str = True
    cert = None
    if kube is not None:
        sent.update(kube.headers)
        verify, cert = kube.verify, kube.cert
    where = urlsplit(target)
    origin = f"{where.scheme}://{where.netloc}"
    try:
        return requests.request(
            method, target, headers=sent, json=body, timeout=TIMEOUT_SECONDS, verify=verify, cert=cert,
            allow_redirects=False,
        )  # fmt: skip
    except requests.exceptions.SSLError:
        raise OperateError(
            f"TLS to {origin} failed (certificate not trusted or wrong host): check the kubeconfig's "
            "certificate-authority, or the URL's scheme"
        ) from None
    except requests.exceptions.ConnectTimeout:
        raise OperateError(f"no connection to {origin} within {TIMEOUT_SECONDS:g} s: {_reach_hint(kube)}") from None
    except requests.exceptions.Timeout:
        raise OperateError(f"{origin} did not answer within {TIMEOUT_SECONDS:g} s: try again") from None
    except requests.exceptions.ConnectionError as failed:
        reason = "connection refused" if "refused" in str(failed).lower() else "cannot connect"
        if "Name or service not known" in str(failed) or "nodename nor servname" in str(failed):
            reason = "unknown host"
        raise OperateError(f"cannot reach {origin}: {reason}: {_reach_hint(kube)}") from None
    except requests.RequestException as failed:
        raise OperateError(f"request to {origin} failed: {type(failed).__name__}") from None


def _reach_hint(kube: KubeAccess | None) -> str:
    if kube is not None:
        return "is the kubeconfig's cluster up? (kubectl cluster-info), or pass --url"
    return f"check --url / {URL_ENV} (the controller's Service listens on {DEFAULT_PORT}), {PORT_FORWARD_HINT}"


def call(
    address: ControllerAddress,
    method: str,
    path: str,
    body: Mapping[str, Any] | None = None,
    *,
    accept: Sequence[int] = (200,),
) -> Any:
    """`method path` on the controller's API; its JSON answer, or OperateError with what to try."""
    headers = dict(address.extra_headers)
    if address.token:
        if address.kube is None:
            headers["Authorization"] = f"Bearer {address.token}"
        else:
            headers[TOKEN_HEADER] = address.token
    answer = send(method, address.base_url + path, address.kube, headers, body)
    try:
        value = answer.json()
    except ValueError:
        value = {"error": " ".join(answer.text[:200].split())}
    if answer.status_code in accept:
        return value
    raise OperateError(_refusal(address, path, answer.status_code, value))


def _refusal(address: ControllerAddress, path: str, status: int, value: Any) -> str:
    kube = address.kube
    if kube is not None and isinstance(value, dict) and value.get("kind") == "Status":
        message = str(value.get("message") or value.get("reason") or "")
        scope = f"in namespace {kube.namespace}"
        if status in (401,):
            return f"the Kubernetes API did not accept your credential ({message}): log in again (kubectl auth whoami)"
        if status == 403:
            return (
                f"the Kubernetes API refused ({message}): your user needs get/create on services/proxy {scope} "
                f"(check: kubectl auth can-i create services/proxy -n {kube.namespace})"
            )
        if status == 404:
            return (
                f"no Service {kube.service} {scope} ({message}): is tailguard installed there? "
                "(-n NAMESPACE, --service NAME; docs/deploy.md, Install)"
            )
        if status == 503:
            return (
                f"no ready controller pod behind Service {kube.namespace}/{kube.service} ({message}): "
                f"kubectl -n {kube.namespace} get pods -l app.kubernetes.io/name=tailguard"
            )
        return f"the Kubernetes API answered HTTP {status} for {path}: {message}"
    error = value.get("error") if isinstance(value, dict) else None
    error = error or value
    if status == 401:
        secret = f"the Secret {kube.namespace}/{TOKEN_SECRET}, key token" if kube else f"the Secret {TOKEN_SECRET}"
        return (
            f"{address.where} wants its bearer token (HTTP 401: {error}): pass --token-file (the token is in "
            f"{secret})"
        )
    if status == 403:
        return (
            f"{address.where} refused the token (HTTP 403: {error}): --token-file must hold the controller's "
            "webhook token"
        )
    if status == 503 and isinstance(value, dict) and value.get("standby"):
        return f"{address.where}: {error}"
    return f"{address.where}: HTTP {status} for {path}: {error}"
