"""The controller's configuration file (`tailguard run --config FILE`).

Strict like the policies (unknown fields are errors) and reported the same way,
`file:line: field: message`, through policy_files' located-YAML machinery.
Relative paths (policies, journal, stateDir, annotations.path, predictors.*.path) are relative to
the configuration file, so a config works from any working directory.
Secrets are never values here: receivers and Prometheus name an environment
variable or a file holding them.
"""

from __future__ import annotations

import os
from functools import lru_cache
from pathlib import Path
from typing import Annotated, Any, Literal

import yaml
from pydantic import BaseModel, BeforeValidator, ConfigDict, Field, ValidationError, model_validator

from tailguard.controller.adapters.annotations.settings import AnnotationSettings
from tailguard.controller.adapters.argocd.settings import ArgoCDSettings
from tailguard.controller.adapters.changes.tracker import ChangeTrackingSettings
from tailguard.controller.adapters.lease.settings import LeaderElectionSettings
from tailguard.controller.adapters.metrics.prometheus import PrometheusSettings
from tailguard.controller.adapters.notify.webhook import LinkSettings, WebhookReceiver
from tailguard.controller.adapters.stores.journal_retention import DEFAULT_RETENTION, MIN_RETENTION
from tailguard.controller.adapters.tier.settings import TierSettings
from tailguard.controller.app.cluster_settings import KubernetesSettings
from tailguard.controller.app.registrations import REGISTRIES
from tailguard.controller.app.registry import Section, assemble, sections
from tailguard.controller.core.policy import Duration
from tailguard.controller.core.policy_files import PolicyError, _message
from tailguard.controller.kit.errors import ConfigError
from tailguard.controller.kit.located_yaml import (
    BoundedLoader,
    DuplicateKey,
    FileTooLarge,
    construct,
    field_path,
    line_for,
    read_bounded,
    yaml_problem,
)
from tailguard.controller.kit.net import is_loopback_host
from tailguard.controller.loop.dispatcher import GlobalLimits
from tailguard.predictors.serving import ModelSpec, PredictorSettings, model_specs

DEFAULT_PORT = 9464


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


def _listen(value: Any) -> Any:
    """`listen: "127.0.0.1:9464"` is shorthand for `listen: {host: 127.0.0.1, port: 9464}`."""
    if isinstance(value, str):
        host, separator, port = value.rpartition(":")
        if not separator or not host or not port.isdigit():
            raise ValueError(f"expected host:port such as '127.0.0.1:{DEFAULT_PORT}', got {value!r}")
        return {"host": host.strip("[]"), "port": int(port)}
    if isinstance(value, int) and not isinstance(value, bool):
        return {"port": value}
    return value


class Listen(_Strict):
    host: str = Field(default="127.0.0.1", min_length=1, description="address the HTTP API binds")
    port: int = Field(default=DEFAULT_PORT, ge=0, le=65535, description="0 picks a free port")

    @property
    def loopback(self) -> bool:
        """Whether only this machine can reach the address (127.0.0.0/8, ::1, localhost)."""
        return is_loopback_host(self.host)


class WebhookAuthSettings(_Strict):
    """The bearer token Alertmanager must send to `POST /api/v1/alerts`: named by a file or a variable, not a value."""

    bearerTokenFile: str | None = Field(default=None, min_length=1, description="file holding the token")
    bearerTokenEnv: str | None = Field(default=None, min_length=1, description="environment variable holding it")

    @model_validator(mode="after")
    def _exactly_one(self) -> WebhookAuthSettings:
        if (self.bearerTokenFile is None) == (self.bearerTokenEnv is None):
            raise ValueError("expected exactly one of bearerTokenFile or bearerTokenEnv")
        return self


class WebhookTokenError(ConfigError, ValueError):
    """The configured webhook token cannot be read; the message names where it was looked for, never its value."""


class ControllerSettings(_Strict):
    prometheus: PrometheusSettings
    policies: list[str] = Field(min_length=1, description="policy files or directories (*.yaml, *.yml)")
    journal: str = Field(default="tailguard.db", min_length=1, description="SQLite journal path")
    journalRetention: Duration = Field(
        default=DEFAULT_RETENTION,
        ge=MIN_RETENTION,
        description="how long decisions and their actions are kept in the journal (and delivered Grafana outbox "
        "entries in the outbox), at least 1d; an action not finished is never removed",
    )
    stateDir: str = Field(default="state", min_length=1, description="directory for the controller's own state")
    listen: Annotated[Listen, BeforeValidator(_listen)] = Field(default_factory=Listen)
    tier: TierSettings | None = Field(default=None, description="local serving tier (rollback, scale, traffic)")
    argocd: ArgoCDSettings | None = Field(default=None, description="Argo CD: rollback of the mapped applications")
    changeTracking: ChangeTrackingSettings | None = Field(
        default=None, description="rollout sources for attributing breaches (argocd, tier, kubernetes) and window"
    )
    annotations: AnnotationSettings | None = None
    webhook: WebhookAuthSettings | None = Field(
        default=None,
        description="bearer token required on POST /api/v1/alerts and on every control, decisions and status "
        "endpoint (absent: those answer on loopback only, and a `listen` address that is not loopback is refused)",
    )
    receivers: dict[str, WebhookReceiver] = Field(default_factory=dict, description="notify action receivers")
    links: LinkSettings = Field(default_factory=LinkSettings, description="Grafana/Argo CD links in notifications")
    limits: GlobalLimits = Field(default_factory=GlobalLimits)
    kubernetes: KubernetesSettings | None = Field(
        default=None, description="the cluster: HPA scaling, route weight shifts, Events (controller/app/cluster.py)"
    )
    leaderElection: LeaderElectionSettings | None = Field(
        default=None, description="a coordination.k8s.io Lease: of several replicas only the leader evaluates and acts"
    )
    predictors: dict[str, PredictorSettings] = Field(
        default_factory=dict, description="trained SLA models that policies' `predict` signals name"
    )
    reloadInterval: Duration = Field(default=5.0, description="how often policy files are checked for changes")
    dryRun: bool | None = Field(default=None, description="true/false overrides every policy's dryRun")
    logFormat: Literal["text", "json"] = "text"
    logLevel: Literal["debug", "info", "warning", "error"] = "info"
    # Where the file was read from; relative paths resolve against its directory.
    base_dir: Path = Field(default=Path("."), exclude=True)

    def path(self, raw: str) -> Path:
        candidate = Path(raw).expanduser()
        return candidate if candidate.is_absolute() else Path(os.path.normpath(self.base_dir / candidate))

    def policy_paths(self) -> list[Path]:
        return [self.path(raw) for raw in self.policies]

    def journal_path(self) -> Path:
        return self.path(self.journal)

    def state_path(self) -> Path:
        return self.path(self.stateDir)

    def predictor_specs(self) -> dict[str, ModelSpec]:
        return model_specs(self.predictors, self.path)

    def annotations_path(self) -> Path | None:
        return self.path(self.annotations.path) if self.annotations is not None else None

    def anonymous_control_error(self) -> str | None:
        """Why this configuration must not start: control endpoints reachable off this machine with no token."""
        if self.webhook is not None or self.listen.loopback:
            return None
        return (
            f"listen: {self.listen.host}:{self.listen.port} is reachable from other machines and no `webhook` token "
            "is set: pause, resume, abort, decisions and status would be anonymous; set webhook.bearerTokenFile "
            "or webhook.bearerTokenEnv, or listen on 127.0.0.1"
        )

    def peer_secret(self) -> bytes | None:
        """The replicas' own secret (leaderElection.peerSecretFile/peerSecretEnv), read now; None when not set (the
        API then derives the replica key from the webhook token, controller/app/peer_auth.py)."""
        election = self.leaderElection
        if election is None or (election.peerSecretFile is None and election.peerSecretEnv is None):
            return None
        if election.peerSecretEnv is not None:
            where = f"leaderElection.peerSecretEnv: environment variable {election.peerSecretEnv}"
            secret = os.environ.get(election.peerSecretEnv, "")
        else:
            assert election.peerSecretFile is not None
            path = self.path(election.peerSecretFile)
            where = f"leaderElection.peerSecretFile: {path}"
            try:
                secret = path.read_text(encoding="utf-8")
            except OSError as unreadable:
                reason = unreadable.strerror or type(unreadable).__name__
                raise WebhookTokenError(f"{where}: cannot read the secret: {reason}") from None
        secret = secret.strip()
        if len(secret.encode()) < 16:
            raise WebhookTokenError(f"{where}: the secret is not set or shorter than 16 bytes")
        return secret.encode()

    def webhook_token(self) -> str | None:
        """The token Alertmanager must present, read now; None when `webhook` is absent (an open webhook)."""
        if self.webhook is None:
            return None
        if self.webhook.bearerTokenEnv is not None:
            where = f"webhook.bearerTokenEnv: environment variable {self.webhook.bearerTokenEnv}"
            token = os.environ.get(self.webhook.bearerTokenEnv, "")
        else:
            assert self.webhook.bearerTokenFile is not None  # _exactly_one
            path = self.path(self.webhook.bearerTokenFile)
            where = f"webhook.bearerTokenFile: {path}"
            try:
                token = path.read_text(encoding="utf-8")
            except (OSError, UnicodeDecodeError) as unreadable:
                reason = getattr(unreadable, "strerror", None) or type(unreadable).__name__
                raise WebhookTokenError(f"{where}: cannot read the token: {reason}") from None
        # Secret files usually end with a newline (`echo token > file`); the token is what is before it.
        token = token.strip()
        if not token:
            raise WebhookTokenError(f"{where}: the token is empty or not set")
        return token


def settings_model() -> type[ControllerSettings]:
    """The configuration's schema: ControllerSettings with every section the ports' registries hold
    (controller/app/registrations.py; one registered later, by an embedder or a test, is in it from then on).
    The built-in sections are declared above with their registered models, so this is ControllerSettings itself
    until an adapter with a new section is registered."""
    return _assembled(tuple(sections(REGISTRIES)))


@lru_cache(maxsize=8)
def _assembled(registered: tuple[Section[Any], ...]) -> type[ControllerSettings]:
    return assemble(ControllerSettings, registered)


class SettingsError(ConfigError):
    """The configuration cannot be used; `errors` point at file, line and field."""

    def __init__(self, errors: list[PolicyError]):
        super().__init__("\n".join(str(error) for error in errors))
        self.errors = errors


def _settings_message(error: dict[str, Any]) -> str:
    if error["type"] == "extra_forbidden":
        return "unknown field (not part of the controller configuration)"
    return _message(error)


def parse_settings_text(text: str, file: str, base_dir: Path) -> ControllerSettings:
    loader = BoundedLoader(text)  # aliases, nesting and text values bounded (kit/located_yaml.py)
    try:
        node = loader.get_single_node()
        if node is None:
            raise SettingsError([PolicyError(file, 1, "", "the configuration file is empty")])
        try:
            located = construct(node, loader)
        except DuplicateKey as duplicate:
            raise SettingsError([PolicyError(file, duplicate.line, duplicate.key, "duplicate key")]) from None
    except yaml.YAMLError as bad_yaml:
        mark = getattr(bad_yaml, "problem_mark", None)
        line = mark.line + 1 if mark is not None else 1
        raise SettingsError([PolicyError(file, line, "", yaml_problem(bad_yaml))]) from None
    finally:
        loader.dispose()
    if not isinstance(located.value, dict):
        raise SettingsError([PolicyError(file, located.line, "", "expected a mapping (the controller configuration)")])
    if "base_dir" in located.value:
        line = located.children["base_dir"].line
        raise SettingsError(
            [PolicyError(file, line, "base_dir", "unknown field (not part of the controller configuration)")]
        )
    try:
        return settings_model().model_validate({**located.value, "base_dir": base_dir})
    except ValidationError as invalid:
        errors = []
        for error in invalid.errors():
            loc = tuple(error["loc"])
            errors.append(
                PolicyError(file, line_for(located, loc), field_path(loc, located), _settings_message(dict(error)))
            )
        raise SettingsError(errors) from None


def load_settings(path: str | Path) -> ControllerSettings:
    """Read and validate a controller configuration file; SettingsError with located errors otherwise."""
    config = Path(path)
    try:
        text = read_bounded(config)
    except FileTooLarge as too_large:
        raise SettingsError([PolicyError(str(config), 1, "", str(too_large))]) from None
    except (OSError, UnicodeDecodeError) as unreadable:
        reason = getattr(unreadable, "strerror", None) or str(unreadable)
        raise SettingsError(
            [PolicyError(str(config), 1, "", f"cannot read the configuration file: {reason}")]
        ) from None
    return parse_settings_text(text, str(config), config.resolve().parent)
