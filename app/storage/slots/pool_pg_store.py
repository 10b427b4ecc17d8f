"""The pool shared by several server processes on one PostgreSQL.

- ``PgPoolState``: every pool change is one transaction holding a
  transaction-level advisory lock, so changes from all processes run one at a
  time, each from the state it reads under that lock (``FOR UPDATE SKIP LOCKED``
  alone would keep leases unique but let a later caller overtake the queue).
  Reservations are announced with ``NOTIFY`` at commit; each process ``LISTEN``s
  on its own connection and wakes its waiters at once (the bounded re-poll of the
  waiting call stays the fallback if a notification is lost).
- ``PgLeadership``: one process at a time runs the idle watchdog, the one
  holding a session-level advisory lock on a connection of its own. When that
  process dies its connection drops, PostgreSQL frees the lock, and another
  process takes it on its next tick.

SQLite stays the embedded single-process store (``SqlPoolState`` alone).
"""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import sqlalchemy as sa
import structlog
from sqlalchemy.engine import make_url
from sqlalchemy.exc import SQLAlchemyError
from sqlalchemy.ext.asyncio import AsyncEngine, AsyncSession

from app.errors import DatabaseUnavailable
from app.storage.db import describe_db_error, transaction
from app.storage.slots.pool_store import SqlPoolState
from pool.leases import label_of
from pool.state import PoolChanges, PoolSnapshot, PoolState
from pool.watchdog import Leadership, SoleWatchdog

if TYPE_CHECKING:
    import asyncpg

# asyncpg is imported where it is used: only PostgreSQL needs it, and a SQLite
# server's start (to its first /health) is shorter without it.

log = structlog.get_logger(__name__)

# Advisory locks take two 32-bit keys: ours all share the first one.
LOCK_SPACE = 0x534D4350  # "SMCP"
POOL_LOCK = 1  # every pool change, transaction-level
WATCHDOG_LOCK = 2  # the elected watchdog, session-level
EGRESS_LOCK = 3  # the process running network "restricted"'s Squid, session-level
SLOT_RESET_SPACE = 0x534D4352  # (space, slot index): the process emptying that slot
CHANNEL = "sandbox_mcp_pool"


def is_postgresql(engine: AsyncEngine) -> bool:
    return engine.dialect.name == "postgresql"


def asyncpg_dsn(engine: AsyncEngine) -> str:
    """The engine's URL as asyncpg itself takes it (for the dedicated connections)."""
    url = make_url(engine.url).set(drivername="postgresql")
    return url.render_as_string(hide_password=False)


def pool_state_for(engine: AsyncEngine) -> PoolState:
    """The shared pool state on PostgreSQL, the embedded one on SQLite."""
    return PgPoolState(engine) if is_postgresql(engine) else SqlPoolState(engine)


@dataclass
class _PgTransaction:
    session: AsyncSession
    snapshot: PoolSnapshot
    state: PgPoolState
    order: object = None
    announced: list[str] = field(default_factory=list)

    async def apply(self, changes: PoolChanges) -> None:
        await self.state._apply(self.session, changes)

    def announce(self, keys: list[str]) -> None:
        self.announced += [label_of(key) for key in keys]


class PgPoolState(SqlPoolState):
    """``SqlPoolState`` shared by processes (see the module docstring)."""

    def __init__(self, engine: AsyncEngine) -> None:
        super().__init__(engine)
        self._listener: asyncpg.Connection | None = None
        self._on_reserved: Callable[[str], None] | None = None

    @contextlib.asynccontextmanager
    async def exclusive(self) -> AsyncIterator[_PgTransaction]:
        async with transaction(self._sessions) as session:
            await session.execute(
                sa.text("SELECT pg_advisory_xact_lock(:space, :lock)"),
                {"space": LOCK_SPACE, "lock": POOL_LOCK},
            )
            tx = _PgTransaction(session, await self._read(session), self)
            yield tx
            for label in tx.announced:  # delivered by PostgreSQL when this commits
                await session.execute(
                    sa.text("SELECT pg_notify(:channel, :label)"),
                    {"channel": CHANNEL, "label": label},
                )
            # Transaction ids are handed out at the first write, which happens under
            # the lock: their order is the order of the pool's changes.
            order = await session.scalar(sa.text("SELECT pg_current_xact_id_if_assigned()::text"))
            tx.order = None if order is None else int(order)

    @contextlib.asynccontextmanager
    async def claim_reset(self, index: int) -> AsyncIterator[bool]:
        try:
            async with self._engine.connect() as connection:
                claimed = bool(
                    await connection.scalar(
                        sa.text("SELECT pg_try_advisory_lock(:space, :slot)"),
                        {"space": SLOT_RESET_SPACE, "slot": index},
                    )
                )
                await connection.commit()  # the lock is the session's: no transaction left open
                try:
                    yield claimed
                finally:
                    if claimed:
                        await connection.execute(
                            sa.text("SELECT pg_advisory_unlock(:space, :slot)"),
                            {"space": SLOT_RESET_SPACE, "slot": index},
                        )
                        await connection.commit()
        except (SQLAlchemyError, OSError) as exc:
            raise DatabaseUnavailable(describe_db_error(exc)) from exc

    async def listen(self, on_reserved: Callable[[str], None]) -> None:
        self._on_reserved = on_reserved
        await self.keep_listening()

    async def keep_listening(self) -> None:
        """(Re)open the listening connection; a lost one only slows wake-ups to the re-poll."""
        import asyncpg

        if self._on_reserved is None or (
            self._listener is not None and not self._listener.is_closed()
        ):
            return
        heard = self._on_reserved
        try:
            self._listener = await asyncpg.connect(asyncpg_dsn(self._engine))
            await self._listener.add_listener(
                CHANNEL, lambda _conn, _pid, _channel, label: heard(label)
            )
        except (OSError, asyncpg.PostgresError) as exc:
            log.warning("pool.listen_failed", reason=describe_db_error(exc))
            self._listener = None

    async def close(self) -> None:
        import asyncpg

        if self._listener is not None:
            with contextlib.suppress(OSError, asyncpg.PostgresError):
                await self._listener.close()
            self._listener = None


class PgLeadership:
    """Whether this process is the one running the watchdog: a PostgreSQL advisory lock
    held on its own connection (see the module docstring)."""

    def __init__(
        self, engine: AsyncEngine, key: int = WATCHDOG_LOCK, role: str = "watchdog"
    ) -> None:
        self._dsn = asyncpg_dsn(engine)
        self._key, self._role = key, role  # which election, and its log lines' name
        self._connection: asyncpg.Connection | None = None
        self._leading = False

    async def is_leader(self) -> bool:
        import asyncpg

        try:
            if self._connection is None or self._connection.is_closed():
                self._connection, self._leading = await asyncpg.connect(self._dsn), False
            if self._leading:
                await self._connection.fetchval("SELECT 1")  # still ours while it answers
                return True
            self._leading = bool(
                await self._connection.fetchval(
                    "SELECT pg_try_advisory_lock($1, $2)", LOCK_SPACE, self._key
                )
            )
            if self._leading:
                log.info(f"{self._role}.elected")
            return self._leading
        except (OSError, asyncpg.PostgresError) as exc:
            log.warning(f"{self._role}.election_failed", reason=describe_db_error(exc))
            await self.close()
            return False

    async def close(self) -> None:
        import asyncpg

        connection, self._connection, self._leading = self._connection, None, False
        if connection is not None:
            with contextlib.suppress(OSError, asyncpg.PostgresError):
                await connection.close()


def leadership_for(
    engine: AsyncEngine, key: int = WATCHDOG_LOCK, role: str = "watchdog"
) -> Leadership:
    """The elected watchdog (or, with ``key``, another role) on PostgreSQL; alone on
    SQLite, this process always leads."""
    return PgLeadership(engine, key, role) if is_postgresql(engine) else SoleWatchdog()
