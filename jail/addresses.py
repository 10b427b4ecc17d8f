"""Which network addresses a sandbox-facing fetch or connection may reach.

One policy for every part that connects somewhere a tenant chose: the OAuth
server's fetch of a client's metadata document (``auth/safe_fetch.py``) and the
runtime's clones and restricted networks (``app/runtime``). It lives here, beside
the other isolation rules, because ``auth`` must not import ``app`` and the runtime
must not take a policy from the sign-in's private workings; ``jail`` imports
nothing of ours, so both may use it.
"""

from __future__ import annotations

import ipaddress
from collections.abc import Awaitable, Callable

IPAddress = ipaddress.IPv4Address | ipaddress.IPv6Address
Resolver = Callable[[str, int], Awaitable[list[str]]]
AddressPolicy = Callable[[IPAddress], bool]

# IPv6 addresses are reached only in global unicast space...
_GLOBAL_UNICAST_V6 = ipaddress.ip_network("2000::/3")
# ...minus the ranges there that embed an IPv4 address (NAT64, 6to4, Teredo).
_NEVER = [
    ipaddress.ip_network(n) for n in ("64:ff9b::/96", "64:ff9b:1::/48", "2002::/16", "2001::/32")
]


def is_public_address(address: IPAddress) -> bool:
    """True only for globally routable unicast addresses.

    Loopback, private, link-local (cloud metadata at 169.254.169.254), shared
    (100.64/10), documentation, multicast, reserved and unspecified addresses are
    refused, and so is every IPv6 form that embeds an IPv4 address (mapped
    ``::ffff:a.b.c.d``, translated, compatible, NAT64, 6to4, Teredo), whatever the
    embedded address is: one rule, with no per-form exceptions to get wrong, and a
    public host that has an IPv4 address publishes it as such (an A record).
    """
    # Mapped, translated and compatible forms all lie outside 2000::/3.
    if isinstance(address, ipaddress.IPv6Address) and (
        address not in _GLOBAL_UNICAST_V6 or any(address in net for net in _NEVER)
    ):
        return False
    return address.is_global and not address.is_multicast


def is_loopback_host(host: str) -> bool:
    """True for ``localhost`` and any loopback address (127.0.0.0/8, ::1)."""
    if host.lower() == "localhost":
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return False
