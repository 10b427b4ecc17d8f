"""Keep slow or idle clients from holding every file descriptor (slowloris).

uvicorn has no deadline for a request's headers: a connection that sends
``GET / HTTP/1.1\\r\\n`` and then nothing stays open for ever, and ~1,000 of
them exhaust a 1,024-descriptor limit, after which nothing (not even
``/health``) is accepted. This guard wraps uvicorn's h11 protocol:

- a client gets ``header_timeout_s`` from connecting (or, on a kept-alive
  connection, from its first byte of the next request) to finish the request
  line and headers, then ``body_timeout_s`` for the body; past either the
  connection is closed without an answer;
- at most ``max_connections`` are open; a connection past that first closes
  the oldest one still sending its headers (a real client sends them in
  milliseconds, so that one is the likeliest to be an attacker), else the
  oldest one still sending a body, and is closed itself only when every open
  connection has sent its whole request.

:func:`raise_descriptor_limit` lifts the soft RLIMIT_NOFILE to the hard one at
start-up, and :func:`connection_cap` keeps the cap below what the process may
open, with room for the database, Docker and files.
"""

from __future__ import annotations

import asyncio
import resource
import time
from collections.abc import Callable
from typing import Any, ClassVar, Literal

import h11
import structlog
from uvicorn.protocols.http.h11_impl import H11Protocol

from app.sampling import ThrottledLog

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


def guard_for(
    *, max_connections: int, header_timeout_s: float, body_timeout_s: float
) -> type[GuardedH11Protocol]:
    """The protocol class for uvicorn's ``http=``, after lifting the descriptor limit."""
    limit = raise_descriptor_limit()
    cap = connection_cap(max_connections, limit)
    log.info(
        "http.connection_guard",
        max_connections=cap,
        nofile=limit,
        header_timeout_s=header_timeout_s,
        body_timeout_s=body_timeout_s,
    )
    guard = ConnectionGuard(
        max_connections=cap,
        header_timeout_s=header_timeout_s,
        body_timeout_s=body_timeout_s,
    )
    return guard.protocol()


Phase = Literal["headers", "body"]


class ConnectionGuard:
    """The shared bookkeeping: who is open, and who is still sending a request (oldest first)."""

    def __init__(
        self,
        *,
        max_connections: int,
        header_timeout_s: float,
        body_timeout_s: float,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self.max_connections = max_connections
        self.timeouts: dict[Phase, float] = {"headers": header_timeout_s, "body": body_timeout_s}
        self.open: set[GuardedH11Protocol] = set()
        # Dicts keep insertion order: the first key is the longest waiter. Those
        # still sending headers go first; a body in progress only when none is.
        self.sending: dict[Phase, dict[GuardedH11Protocol, None]] = {"headers": {}, "body": {}}
        self.evicted = 0
        # Anyone may open connections past the cap, before any sign-in: each refusal
        # written would be a line per connection in the log every tenant shares.
        self._refusals = ThrottledLog(log, clock=clock)

    def protocol(self) -> type[GuardedH11Protocol]:
        """The class to give uvicorn as ``http=``, bound to this guard."""
        return type("BoundGuardedH11Protocol", (GuardedH11Protocol,), {"guard": self})

    def admit(self, conn: GuardedH11Protocol) -> bool:
        if len(self.open) >= self.max_connections:
            waiting = self.sending["headers"] or self.sending["body"]
            if not waiting:
                self._refusals.warning("http.connection_refused", open=len(self.open))
                return False
            self.evicted += 1
            if self.evicted % 100 == 1:
                log.warning("http.slow_client_evicted", open=len(self.open), total=self.evicted)
            next(iter(waiting)).drop()
        self.open.add(conn)
        return True


class GuardedH11Protocol(H11Protocol):
    """uvicorn's h11 protocol with request deadlines and a connection cap."""

    guard: ClassVar[ConnectionGuard]

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._phase: Phase | None = None
        self._deadline: asyncio.TimerHandle | None = None

    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        if not self.guard.admit(self):
            transport.abort()
            return
        super().connection_made(transport)
        self._enter("headers")

    def data_received(self, data: bytes) -> None:
        super().data_received(data)
        if self.transport.is_closing():
            self._enter(None)
        elif self.conn.their_state is h11.IDLE:
            self._enter("headers")  # (the rest of) a request line and headers
        elif self.conn.their_state is h11.SEND_BODY:
            self._enter("body")
        else:
            self._enter(None)  # the whole request is in: the app's time is not the client's

    def on_response_complete(self) -> None:
        super().on_response_complete()
        # Kept alive and idle: uvicorn's keep-alive timeout covers the wait for the next
        # request's first byte; data_received starts the header deadline with it.
        self._enter(None)

    def connection_lost(self, exc: Exception | None) -> None:
        self._enter(None)
        self.guard.open.discard(self)
        if self.transport is not None:  # None: refused in connection_made
            super().connection_lost(exc)

    def _enter(self, phase: Phase | None) -> None:
        """Start ``phase``'s deadline, unless it is already running."""
        if phase == self._phase:
            return
        if self._phase is not None:
            self.guard.sending[self._phase].pop(self, None)
        if self._deadline is not None:
            self._deadline.cancel()
            self._deadline = None
        self._phase = phase
        if phase is not None:
            self.guard.sending[phase][self] = None
            self._deadline = self.loop.call_later(self.guard.timeouts[phase], self.drop)

    def drop(self) -> None:
        """Close without a response: the client did not finish its request in time."""
        self._enter(None)
        self.guard.open.discard(self)
        if not self.transport.is_closing():
            self.transport.abort()
