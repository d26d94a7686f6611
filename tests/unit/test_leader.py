"""Leader election over a coordination.k8s.io/v1 Lease on the fake Kubernetes API."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
from kubernetes import client as k8s

from tailguard.controller.adapters.lease.leader import API_URL_ANNOTATION, LeaderElector
from tailguard.controller.adapters.lease.settings import LeaderElectionSettings
from tailguard.controller.app.settings import SettingsError, load_settings
from tailguard.controller.kit.clock import ManualClock
from tests.support.fake_kubernetes import FakeKubernetes


@pytest.fixture
def fake() -> Iterator[FakeKubernetes]:
    with FakeKubernetes() as server:
        yield server


def elector(fake: FakeKubernetes, identity: str, clock: ManualClock) -> LeaderElector:
    api = k8s.CoordinationV1Api(fake.api_client())
    return LeaderElector(api, "tailguard", "llm", identity, 15, clock)


def holder(fake: FakeKubernetes) -> str | None:
    lease = fake.get_object("leases", "llm", "tailguard")
    return None if lease is None else lease["spec"].get("holderIdentity")


def test_first_acquires_second_follows_and_takes_over_after_expiry(fake: FakeKubernetes) -> None:
    clock = ManualClock()
    a, b = elector(fake, "pod-a", clock), elector(fake, "pod-b", clock)
    assert a.run_once() is True
    assert b.run_once() is False
    assert holder(fake) == "pod-a"
    # a renews within its deadline: b keeps following
    for _ in range(4):
        clock.advance(5)
        assert a.run_once() is True
        assert b.run_once() is False
        assert not (a.is_leader() and b.is_leader())
    # a stops renewing (partitioned, crashed): its own deadline ends its leadership before b may take over
    clock.advance(10)
    assert a.is_leader() is False
    assert b.run_once() is False  # b has seen this record for only 10 s
    clock.advance(5)
    assert b.run_once() is True
    assert holder(fake) == "pod-b"
    assert not a.is_leader()
    lease = fake.get_object("leases", "llm", "tailguard")
    assert lease is not None and lease["spec"]["leaseTransitions"] == 1
    # a comes back: it follows
    assert a.run_once() is False


def test_never_both_lead_over_many_interleavings(fake: FakeKubernetes) -> None:
    clock = ManualClock()
    electors = [elector(fake, f"pod-{n}", clock) for n in range(3)]
    leaders_seen: set[str] = set()
    for round_number in range(30):
        for index, candidate in enumerate(electors):
            # pod-0 is partitioned for a while: it stops running rounds
            if index == 0 and 8 <= round_number < 20:
                continue
            candidate.run_once()
            leading = [e.identity for e in electors if e.is_leader()]
            assert len(leading) <= 1, leading
            leaders_seen.update(leading)
        clock.advance(4)
    assert len(leaders_seen) >= 2  # leadership moved when the leader stopped renewing


def test_racing_takeover_one_wins(fake: FakeKubernetes) -> None:
    clock = ManualClock()
    a, b, c = (elector(fake, name, clock) for name in ("pod-a", "pod-b", "pod-c"))
    assert a.run_once()
    assert not b.run_once() and not c.run_once()
    clock.advance(16)  # a is gone; b and c both see an expired record
    # c's takeover lands between b's read and b's write: b's PUT carries a stale resourceVersion -> 409
    fake.inject("update", "leases", hook=lambda: c.run_once() and None)
    assert b.run_once() is False
    assert c.is_leader() is True and b.is_leader() is False
    assert holder(fake) == "pod-c"
    assert len(fake.calls("update", "leases")) == 2


def test_release_lets_a_successor_take_over_at_once(fake: FakeKubernetes) -> None:
    clock = ManualClock()
    a, b = elector(fake, "pod-a", clock), elector(fake, "pod-b", clock)
    assert a.run_once()
    a.release()
    assert a.is_leader() is False
    assert holder(fake) == ""
    assert b.run_once() is True


def test_api_errors_are_recorded_and_leadership_runs_out(fake: FakeKubernetes) -> None:
    clock = ManualClock()
    a = elector(fake, "pod-a", clock)
    assert a.run_once()
    fake.inject("get", "leases", status=500, times=10)
    clock.advance(5)
    assert a.run_once() is True  # still within the deadline of the last renewal
    assert a.last_error is not None and "HTTP 500" in a.last_error
    clock.advance(6)
    assert a.run_once() is False  # 11 s since the last renewal: past the 10 s deadline


def test_bad_arguments() -> None:
    with pytest.raises(ValueError, match="identity"):
        LeaderElector(k8s.CoordinationV1Api(), "l", "ns", "", 15, ManualClock())
    with pytest.raises(ValueError, match="lease_seconds"):
        LeaderElector(k8s.CoordinationV1Api(), "l", "ns", "a", 0, ManualClock())


def test_leader_election_settings(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    config = tmp_path / "tailguard.yaml"
    config.write_text(
        "prometheus: {url: 'http://127.0.0.1:9090'}\npolicies: [r.yaml]\n"
        "leaderElection:\n  namespace: tailguard\n  leaseDuration: 30s\n  renewDeadline: 20s\n"
    )
    settings = load_settings(config)
    assert settings.leaderElection is not None
    monkeypatch.setenv("POD_NAME", "tailguard-7f9c-abcde")
    elector = LeaderElector.from_settings(settings.leaderElection, k8s.CoordinationV1Api(), ManualClock())
    assert (elector.name, elector.namespace, elector.identity) == ("tailguard", "tailguard", "tailguard-7f9c-abcde")
    assert (elector.lease_seconds, elector.renew_deadline) == (30.0, 20.0)


@pytest.mark.parametrize(
    ("section", "message"),
    [
        ("  namespace: tailguard\n  leaseDuration: 10s\n  renewDeadline: 20s\n", "renewDeadline <= leaseDuration"),
        ("  namespace: tailguard\n  leaseNme: x\n", "leaderElection.leaseNme: unknown field"),
        ("  leaseName: x\n", "leaderElection.namespace"),
    ],
)
def test_leader_election_settings_errors_are_located(tmp_path: Path, section: str, message: str) -> None:
    config = tmp_path / "tailguard.yaml"
    config.write_text("prometheus: {url: 'http://127.0.0.1:9090'}\npolicies: [r.yaml]\nleaderElection:\n" + section)
    with pytest.raises(SettingsError) as raised:
        load_settings(config)
    text = str(raised.value)
    assert message in text and f"{config}:" in text


def test_the_holder_publishes_its_api_url_and_the_follower_reads_it_only_while_the_lease_holds(
    fake: FakeKubernetes,
) -> None:
    clock = ManualClock()
    a, b = elector(fake, "pod-a", clock), elector(fake, "pod-b", clock)
    a.advertise("http://10.0.0.1:9464")
    b.advertise("http://10.0.0.2:9464")
    assert a.run_once() is True and b.run_once() is False
    lease = fake.get_object("leases", "llm", "tailguard")
    assert lease is not None and lease["metadata"]["annotations"][API_URL_ANNOTATION] == "http://10.0.0.1:9464"
    assert b.leader_api_url() == "http://10.0.0.1:9464"
    assert b.leader_endpoint() == ("pod-a", "http://10.0.0.1:9464"), "the holder and its URL, read together"
    assert a.leader_api_url() is None and a.leader_endpoint() is None, "the leader forwards nothing"
    # a dies without releasing: once its Lease expired b takes over and publishes its own URL; b forwards no more
    clock.advance(10)
    assert b.run_once() is False and b.leader_api_url() == "http://10.0.0.1:9464"
    clock.advance(15)
    assert b.run_once() is True and b.leader_api_url() is None
    lease = fake.get_object("leases", "llm", "tailguard")
    assert lease is not None and lease["metadata"]["annotations"][API_URL_ANNOTATION] == "http://10.0.0.2:9464"
    assert a.run_once() is False and a.leader_endpoint() == ("pod-b", "http://10.0.0.2:9464")
    # b releases on stop: the Lease names nobody, so a has no URL to forward to until it leads
    b.release()
    clock.advance(1)
    assert a.run_once() is True and a.leader_api_url() is None and a.leader_endpoint() is None


def test_the_advertised_url_comes_from_the_pod_ip_and_the_listen_port(monkeypatch: pytest.MonkeyPatch) -> None:
    settings = LeaderElectionSettings(namespace="tailguard")
    monkeypatch.delenv("POD_IP", raising=False)
    assert settings.advertised_url(9464) is None
    monkeypatch.setenv("POD_IP", "10.1.2.3")
    assert settings.advertised_url(9464) == "http://10.1.2.3:9464"
    monkeypatch.setenv("POD_IP", "fd00::7")
    assert settings.advertised_url(9464) == "http://[fd00::7]:9464"
    assert LeaderElectionSettings(namespace="t", advertiseAddressEnv=None).advertised_url(9464) is None
