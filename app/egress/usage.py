"""Who moved what through the egress proxy: Squid's access log, read per experiment.

A client address on the restricted network is one container (mapped in the ACL
helper's state file whenever a container starts or goes; without capabilities a
container cannot take another's address), so each log line belongs to one
experiment: its bytes count against its cap, its refusals wait for its next command
result with the reason, and the metrics and the log see both. Pure bookkeeping: no
process, no Docker, no database, no file but the log (read in a thread: a big one
must never hold the event loop); :mod:`app.egress.meter` keeps the counts.

Bytes are counted per experiment, added to the total the database holds, so the
cap holds across a restart and across processes; :func:`open_bytes` gives the bytes
of the connections still open (the kernel's count) not logged yet, to catch a
transfer before it ends.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Final
from urllib.parse import urlsplit

from app.egress.connlimit import MAX_CONNECTIONS
from app.egress.rules import HTTP_PORT, HTTPS_PORT, matches

MAX_PENDING: Final = 20  # refusals listed per container until its next result
READ_CHUNK: Final = 4 * 1024 * 1024  # of the log, per read
CAP_CODE: Final = "EGRESS_CAP_REACHED"  # stable: the agent (and its tools) may match it
BUDGET_CODE: Final = "EGRESS_BUDGET_REACHED"  # likewise: the sandbox's daily budget

# Why a request was refused (the metrics label) and what the agent is told.
REASONS: Final = {
    "not_allowed": "not on this experiment's allow-list",
    "not_public": "it resolves to an address that is not public (loopback, private, "
    "link-local or metadata, shared, or this server)",
    "port": "only https on port 443 and http on port 80 go through the proxy",
    "cap": "this experiment has used its egress byte cap, or its sandbox its daily egress budget",
    "connections": f"the per-experiment connection limit was reached ({MAX_CONNECTIONS} "
    "connections open to the proxy at once): further connections were refused until some "
    "close",
    # The proxy is shared: its connections are bounded per sandbox and per sign-in
    # address too (egress_bounds), each with the number of the bound.
    "sandbox_connections": "this sandbox's connection limit was reached ({limit} "
    "connections open to the proxy at once by all of its experiments): further "
    "connections were refused until some close",
    "address_connections": "the connection limit of your sign-in address was reached ({limit} "
    "connections open to the proxy at once by all sandboxes signed in from it): further "
    "connections were refused until some close",
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


@dataclass(frozen=True)
class ProxyClient:
    """One container on the restricted network (an entry of the ACL helper's state)."""

    container_id: str
    address: str
    allow: tuple[str, ...]
    experiment_id: str = ""
    blocked: bool = False
    sandbox: str = ""  # its sandbox's label (egress_bounds groups by it)
    signin: str = ""  # its sign-in address's label ("": none known)

    def entry(self) -> dict[str, Any]:
        return {
            "allow": list(self.allow),
            "blocked": self.blocked,
            "container": self.container_id,
            "experiment": self.experiment_id,
            "sandbox": self.sandbox,
            "signin": self.signin,
        }

    @classmethod
    def from_entry(cls, address: str, entry: Mapping[str, Any]) -> ProxyClient:
        return cls(
            str(entry.get("container", "")),
            address,
            tuple(str(n) for n in entry.get("allow") or ()),
            str(entry.get("experiment", "")),
            bool(entry.get("blocked")),
            str(entry.get("sandbox", "")),
            str(entry.get("signin", "")),
        )


def clients_of(state: Mapping[str, Any]) -> dict[str, ProxyClient]:
    """The ACL helper's state (address -> entry) as clients, by address."""
    return {
        address: ProxyClient.from_entry(address, entry)
        for address, entry in state.items()
        if isinstance(entry, dict)
    }


@dataclass(frozen=True)
class ProxyRefusal:
    client: ProxyClient
    line: LogLine
    reason: str  # a key of REASONS
    limit: int = 0  # the bound that refused it, for the text

    @property
    def text(self) -> str:
        return f"{self.line.host}:{self.line.port}: {REASONS[self.reason].format(limit=self.limit)}"


@dataclass
class Accounted:
    """What some log lines moved and refused, per experiment."""

    moved: dict[str, int] = field(default_factory=lambda: defaultdict(int))
    sandboxes: dict[str, int] = field(default_factory=lambda: defaultdict(int))  # moved, by label
    refused: dict[str, int] = field(default_factory=lambda: defaultdict(int))
    refusals: list[ProxyRefusal] = field(default_factory=list)  # at most MAX_PENDING a container
    by_connection: dict[str, int] = field(default_factory=lambda: defaultdict(int))
    bytes: int = 0  # every line's, known client or not (the metrics)
    reasons: list[str] = field(default_factory=list)  # every refusal's (the metrics)
    listed: dict[str, int] = field(default_factory=lambda: defaultdict(int))  # by container


def account(
    lines: Iterable[str], clients: Mapping[str, ProxyClient], into: Accounted | None = None
) -> Accounted:
    """Add log lines up by experiment (``clients``: by address) into ``into``; lines of
    an address no container has are counted in the metrics only."""
    done = into if into is not None else Accounted()
    kept = done.listed
    for text in lines:
        line = LogLine.parse(text)
        if line is None:
            continue
        done.bytes += line.bytes
        client = clients.get(line.client)
        if line.client_port:
            done.by_connection[line.connection] += line.bytes
        if line.denied:
            reason = refusal_reason(client, line) if client else "not_allowed"
            done.reasons.append(reason)
        if client is None:
            continue
        if client.sandbox:  # a clone helper's too: the daily budget is the sandbox's
            done.sandboxes[client.sandbox] += line.bytes
        if client.experiment_id:  # a clone helper has none: its refusals are told only
            done.moved[client.experiment_id] += line.bytes
            done.refused[client.experiment_id] += int(line.denied)
        if line.denied and kept[client.container_id] < MAX_PENDING:
            kept[client.container_id] += 1
            done.refusals.append(ProxyRefusal(client, line, reason))
    return done


def account_limited(
    addresses: Iterable[str],
    clients: Mapping[str, ProxyClient],
    proxy: tuple[str, int],
    into: Accounted,
    reason: str = "connections",
    limit: int = 0,
) -> None:
    """Add the addresses a connection limit refused (``egress_connlimit``, or the
    ``reason`` bound of ``egress_bounds``) to ``into``, as one refusal each (the
    kernel does not log them one by one)."""
    host, port = proxy
    for address in addresses:
        into.reasons.append(reason)
        client = clients.get(address)
        if client is None:
            continue
        if client.experiment_id:
            into.refused[client.experiment_id] += 1
        if into.listed[client.container_id] < MAX_PENDING:
            into.listed[client.container_id] += 1
            line = LogLine(address, True, 0, "CONNECT", host, port)
            into.refusals.append(ProxyRefusal(client, line, reason, limit))


def open_bytes(
    live: Mapping[str, int],
    logged: Mapping[str, int],
    clients: Mapping[str, ProxyClient],
    by: Callable[[ProxyClient], str] = lambda client: client.experiment_id,
) -> dict[str, int]:
    """Bytes of the open connections (``live``: by client end ``address:port``) not in
    the log yet (``logged``: what kept-alive http connections logged so far), per
    experiment (``by``: per sandbox, with ``lambda c: c.sandbox``)."""
    found: dict[str, int] = defaultdict(int)
    for connection, moved in live.items():
        client = clients.get(connection.rpartition(":")[0])
        if client is not None and by(client):
            found[by(client)] += max(0, moved - logged.get(connection, 0))
    return dict(found)


def notice_text(
    refused: list[str],
    more: int,
    *,
    capped: bool,
    allow: tuple[str, ...],
    max_bytes: int,
    budget: bool = False,
    day_bytes: int = 0,
) -> str:
    """What a command's result is told: the refusals (``more``: not listed), the cap,
    the sandbox's daily budget."""
    text = ""
    if refused:
        listed = ", ".join(allow) or "(nothing)"
        text += (
            f"\n[sandbox-mcp] The egress proxy refused {len(refused) + more} connection(s) "
            'from this experiment (network "restricted"):\n'
            + "".join(f"  - {line}\n" for line in refused)
            + (f"  - and {more} more\n" if more else "")
            + f"This experiment may reach: {listed}. A name on the server's allow-list "
            "(check_sandbox_runtime) can be asked for with egress_allowlist when the "
            "experiment is created; any other needs the operator "
            "(SANDBOX_MCP_EGRESS_ALLOWLIST). Addresses that are not public are never "
            "reached.\n"
        )
    if capped:
        text += (
            f"\n[sandbox-mcp] {CAP_CODE}: the egress byte cap ({max_bytes:,} bytes) "
            "is used up: the proxy cut this experiment's open connections (a download "
            "in progress ends early) and refuses further ones. Its files stay; more egress "
            "needs another experiment (each has its own cap, "
            "SANDBOX_MCP_EGRESS_MAX_BYTES).\n"
        )
    if budget:
        text += (
            f"\n[sandbox-mcp] {BUDGET_CODE}: this sandbox's daily egress budget "
            f"({day_bytes:,} bytes, all its experiments together, "
            "SANDBOX_MCP_EGRESS_SANDBOX_BYTES_PER_DAY) is used up: the proxy cut its open "
            "connections and refuses further ones, in every experiment of this sandbox, "
            "until 00:00 UTC. Files stay; work that needs no network goes on.\n"
        )
    return text


def refusal_reason(client: ProxyClient, line: LogLine) -> str:
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
