"""News between server processes: a PostgreSQL LISTEN/NOTIFY channel (``PgChannel``).

Two channels use it. The "sandbox ready" hand-over (``ready_relay``): the
process that hands a slot over announces the key's hash; every process listens,
and the one holding that key's e-mail address (in its memory, since the button
was pressed there) sends the message. Nothing of the address and nothing of the
key itself crosses the database. A notification to a process that is down is
lost, and with it that one message: the address was only ever in that process's
memory. And revocations (``app.root.oauth``): each process drops what it
cached of a revoked token. SQLite serves one process and needs neither.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Awaitable, Callable

import asyncpg
import structlog
from sqlalchemy.engine import make_url

log = structlog.get_logger(__name__)

CHANNEL = "sandbox_mcp_ready"
_RECONNECT_S = 2.0
Listening = Callable[[bool], None]


def asyncpg_dsn(database_url: str) -> str:
    """The plain ``postgresql://`` DSN asyncpg takes, from the SQLAlchemy URL."""
    return make_url(database_url).set(drivername="postgresql").render_as_string(hide_password=False)


def ready_relay(dsn: str) -> PgChannel:
    return PgChannel(dsn, CHANNEL, name="mail.relay")


class PgChannel:
    """One channel: ``announce`` reaches every process that ``open``-ed it, itself too.

    ``name`` prefixes the log events (``mail.relay_lost``, ...)."""

    def __init__(self, dsn: str, channel: str, *, name: str) -> None:
        self._dsn = dsn
        self._channel = channel
        self._name = name
        self._connection: asyncpg.Connection | None = None
        self._on_ready: Callable[[str], Awaitable[None]] | None = None
        self._on_listening: Listening | None = None
        self._lock = asyncio.Lock()  # one asyncpg connection runs one query at a time
        self._tasks: set[asyncio.Task[None]] = set()
        self._closed = False

    async def open(
        self, on_ready: Callable[[str], Awaitable[None]], on_listening: Listening | None = None
    ) -> None:
        """Listen from now on; if the database does not answer, keep trying in the
        background (the server starts all the same: only what waits on news waits).
        ``on_listening`` hears True once notifications arrive, False when they may
        be missed (the connection is lost) until the next True."""
        self._on_ready = on_ready
        self._on_listening = on_listening
        try:
            await self._connect()
        except (OSError, asyncpg.PostgresError) as exc:
            log.warning(f"{self._name}_unavailable", error=type(exc).__name__)
            self._spawn(self._reconnect())

    async def _connect(self) -> None:
        connection = await asyncpg.connect(self._dsn)
        await connection.add_listener(self._channel, self._notified)
        connection.add_termination_listener(self._lost)
        self._connection = connection
        if self._on_listening is not None:
            self._on_listening(True)

    def _notified(self, _conn: object, _pid: int, _channel: str, payload: object) -> None:
        if self._on_ready is not None and isinstance(payload, str):
            self._spawn(self._on_ready(payload))

    def _lost(self, _conn: object) -> None:
        self._connection = None
        if self._on_listening is not None:
            self._on_listening(False)
        if not self._closed:
            log.warning(f"{self._name}_lost")
            self._spawn(self._reconnect())

    def _spawn(self, work: Awaitable[None]) -> None:
        task = asyncio.ensure_future(work)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def _reconnect(self) -> None:
        while not self._closed and self._connection is None:
            await asyncio.sleep(_RECONNECT_S)
            try:
                await self._connect()
                log.info(f"{self._name}_reconnected")
            except (OSError, asyncpg.PostgresError):
                continue

    async def announce(self, payload: str) -> None:
        async with self._lock:
            connection = self._connection
            if connection is None:
                log.warning(f"{self._name}_unavailable")
                return
            try:
                await connection.execute("SELECT pg_notify($1, $2)", self._channel, payload)
            except (OSError, asyncpg.PostgresError) as exc:
                log.warning(f"{self._name}_failed", error=type(exc).__name__)

    async def close(self) -> None:
        self._closed = True
        for task in list(self._tasks):
            task.cancel()
        if self._connection is not None:
            with contextlib.suppress(OSError, asyncpg.PostgresError):
                await self._connection.close()
            self._connection = None
