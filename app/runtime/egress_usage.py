"""Who moved what through the egress proxy: Squid's access log, read per experiment.

A client address on the restricted network is one container (the server maps it
when the container starts; without capabilities a container cannot take another's
address), so each log line belongs to one experiment: its bytes count against its
cap, its refusals wait for its next command result with the reason, and the
metrics and the log see both. Pure bookkeeping: no process, no Docker, no database.

The log is read in a thread (a big one must never hold the event loop): parsing
takes no lock, and the ledger's lock is held only to add each address's sums, so
the loop's own short calls (a notice, a container mapped) never wait long.

Bytes are counted per experiment, from the total the database holds (the proxy
hands it over: :meth:`Ledger.set_usage`), so the cap holds across a restart and
across processes; :meth:`Ledger.over_cap` adds the bytes of the connections still
open (the kernel's count) to catch a transfer before it ends.
"""

from __future__ import annotations

import threading
from collections import defaultdict
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Final
from urllib.parse import urlsplit

import structlog

from app.runtime.egress_rules import HTTP_PORT, HTTPS_PORT, matches

log = structlog.get_logger(__name__)

MAX_PENDING: Final = 20  # refusals kept per experiment until its next result
READ_CHUNK: Final = 4 * 1024 * 1024  # of the log, per read
CAP_CODE: Final = "EGRESS_CAP_REACHED"  # stable: the agent (and its tools) may match it

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
    client_port: int = 0  # 0: not logged

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
        source = parts[7] if len(parts) > 7 and parts[7].isdecimal() else "0"
        denied = status.startswith("TCP_DENIED")
        return cls(client, denied, size, method, host, port, int(source))

    @property
    def connection(self) -> str:
        """The client's end of the connection, as ``ss`` names it."""
        return f"{self.client}:{self.client_port}"


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
    bytes: int = 0  # this container's, from the log (the experiment's total is the ledger's)
    blocked: bool = False
    refusals: int = 0
    pending: list[str] = field(default_factory=list)
    cap_pending: bool = False  # the cap stopped it since the last notice


@dataclass
class _Sums:
    """One address's log lines of one read, added up before the ledger's lock."""

    bytes: int = 0
    denied: list[LogLine] = field(default_factory=list)
    by_connection: dict[str, int] = field(default_factory=lambda: defaultdict(int))


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
        self._lock = threading.Lock()  # the log is accounted in a thread
        self._clients: dict[str, Client] = {}  # by container id
        self._by_address: dict[str, str] = {}  # container address -> container id
        self._usage: dict[str, int] = {}  # experiment id -> its recorded bytes
        self._capped: set[str] = set()  # experiments the cap stopped
        # Bytes logged for connections that may still be open (kept-alive http logs
        # each request): subtracted from the kernel's count of those connections.
        self._logged: dict[str, int] = defaultdict(int)

    def get(self, container_id: str) -> Client | None:
        return self._clients.get(container_id)

    def add(self, client: Client) -> None:
        """Map ``client.address`` to it (an address reused by a new container moves)."""
        with self._lock:
            previous = self._by_address.get(client.address)
            if previous is not None and previous != client.container_id:
                self._clients.pop(previous, None)
            client.blocked = client.blocked or client.experiment_id in self._capped
            self._clients[client.container_id] = client
            self._by_address[client.address] = client.container_id

    def remove(self, container_id: str) -> Client | None:
        with self._lock:
            client = self._clients.pop(container_id, None)
            if client is None:
                return None
            if self._by_address.get(client.address) == container_id:
                del self._by_address[client.address]
            if not any(c.experiment_id == client.experiment_id for c in self._clients.values()):
                # Its last container: the database keeps its count for a recreated one.
                self._usage.pop(client.experiment_id, None)
                self._capped.discard(client.experiment_id)
            return client

    def experiments(self) -> set[str]:
        with self._lock:
            return {c.experiment_id for c in self._clients.values() if c.experiment_id}

    def usage_of(self, experiment_id: str) -> int:
        return self._usage.get(experiment_id, 0)

    def state(self) -> dict[str, dict[str, Any]]:
        """What the ACL helper reads: each address's list, and whether it is blocked."""
        with self._lock:
            return {
                c.address: {"allow": list(c.allow), "blocked": c.blocked}
                for c in self._clients.values()
            }

    def account(self, lines: Iterable[str]) -> dict[str, int]:
        """Add log lines to their containers (blocking: call it in a thread).

        Returns the bytes each experiment moved in them, for the database; the
        totals it answers go to :meth:`set_usage`.
        """
        sums: dict[str, _Sums] = defaultdict(_Sums)
        for text in lines:  # no lock: the loop's calls never wait for the parsing
            line = LogLine.parse(text)
            if line is not None:
                entry = sums[line.client]
                entry.bytes += line.bytes
                if line.client_port:
                    entry.by_connection[line.connection] += line.bytes
                if line.denied:
                    entry.denied.append(line)
        moved: dict[str, int] = defaultdict(int)
        refused: list[tuple[Client, LogLine, str]] = []
        with self._lock:
            for address, entry in sums.items():
                container_id = self._by_address.get(address)
                client = self._clients.get(container_id) if container_id else None
                if client is None:
                    continue
                client.bytes += entry.bytes
                for connection, size in entry.by_connection.items():
                    self._logged[connection] += size
                if client.experiment_id:
                    moved[client.experiment_id] += entry.bytes
                for line in entry.denied:
                    reason = refusal_reason(client, line)
                    client.refusals += 1
                    refused.append((client, line, reason))
                    if len(client.pending) < MAX_PENDING:
                        client.pending.append(f"{line.host}:{line.port}: {REASONS[reason]}")
        self._on_bytes(sum(entry.bytes for entry in sums.values()))
        for client, line, reason in refused:
            self._on_refused(reason)
            log.info(
                "egress.refused",
                experiment_id=client.experiment_id,
                container_id=client.container_id[:12],
                host=line.host,
                port=line.port,
                reason=reason,
            )
        return dict(moved)

    def set_usage(self, totals: Mapping[str, tuple[int, bool]]) -> set[str]:
        """Each experiment's recorded (bytes, capped); the experiments it newly stops."""
        stopped = set()
        with self._lock:
            for experiment_id, (size, capped) in totals.items():
                self._usage[experiment_id] = size
                if capped or size >= self.max_bytes:
                    stopped |= self._block(experiment_id, size, tell=not capped)
        return stopped

    def over_cap(self, live: Mapping[str, int]) -> set[str]:
        """Stop the experiments whose recorded bytes and open connections reach the cap;
        those it newly stops. ``live``: each open connection's bytes so far, by its
        client end (``address:port``), whether logged in part already or not."""
        open_bytes: dict[str, int] = defaultdict(int)
        with self._lock:
            for gone in self._logged.keys() - live.keys():
                del self._logged[gone]  # closed: its whole count is the log's now
            for connection, moved in live.items():
                size = max(0, moved - self._logged.get(connection, 0))
                address = connection.rpartition(":")[0]
                container_id = self._by_address.get(address)
                client = self._clients.get(container_id) if container_id else None
                if client is not None and client.experiment_id:
                    open_bytes[client.experiment_id] += size
            stopped = set()
            for experiment_id, size in open_bytes.items():
                total = self._usage.get(experiment_id, 0) + size
                if total >= self.max_bytes:
                    stopped |= self._block(experiment_id, total, tell=True)
            return stopped

    def _block(self, experiment_id: str, total: int, *, tell: bool) -> set[str]:
        if experiment_id in self._capped:
            return set()
        self._capped.add(experiment_id)
        for client in self._clients.values():
            if client.experiment_id == experiment_id:
                client.blocked = True
                client.cap_pending = client.cap_pending or tell
        log.warning("egress.cap_reached", experiment_id=experiment_id, bytes=total)
        return {experiment_id}

    def addresses_of(self, experiment_id: str) -> list[str]:
        with self._lock:
            return [c.address for c in self._clients.values() if c.experiment_id == experiment_id]

    def notice(self, container_id: str) -> str | None:
        """The refusals not told yet, and the cap if it stopped the experiment since."""
        with self._lock:
            client = self._clients.get(container_id)
            if client is None or not (client.pending or client.cap_pending):
                return None
            refused, client.pending = client.pending, []
            capped, client.cap_pending = client.cap_pending, False
        text = ""
        if refused:
            listed = ", ".join(client.allow) or "(nothing)"
            text += (
                f"\n[sandbox-mcp] The egress proxy refused {len(refused)} connection(s) from "
                'this experiment (network "restricted"):\n'
                + "".join(f"  - {line}\n" for line in refused)
                + f"This experiment may reach: {listed}. A name on the server's allow-list "
                "(check_sandbox_runtime) can be asked for with egress_allowlist when the "
                "experiment is created; any other needs the operator "
                "(SANDBOX_MCP_EGRESS_ALLOWLIST). Addresses that are not public are never "
                "reached.\n"
            )
        if capped:
            text += (
                f"\n[sandbox-mcp] {CAP_CODE}: the egress byte cap ({self.max_bytes:,} bytes) "
                "is used up: the proxy cut this experiment's open connections (a download "
                "in progress ends early) and refuses further ones. Its files stay; more egress "
                "needs another experiment (each has its own cap, "
                "SANDBOX_MCP_EGRESS_MAX_BYTES).\n"
            )
        return text


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
            data = file.read(READ_CHUNK)
    except FileNotFoundError:
        return [], offset
    end = data.rfind(b"\n") + 1  # a line still being written waits for the next read
    return data[:end].decode(errors="replace").splitlines(), offset + end
