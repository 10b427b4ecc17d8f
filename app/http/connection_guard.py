"""Keep slow or idle clients from holding every file descriptor (slowloris).

uvicorn has no deadline for a request's headers: a connection that sends
``GET / HTTP/1.1\\r\\n`` and then nothing stays open for ever, and ~1,000 of
them exhaust a 1,024-descriptor limit, after which nothing (not even
``/health``) is accepted. This guard wraps uvicorn's h11 protocol:

- a client gets ``header_timeout_s`` from connecting (or, on a kept-alive
  connection, from its first byte of the next request) to finish the request
  line and headers; then the connection is closed;
- at most ``max_connections`` are open; a connection past that first closes
  the oldest one still waiting for its headers (a real client sends its
  headers in milliseconds, so that one is the likeliest to be an attacker),
  and is closed itself only when every open connection is past its headers.

:func:`raise_descriptor_limit` lifts the soft RLIMIT_NOFILE to the hard one at
start-up, and :func:`connection_cap` keeps the cap below what the process may
open, with room for the database, Docker and files.
"""

from __future__ import annotations

import asyncio
import resource
from typing import Any, ClassVar

import h11
import structlog
from uvicorn.protocols.http.h11_impl import H11Protocol

from app.settings import Settings

log = structlog.get_logger(__name__)

# asyncio accepts up to ``backlog`` connections per wake-up before any protocol
# sees them (connection_made runs two loop turns later), so the listen backlog
# is kept small and the cap leaves room for two such batches in flight, plus
# 256 descriptors for the database, Docker and files.
ACCEPT_BACKLOG = 128
RESERVED_DESCRIPTORS = 256 + 2 * ACCEPT_BACKLOG


def raise_descriptor_limit() -> int:
    """Raise the soft descriptor limit to the hard one; return the soft limit now in force."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if hard == resource.RLIM_INFINITY or soft < hard:
        target = hard if hard != resource.RLIM_INFINITY else max(soft, 1_048_576)
        try:
            resource.setrlimit(resource.RLIMIT_NOFILE, (target, hard))
            soft = target
        except (ValueError, OSError) as exc:
            log.warning("http.nofile_not_raised", soft=soft, hard=hard, error=str(exc))
    return soft


def connection_cap(wanted: int, descriptor_limit: int) -> int:
    """``wanted``, lowered so client connections never take the reserved descriptors."""
    return max(16, min(wanted, descriptor_limit - RESERVED_DESCRIPTORS))


def guard_for(settings: Settings) -> type[GuardedH11Protocol]:
    """The protocol class for uvicorn's ``http=``, after lifting the descriptor limit."""
    limit = raise_descriptor_limit()
    cap = connection_cap(settings.max_connections, limit)
    log.info(
        "http.connection_guard",
        max_connections=cap,
        nofile=limit,
        header_timeout_s=settings.header_timeout_s,
    )
    guard = ConnectionGuard(max_connections=cap, header_timeout_s=settings.header_timeout_s)
    return guard.protocol()


class ConnectionGuard:
    """The shared bookkeeping: who is open, and who is still sending headers (oldest first)."""

    def __init__(self, *, max_connections: int, header_timeout_s: float) -> None:
        self.max_connections = max_connections
        self.header_timeout_s = header_timeout_s
        self.open: set[GuardedH11Protocol] = set()
        # A dict keeps insertion order: the first key is the longest waiter.
        self.awaiting_headers: dict[GuardedH11Protocol, None] = {}
        self.evicted = 0
        self.timed_out = 0
        self.refused = 0

    def protocol(self) -> type[GuardedH11Protocol]:
        """The class to give uvicorn as ``http=``, bound to this guard."""
        return type("BoundGuardedH11Protocol", (GuardedH11Protocol,), {"guard": self})

    def admit(self, conn: GuardedH11Protocol) -> bool:
        if len(self.open) >= self.max_connections:
            if not self.awaiting_headers:
                self.refused += 1
                log.warning("http.connection_refused", open=len(self.open))
                return False
            oldest = next(iter(self.awaiting_headers))
            self.evicted += 1
            if self.evicted % 100 == 1:
                log.warning("http.slow_client_evicted", open=len(self.open), total=self.evicted)
            oldest.drop()
        self.open.add(conn)
        return True


class GuardedH11Protocol(H11Protocol):
    """uvicorn's h11 protocol with a header deadline and a connection cap."""

    guard: ClassVar[ConnectionGuard]

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._header_timer: asyncio.TimerHandle | None = None

    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        if not self.guard.admit(self):
            transport.abort()
            return
        super().connection_made(transport)
        self._await_headers()

    def data_received(self, data: bytes) -> None:
        super().data_received(data)
        if self.conn.their_state is h11.IDLE and not self.transport.is_closing():
            # Waiting for (the rest of) a request line and headers.
            if self._header_timer is None:
                self._await_headers()
        else:
            self._headers_done()

    def on_response_complete(self) -> None:
        super().on_response_complete()
        # Kept alive and idle: uvicorn's keep-alive timeout covers the wait for the next
        # request's first byte; data_received restarts the header deadline with it.
        self._headers_done()

    def connection_lost(self, exc: Exception | None) -> None:
        self._headers_done()
        self.guard.open.discard(self)
        if self.transport is not None:
            super().connection_lost(exc)

    def _await_headers(self) -> None:
        self.guard.awaiting_headers[self] = None
        self._header_timer = self.loop.call_later(
            self.guard.header_timeout_s, self._headers_too_slow
        )

    def _headers_done(self) -> None:
        self.guard.awaiting_headers.pop(self, None)
        if self._header_timer is not None:
            self._header_timer.cancel()
            self._header_timer = None

    def _headers_too_slow(self) -> None:
        self._header_timer = None
        self.guard.timed_out += 1
        self.drop()

    def drop(self) -> None:
        """Close without a response: the client never finished asking."""
        self._headers_done()
        self.guard.open.discard(self)
        if not self.transport.is_closing():
            self.transport.abort()
