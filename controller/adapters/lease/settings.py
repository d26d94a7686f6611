"""The `leaderElection` section of the controller configuration (controller/app/settings.py).

Apart from the elector (leader.py) because it imports no client library: the configuration loads without the
cluster extra (kubernetes), which is needed only when the section is present (`LeaderElector.from_settings`).
"""

from __future__ import annotations

import os
import socket

from pydantic import BaseModel, ConfigDict, Field, model_validator

from tailguard.controller.core.policy import Duration


class LeaderElectionSettings(BaseModel):
    """The `leaderElection` section of the controller configuration (controller/app/settings.py)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    leaseName: str = Field(default="tailguard", pattern=r"^[a-z0-9]([-a-z0-9.]*[a-z0-9])?$")
    namespace: str = Field(min_length=1, description="namespace of the Lease (usually the controller's own)")
    identity: str | None = Field(
        default=None, min_length=1, description="this replica's name; default: $POD_NAME, else the host name"
    )
    leaseDuration: Duration = Field(default=15.0, description="a holder silent this long may be replaced")
    renewDeadline: Duration = Field(default=10.0, description="a leader not renewed this long stops acting")
    retryPeriod: Duration = Field(default=2.0, description="interval of acquire/renew rounds")
    advertiseAddressEnv: str | None = Field(
        default="POD_IP",
        min_length=1,
        description="environment variable holding this replica's address (the downward API's status.podIP): the "
        "leader publishes http://ADDRESS:listen.port in its Lease and a standby forwards reads, controls and alerts "
        "there (one view across replicas); null or unset: nothing is published and a standby answers 503",
    )
    peerSecretFile: str | None = Field(
        default=None,
        min_length=1,
        description="file holding the replicas' own secret (16+ bytes) a standby signs forwarded requests with and "
        "the leader its answers (docs/deploy.md 'Security'); unset: a key derived from the webhook token",
    )
    peerSecretEnv: str | None = Field(
        default=None, min_length=1, description="environment variable holding that secret (instead of a file)"
    )
    forwardTimeout: Duration = Field(
        default=5.0, gt=0, description="a standby waits this long for the leader's answer to a forwarded request"
    )
    shards: int = Field(
        default=1,
        ge=1,
        le=64,
        description="split the policies over this many shards, each owned through its own Lease "
        "<leaseName>-shard-<i> (1: one Lease <leaseName>, one leader); docs/deploy.md 'Sharding'",
    )

    @model_validator(mode="after")
    def _ordered(self) -> LeaderElectionSettings:
        if self.peerSecretFile is not None and self.peerSecretEnv is not None:
            raise ValueError("expected at most one of peerSecretFile or peerSecretEnv")
        if not 0 < self.retryPeriod < self.renewDeadline <= self.leaseDuration:
            raise ValueError(
                "expected 0 < retryPeriod < renewDeadline <= leaseDuration, got "
                f"{self.retryPeriod:g}s, {self.renewDeadline:g}s, {self.leaseDuration:g}s"
            )
        return self

    def advertised_url(self, port: int) -> str | None:
        """This replica's API URL for the Lease (None: the address variable is not configured or not set)."""
        address = os.environ.get(self.advertiseAddressEnv, "").strip() if self.advertiseAddressEnv else ""
        if not address:
            return None
        host = f"[{address}]" if ":" in address else address
        return f"http://{host}:{port}"

    def resolved_identity(self) -> str:
        return self.identity or os.environ.get("POD_NAME") or socket.gethostname()
