"""Where a request comes from, and the key its budgets are counted under.

Behind the TLS proxy every request's peer is the proxy, so the client's address
is read from the header the proxy adds (``X-Forwarded-For`` or RFC 7239
``Forwarded``, whichever is configured) -- but only when the peer is one of the
trusted proxies. From anyone else those headers are the client's own words and
are ignored. The header is walked from the right (each proxy appends what it
saw) past the trusted proxies; the first address not trusted is the client.
Only the configured header is read: a proxy that sets one passes the other
through untouched, so reading both would let a client choose its address.

Not uvicorn's ProxyHeadersMiddleware (``--forwarded-allow-ips``): it reads
only X-Forwarded-For, rewrites the client of every request (and the scheme,
from X-Forwarded-Proto), turns a mistyped trusted address silently into a
literal that matches nothing, and when every hop is trusted takes the leftmost
entry, which the client wrote. Here the client address is asked for only where
a budget is counted, and a bad setting is refused at start.

Budgets are counted per address *prefix*: an IPv4 address, or the /64 of an
IPv6 address (one household or one server gets a /64, so counting single IPv6
addresses would give each client 2^64 budgets). A /64 is still cheap (a free
tunnel broker hands out a /48, 65,536 of them), so the global budgets also keep
a share per *network*: the IPv4 /24 or the IPv6 /48 a prefix belongs to.
"""

from __future__ import annotations

import ipaddress
from collections.abc import Iterable
from typing import Literal

from starlette.requests import HTTPConnection

Address = ipaddress.IPv4Address | ipaddress.IPv6Address
Network = ipaddress.IPv4Network | ipaddress.IPv6Network
ProxyHeader = Literal["x-forwarded-for", "forwarded"]
IPV6_PREFIX = 64
IPV4_NETWORK = 24
IPV6_NETWORK = 48


def parse_trusted_proxies(text: str) -> tuple[Network, ...]:
    """Comma-separated addresses and CIDR networks; empty means none.

    Raises:
        ValueError: an entry is neither, with a sentence naming it.
    """
    networks = []
    for entry in (part.strip() for part in text.split(",")):
        if not entry:
            continue
        try:
            networks.append(ipaddress.ip_network(entry, strict=False))
        except ValueError:
            raise ValueError(
                f"{entry!r} is not an IP address or network (such as 10.0.0.0/8 or ::1)"
            ) from None
    return tuple(networks)


def parse_address(text: str) -> Address | None:
    """An address as proxies write it: bare, quoted, ``1.2.3.4:port`` or ``[v6]:port``."""
    node = text.strip().strip('"').strip()
    if node.startswith("["):
        node = node[1 : node.find("]")] if "]" in node else ""
    elif node.count(":") == 1:
        node = node.split(":", 1)[0]
    node = node.split("%", 1)[0]  # a zone index names an interface, not a client
    try:
        address = ipaddress.ip_address(node)
    except ValueError:
        return None
    if isinstance(address, ipaddress.IPv6Address) and address.ipv4_mapped is not None:
        return address.ipv4_mapped
    return address


def prefix_key(address: Address) -> str:
    """The budget key: the IPv4 address, or the IPv6 /64 it belongs to."""
    if isinstance(address, ipaddress.IPv6Address):
        return str(ipaddress.IPv6Network((address, IPV6_PREFIX), strict=False))
    return str(address)


def network_key(prefix: str) -> str:
    """The network a budget key belongs to: its IPv4 /24 or IPv6 /48; a key that names
    no address (a Unix socket, "unknown") is its own network."""
    try:
        network = ipaddress.ip_network(prefix, strict=False)
    except ValueError:
        return prefix
    length = IPV4_NETWORK if network.version == 4 else IPV6_NETWORK
    return str(network.supernet(new_prefix=length)) if network.prefixlen > length else prefix


def _split_outside_quotes(text: str, separator: str) -> list[str]:
    parts: list[str] = []
    current: list[str] = []
    quoted = escaped = False
    for char in text:
        if escaped:
            escaped = False
        elif char == "\\" and quoted:
            escaped = True
        elif char == '"':
            quoted = not quoted
        elif char == separator and not quoted:
            parts.append("".join(current))
            current = []
            continue
        current.append(char)
    parts.append("".join(current))
    return parts


def forwarded_for_nodes(value: str) -> list[str]:
    """The ``for=`` node of each element of an RFC 7239 ``Forwarded`` value, in order
    (an element without one yields an empty node, which is no address)."""
    nodes = []
    for element in _split_outside_quotes(value, ","):
        node = ""
        for pair in _split_outside_quotes(element, ";"):
            name, _, given = pair.partition("=")
            if name.strip().lower() == "for":
                node = given.strip()
        nodes.append(node)
    return nodes


class ClientAddresses:
    def __init__(self, trusted: Iterable[Network] = (), header: ProxyHeader = "x-forwarded-for"):
        self._trusted = tuple(trusted)
        self._header = header

    def _trusts(self, address: Address) -> bool:
        return any(address in network for network in self._trusted)

    def client_address(self, peer: str | None, headers: Iterable[tuple[str, str]]) -> str:
        """The client's address: the peer's, or, when the peer is a trusted proxy, the
        rightmost address in the proxy header that is not itself a trusted proxy."""
        if not peer:
            return "unknown"
        hop = parse_address(peer)
        if hop is None:
            return peer  # a Unix socket or a test client: no address to reason about
        if not self._trusted or not self._trusts(hop):
            return str(hop)
        values = [value for name, value in headers if name.lower() == self._header]
        joined = ", ".join(values)
        nodes = (
            forwarded_for_nodes(joined)
            if self._header == "forwarded"
            else joined.split(",")
            if joined
            else []
        )
        for node in reversed(nodes):
            address = parse_address(node)
            if address is None:
                break  # "unknown", an obfuscated name or garbage: keep the last hop we trust
            hop = address
            if not self._trusts(address):
                break
        return str(hop)

    def key_of(self, connection: HTTPConnection) -> str:
        """The budget key of a request: see ``prefix_key``."""
        peer = connection.client.host if connection.client else None
        found = self.client_address(peer, connection.headers.items())
        address = parse_address(found)
        return prefix_key(address) if address is not None else found
