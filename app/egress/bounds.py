"""How many connections one sandbox and one sign-in address may hold to the shared
proxy, sized from Squid's descriptors, and who was refused for holding more.

Squid is one process for every tenant, with ``descriptors`` open files (the server
sets its ``RLIMIT_NOFILE`` before it starts: :mod:`app.egress.squid`). A
connection through it holds two of them once its tunnel is open (the client's and
the site's), and Squid keeps :data:`RESERVE` for itself (its logs, helpers, DNS), so
it serves ``(descriptors - RESERVE) // 2`` connections at once. That many, shared by
the pool's slots (only a sandbox holding a slot has containers), is each sandbox's
bound: every sandbox together never fill Squid, however many addresses they come
from. One sign-in address (an IPv4 address or an IPv6 /64: the key of the sign-in
limits, ``auth.grants.SIGNIN_CLAIM``) holds ``address_shares`` sandboxes' worth at
most, whatever number of sandboxes it signed in. The per-container limit stays
(:mod:`app.egress.connlimit`).

The mechanism is nftables' ``ct count`` in a dynamic set keyed by a mark: one table
of ours, hooked on INPUT before the iptables chain, maps each restricted container's
address to its sandbox's and its address's mark (:func:`write_maps`, whenever the
ACL state is written), and a new connection to the proxy whose sandbox or address
already holds its bound is reset (a ``tcp-reset``, at once, before Squid sees it,
idle or not). Why not iptables: ``connlimit`` groups by source address only, and a
rule per sandbox would lose its count each time the chain is rewritten; the set's
elements keep their counts while the maps and rules change. The refused addresses
are noted in a set each, which the meter reads (and empties) to tell the
container's next command result, as it does for the per-container limit.

Blocking functions (``nft``): callers run them in a thread, under the folder's lock.
"""

from __future__ import annotations

import hashlib
import json
import shutil
import subprocess
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Final, Protocol

from app.errors import ConfigurationError

RESERVE: Final = 256  # descriptors Squid keeps for itself
PER_CONNECTION: Final = 2  # a tunnel: the client's descriptor and the site's
SCOPES: Final = ("sandbox", "address")


@dataclass(frozen=True)
class Bounds:
    """Connections open to the proxy at once, per sandbox and per sign-in address."""

    descriptors: int
    per_sandbox: int
    per_address: int

    @property
    def connections(self) -> int:
        """What Squid serves at once with its descriptors."""
        return (self.descriptors - RESERVE) // PER_CONNECTION

    def of(self, scope: str) -> int:
        return self.per_sandbox if scope == "sandbox" else self.per_address


def size_bounds(descriptors: int, slots: int, address_shares: int) -> Bounds:
    """Each slot's share of Squid's connections; an address's, ``address_shares`` of them."""
    per_sandbox = max(1, (descriptors - RESERVE) // PER_CONNECTION // slots)
    return Bounds(descriptors, per_sandbox, per_sandbox * address_shares)


class Member(Protocol):
    """A restricted container as the maps see it (``app.egress.usage.ProxyClient``)."""

    @property
    def address(self) -> str: ...
    @property
    def sandbox(self) -> str: ...
    @property
    def signin(self) -> str: ...


def mark(label: str) -> int:
    """A label's key in the sets: 32 bits of its hash (a collision only makes two
    sandboxes share one bound)."""
    return int.from_bytes(hashlib.sha256(label.encode()).digest()[:4], "big") or 1


def install_bounds(table: str, bridge: str, gateway: str, port: int, bounds: Bounds) -> None:
    """Create the table (or refill its rules: the counts stay in its sets).

    Raises:
        ConfigurationError: nft is missing or refuses the table.
    """
    if shutil.which("nft") is None:
        raise ConfigurationError(
            "network 'restricted' needs nft (apt-get install nftables): it bounds the "
            "proxy's connections per sandbox and per sign-in address."
        )
    if _limits(table) not in (None, (bounds.per_sandbox, bounds.per_address)):
        _nft(f"delete table ip {table}\n")  # other bounds: the sets' elements keep theirs
    lines = [
        f"add table ip {table}",
        *(f"add map ip {table} {s}_of {{ type ipv4_addr : mark; }}" for s in SCOPES),
        *(f"add set ip {table} per_{s} {{ type mark; flags dynamic; }}" for s in SCOPES),
        *(f"add set ip {table} refused_{s} {{ type ipv4_addr; flags dynamic; }}" for s in SCOPES),
        f"add chain ip {table} bounds {{ type filter hook input priority -1; policy accept; }}",
        f"add chain ip {table} fresh",
        f"flush chain ip {table} bounds",
        f"flush chain ip {table} fresh",
        f'add rule ip {table} bounds iifname "{bridge}" ip daddr {gateway} tcp dport {port} '
        "tcp flags & (syn | ack) == syn jump fresh",
        *(
            f"add rule ip {table} fresh meta mark set ip saddr map @{s}_of "
            f"add @per_{s} {{ meta mark ct count over {bounds.of(s)} }} "
            f"add @refused_{s} {{ ip saddr }} reject with tcp reset"
            for s in SCOPES
        ),
        f"add rule ip {table} fresh meta mark set 0",  # as it came (nothing else marks it)
    ]
    _nft("\n".join(lines) + "\n")


def write_maps(table: str, members: Iterable[Member]) -> None:
    """Each container's sandbox and sign-in address, replaced in one transaction (an
    address with no sign-in label, e.g. a container made before it was labelled,
    counts in its sandbox only)."""
    lines = [f"flush map ip {table} {s}_of" for s in SCOPES]
    for scope in SCOPES:
        pairs = [
            f"{m.address} : {mark(label)}"
            for m in members
            if (label := m.sandbox if scope == "sandbox" else m.signin)
        ]
        if pairs:
            lines.append(f"add element ip {table} {scope}_of {{ {', '.join(pairs)} }}")
    _nft("\n".join(lines) + "\n")


def take_refused(table: str) -> dict[str, list[str]]:
    """By scope, the addresses its bound refused since the last call (the sets are
    emptied of them); nothing when the table is not there."""
    found: dict[str, list[str]] = {}
    for scope in SCOPES:
        done = _run("-j", "list", "set", "ip", table, f"refused_{scope}")
        if done.returncode != 0:
            continue
        addresses = [str(e) for e in _elements(done.stdout) if isinstance(e, str)]
        if addresses:
            found[scope] = addresses
            # A hit between the list and this stays in the set: counted at the next one.
            _run(
                "delete",
                "element",
                "ip",
                table,
                f"refused_{scope}",
                f"{{ {', '.join(addresses)} }}",
            )
    return found


def remove_bounds(table: str) -> None:
    if shutil.which("nft") is not None:
        _run("delete", "table", "ip", table)


def _limits(table: str) -> tuple[int, int] | None:
    """The bounds the table's rules hold now (None: no table)."""
    done = _run("-j", "list", "chain", "ip", table, "fresh")
    if done.returncode != 0:
        return None
    found: dict[str, int] = {}
    for item in _items(done.stdout):
        rule = item.get("rule")
        for statement in rule.get("expr") or () if isinstance(rule, dict) else ():
            dynset = statement.get("set") if isinstance(statement, dict) else None
            if not isinstance(dynset, dict):
                continue
            for expression in dynset.get("stmt") or ():
                count = expression.get("ct count") if isinstance(expression, dict) else None
                if isinstance(count, dict):
                    found[str(dynset.get("set", "")).lstrip("@")] = int(count.get("val", 0))
    return found.get("per_sandbox", 0), found.get("per_address", 0)


def _items(text: str) -> list[dict[str, object]]:
    try:
        listed = json.loads(text).get("nftables") or []
    except (ValueError, AttributeError):
        return []
    return [i for i in listed if isinstance(i, dict)]


def _elements(text: str) -> list[object]:
    for item in _items(text):
        body = item.get("set")
        if isinstance(body, dict):
            elements = body.get("elem") or []
            return list(elements) if isinstance(elements, list) else []
    return []


def _nft(script: str) -> None:
    done = subprocess.run(
        ["nft", "-f", "-"],  # noqa: S607
        input=script,
        capture_output=True,
        text=True,
        check=False,
    )
    if done.returncode != 0:
        raise ConfigurationError(
            f"nft refused the proxy's connection bounds: {done.stderr.strip()}"
        )


def _run(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(["nft", *args], capture_output=True, text=True, check=False)  # noqa: S603, S607
