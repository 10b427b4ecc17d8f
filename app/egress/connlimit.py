"""How many connections one restricted container may hold to the shared proxy, and
who was refused for holding more.

Squid is one process for every tenant, with a bounded number of descriptors: without
a bound per client, one container that opens thousands of connections and sends
nothing leaves none for the others. The bound is the kernel's, in the firewall
chain on the restricted bridge (:mod:`app.egress.network`): a new connection
from an address that already holds :data:`MAX_CONNECTIONS` to the proxy is reset at
once (``connlimit``), before Squid sees it, idle or not. The same rule notes the
address in an ``xt_recent`` list, which the meter reads (and empties) to tell the
container's next command result why its connections were refused, as it does for
Squid's own refusals.

Blocking functions (a file of /proc): the meter calls them in a thread.
"""

from __future__ import annotations

import contextlib
from pathlib import Path
from typing import Final

MAX_CONNECTIONS: Final = 64  # open to the proxy at once, per container (client address)
RECENT_DIR: Final = Path("/proc/net/xt_recent")


def limit_rule(gateway: str, port: int, recent: str) -> list[str]:
    """The iptables rule (before the chain's ACCEPT) that resets a new connection over
    the limit and notes its source in the ``recent`` list."""
    return [
        "-p", "tcp", "--syn", "-d", gateway, "--dport", str(port),
        "-m", "connlimit", "--connlimit-above", str(MAX_CONNECTIONS), "--connlimit-mask", "32",
        "-m", "recent", "--name", recent, "--set", "--rsource",
        "-j", "REJECT", "--reject-with", "tcp-reset",
    ]  # fmt: skip


def take_refused(recent: str, root: Path = RECENT_DIR) -> list[str]:
    """The addresses the limit refused since the last call (the list is emptied of
    them); [] when the list is not there (no rule yet, or not this host's)."""
    path = root / recent
    try:
        text = path.read_text()
    except OSError:
        return []
    found = []
    for line in text.splitlines():
        field = line.split(" ", 1)[0]
        if field.startswith("src="):
            found.append(field[4:])
    for address in found:  # a hit between the read and this counts at the next one
        with contextlib.suppress(OSError):
            path.write_text(f"-{address}\n")
    return found
