"""The proxy's connections from restricted containers, as the kernel sees them.

Squid logs a transfer only when it ends, and offers nothing that stops a CONNECT
tunnel by bytes (``reply_body_max_size`` reads HTTP replies, which a TLS tunnel
hides, and counts one reply, not an experiment; delay pools slow, never stop). The
kernel does know, live, what every socket moved: ``ss -ti`` gives each
connection's ``bytes_acked`` (proxy to container) and ``bytes_received``
(container to proxy), and ``ss -K`` closes a connection (``SOCK_DESTROY``: Squid
sees an error and ends the tunnel; the container gets a reset). Blocking
functions (one ``ss`` each): the proxy calls them in a thread.
"""

from __future__ import annotations

import ipaddress
import re
import subprocess
from collections import defaultdict
from typing import Final

_OPEN_STATES: Final = frozenset({"01", "08"})  # ESTABLISHED, CLOSE_WAIT (Squid's side)
_COUNTER = re.compile(r"\b(bytes_acked|bytes_received):(\d+)")


def live_bytes(gateway: str, port: int) -> dict[str, int]:
    """Bytes moved so far by each open connection to the proxy, by its client end
    (``address:port``)."""
    done = subprocess.run(  # noqa: S603
        ["ss", "-tinH", "state", "established", "src", f"{gateway}:{port}"],  # noqa: S607
        capture_output=True,
        text=True,
        check=False,
    )
    return parse_ss(done.stdout) if done.returncode == 0 else {}


def parse_ss(text: str) -> dict[str, int]:
    """``ss -tinH`` output: a socket's line, then its details on an indented line."""
    moved: dict[str, int] = defaultdict(int)
    peer = None
    for line in text.splitlines():
        if not line[:1].isspace():
            fields = line.split()
            peer = fields[-1] if len(fields) >= 4 else None
            if peer:
                moved[peer] += 0
            continue
        if peer:
            moved[peer] += sum(int(n) for _, n in _COUNTER.findall(line))
    return dict(moved)


def cut(gateway: str, port: int, client: str) -> int | None:
    """Close every connection of ``client`` to the proxy: how many (None: some stay
    open, as on a kernel without ``CONFIG_INET_DIAG_DESTROY``)."""
    done = subprocess.run(  # noqa: S603
        ["ss", "-KH", "state", "established", "src", f"{gateway}:{port}", "dst", client],  # noqa: S607
        capture_output=True,
        text=True,
        check=False,
    )
    if done.returncode != 0 or _established(gateway, port, client):
        return None
    return len(done.stdout.splitlines())


def open_connections(gateway: str, port: int, client: str) -> bool:
    """Whether Squid still holds a connection from ``client`` (``/proc/net/tcp``)."""
    return _established(gateway, port, client, _OPEN_STATES)


def _established(
    gateway: str, port: int, client: str, states: frozenset[str] = frozenset({"01"})
) -> bool:
    local = f"{_hex_address(gateway)}:{port:04X}"
    remote = _hex_address(client) + ":"
    try:
        with open("/proc/net/tcp", encoding="ascii") as table:
            next(table, None)
            for row in table:
                fields = row.split()
                if fields[1] == local and fields[2].startswith(remote) and fields[3] in states:
                    return True
    except OSError:
        return False
    return False


def _hex_address(address: str) -> str:
    return ipaddress.IPv4Address(address).packed[::-1].hex().upper()
