"""Which addresses only this machine can reach (loopback), for the API's no-token mode and the listen check."""

from __future__ import annotations

import ipaddress


def is_loopback_host(host: str | None) -> bool:
    """127.0.0.0/8, ::1, an IPv4-mapped loopback (::ffff:127.0.0.1) or `localhost`; anything else (another host
    name, which may resolve to anything; None, an unknown peer) is not."""
    if not host:
        return False
    bare = host.strip("[]").lower()
    if bare == "localhost":
        return True
    try:
        address = ipaddress.ip_address(bare.split("%", 1)[0])
    except ValueError:
        return False
    if isinstance(address, ipaddress.IPv6Address) and address.ipv4_mapped is not None:
        return address.ipv4_mapped.is_loopback
    return address.is_loopback
