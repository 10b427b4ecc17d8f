"""The "sandbox ready" hand-over between server processes: PostgreSQL LISTEN/NOTIFY.

The process that hands a slot over announces the key's hash on one channel;
every process listens, and the one holding that key's e-mail address (in its
memory, since the button was pressed there) sends the message. Nothing of the
address and nothing of the key itself crosses the database. A notification to
a process that is down is lost, and with it that one message: the address was
only ever in that process's memory. SQLite serves one process and needs none.
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


def asyncpg_dsn(database_url: str) -> str:
    """The plain ``postgresql://`` DSN asyncpg takes, from the SQLAlchemy URL."""
    return make_url(database_url).set(drivername="postgresql").render_as_string(hide_password=False)


class PgReadyRelay:
    def __init__(self, dsn: str) -> None:
        self._dsn = dsn
        self._connection: asyncpg.Connection | None = None
        self._on_ready: Callable[[str], Awaitable[None]] | None = None
        self._lock = asyncio.Lock()  # one asyncpg connection runs one query at a time
        self._tasks: set[asyncio.Task[None]] = set()
        self._closed = False

    async def open(self, on_ready: Callable[[str], Awaitable[None]]) -> None:
        """Listen from now on; if the database does not answer, keep trying in the
        background (the server starts all the same: only e-mails wait on this)."""
        self._on_ready = on_ready
        try:
            await self._connect()
        except (OSError, asyncpg.PostgresError) as exc:
            log.warning("mail.relay_unavailable", error=type(exc).__name__)
            self._spawn(self._reconnect())

    async def _connect(self) -> None:
        connection = await asyncpg.connect(self._dsn)
        await connection.add_listener(CHANNEL, self._notified)
        connection.add_termination_listener(self._lost)
        self._connection = connection

    def _notified(self, _conn: object, _pid: int, _channel: str, payload: object) -> None:
        if self._on_ready is not None and isinstance(payload, str):
            self._spawn(self._on_ready(payload))

    def _lost(self, _conn: object) -> None:
        self._connection = None
        if not self._closed:
            log.warning("mail.relay_lost")
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
                log.info("mail.relay_reconnected")
            except (OSError, asyncpg.PostgresError):
                continue

    async def announce(self, key_hash: str) -> None:
        async with self._lock:
            connection = self._connection
            if connection is None:
                log.warning("mail.relay_unavailable")
                return
            try:
                await connection.execute("SELECT pg_notify($1, $2)", CHANNEL, key_hash)
            except (OSError, asyncpg.PostgresError) as exc:
                log.warning("mail.relay_failed", error=type(exc).__name__)

    async def close(self) -> None:
        self._closed = True
        for task in list(self._tasks):
            task.cancel()
        if self._connection is not None:
            with contextlib.suppress(OSError, asyncpg.PostgresError):
                await self._connection.close()
            self._connection = None
