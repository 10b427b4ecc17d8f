"""Who moved what through the egress proxy: Squid's access log, read per experiment.

A client address on the restricted network is one container (the server maps it
when the container starts; without capabilities a container cannot take another's
address), so each log line belongs to one experiment: its bytes count against its
cap, its refusals wait for its next command result with the reason, and the
metrics and the log see both. Pure bookkeeping: no process, no Docker.
"""

from __future__ import annotations

import ipaddress
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Final
from urllib.parse import urlsplit

import structlog

from app.runtime.egress_rules import HTTP_PORT, HTTPS_PORT, matches

log = structlog.get_logger(__name__)

MAX_PENDING: Final = 20  # refusals kept per experiment until its next result
_OPEN_STATES: Final = frozenset({"01", "08"})  # ESTABLISHED, CLOSE_WAIT (Squid's side)

# Why a request was refused (the metrics label) and what the agent is told.
REASONS: Final = {
    "not_allowed": "not on this experiment's allow-list",
    "not_public": "it resolves to an address that is not public (loopback, private, "
    "link-local or metadata, shared, or this server)",
    "port": "only https on port 443 and http on port 80 go through the proxy",
    "cap": "this experiment has used its egress byte cap",
}


@dataclass(frozen=True)
class LogLine:
    """One line of Squid's access log (``egress_rules.LOG_FORMAT``)."""

    client: str
    denied: bool
    bytes: int
    method: str
    host: str
    port: int

    @classmethod
    def parse(cls, line: str) -> LogLine | None:
        parts = line.split()
        if len(parts) < 7:
            return None
        _, client, status, out, into, method, url = parts[:7]
        try:
            size = max(0, int(out)) + max(0, int(into))
        except ValueError:
            return None
        host, port = _host_port(method, url)
        return cls(client, status.startswith("TCP_DENIED"), size, method, host, port)


def _host_port(method: str, url: str) -> tuple[str, int]:
    if method == "CONNECT":
        host, _, port = url.rpartition(":")
        return host.strip("[]"), int(port) if port.isdecimal() else HTTPS_PORT
    try:
        parts = urlsplit(url)
        return parts.hostname or "", parts.port or HTTP_PORT
    except ValueError:
        return url[:200], HTTP_PORT


@dataclass
class Client:
    """One container on the restricted network."""

    container_id: str
    address: str
    allow: tuple[str, ...]
    experiment_id: str = ""
    bytes: int = 0
    blocked: bool = False
    refusals: int = 0
    pending: list[str] = field(default_factory=list)


class Ledger:
    """The containers on the restricted network, and what each moved and was refused."""

    def __init__(
        self,
        max_bytes: int,
        *,
        on_refused: Callable[[str], None] = lambda reason: None,
        on_bytes: Callable[[int], None] = lambda size: None,
    ) -> None:
        self.max_bytes = max_bytes
        self._on_refused = on_refused
        self._on_bytes = on_bytes
        self._clients: dict[str, Client] = {}  # by container id
        self._by_address: dict[str, str] = {}  # container address -> container id

    def get(self, container_id: str) -> Client | None:
        return self._clients.get(container_id)

    def add(self, client: Client) -> None:
        """Map ``client.address`` to it (an address reused by a new container moves)."""
        previous = self._by_address.get(client.address)
        if previous is not None and previous != client.container_id:
            self._clients.pop(previous, None)
        self._clients[client.container_id] = client
        self._by_address[client.address] = client.container_id

    def remove(self, container_id: str) -> Client | None:
        client = self._clients.pop(container_id, None)
        if client is not None and self._by_address.get(client.address) == container_id:
            del self._by_address[client.address]
        return client

    def state(self) -> dict[str, dict[str, Any]]:
        """What the ACL helper reads: each address's list, and whether it is blocked."""
        return {
            c.address: {"allow": list(c.allow), "blocked": c.blocked}
            for c in self._clients.values()
        }

    def account(self, line: LogLine) -> bool:
        """Add one log line to its container; whether the helper's state must change."""
        container_id = self._by_address.get(line.client)
        client = self._clients.get(container_id) if container_id else None
        if client is None:
            return False
        client.bytes += line.bytes
        self._on_bytes(line.bytes)
        if line.denied:
            reason = refusal_reason(client, line)
            client.refusals += 1
            self._on_refused(reason)
            log.info(
                "egress.refused",
                experiment_id=client.experiment_id,
                container_id=client.container_id[:12],
                host=line.host,
                port=line.port,
                reason=reason,
            )
            if len(client.pending) < MAX_PENDING:
                client.pending.append(f"{line.host}:{line.port}: {REASONS[reason]}")
        if not client.blocked and client.bytes >= self.max_bytes:
            client.blocked = True
            log.warning(
                "egress.cap_reached",
                experiment_id=client.experiment_id,
                container_id=client.container_id[:12],
                bytes=client.bytes,
            )
            client.pending.append(
                f"the egress byte cap ({self.max_bytes:,} bytes) is used up: "
                "the proxy refuses this experiment's further connections"
            )
            return True
        return False

    def notice(self, container_id: str) -> str | None:
        """The refusals not told yet, as the text that ends the command's stderr."""
        client = self._clients.get(container_id)
        if client is None or not client.pending:
            return None
        refused, client.pending = client.pending, []
        listed = ", ".join(client.allow) or "(nothing)"
        return (
            f"\n[sandbox-mcp] The egress proxy refused {len(refused)} connection(s) from "
            'this experiment (network "restricted"):\n'
            + "".join(f"  - {line}\n" for line in refused)
            + f"This experiment may reach: {listed}. A name on the server's allow-list "
            "(check_sandbox_runtime) can be asked for with egress_allowlist when the "
            "experiment is created; any other needs the operator "
            "(SANDBOX_MCP_EGRESS_ALLOWLIST). Addresses that are not public are never "
            "reached.\n"
        )


def refusal_reason(client: Client, line: LogLine) -> str:
    """Which rule refused ``line`` (Squid logs a 403 alike for all of them)."""
    wanted = HTTPS_PORT if line.method == "CONNECT" else HTTP_PORT
    if line.port != wanted:
        return "port"
    if client.blocked:
        return "cap"
    if not matches(line.host, client.allow):
        return "not_allowed"
    return "not_public"


def read_new_lines(path: Path, offset: int) -> tuple[list[str], int]:
    """Whole lines of ``path`` from ``offset`` (blocking), and the offset after them."""
    try:
        with path.open("rb") as file:
            file.seek(offset)
            data = file.read(4 * 1024 * 1024)
    except FileNotFoundError:
        return [], offset
    end = data.rfind(b"\n") + 1  # a line still being written waits for the next read
    return data[:end].decode(errors="replace").splitlines(), offset + end


def open_connections(gateway: str, port: int, client: str) -> bool:
    """Whether Squid still holds a connection from ``client`` (``/proc/net/tcp``)."""
    local = f"{_hex_address(gateway)}:{port:04X}"
    remote = _hex_address(client) + ":"
    try:
        with open("/proc/net/tcp", encoding="ascii") as table:
            next(table, None)
            for row in table:
                fields = row.split()
                if (
                    fields[1] == local
                    and fields[2].startswith(remote)
                    and fields[3] in _OPEN_STATES
                ):
                    return True
    except OSError:
        return False
    return False


def _hex_address(address: str) -> str:
    return ipaddress.IPv4Address(address).packed[::-1].hex().upper()
