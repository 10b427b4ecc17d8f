"""The database: SQLAlchemy 2 models and the repository that is the audit trail.

SQLite (aiosqlite, WAL, foreign keys on) by default; PostgreSQL (asyncpg) by URL.
The schema is owned by Alembic (``app/storage/migrations``) and upgraded at start-up.
Never stored here: token values, e-mail addresses, environment variable values.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import AbstractAsyncContextManager, asynccontextmanager
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import sqlalchemy as sa
import structlog
from sqlalchemy import event
from sqlalchemy.engine import Connection
from sqlalchemy.exc import SQLAlchemyError
from sqlalchemy.ext.asyncio import (
    AsyncEngine,
    AsyncSession,
    async_sessionmaker,
    create_async_engine,
)
from sqlalchemy.orm import DeclarativeBase, Mapped, mapped_column

from app.errors import DatabaseUnavailable
from app.storage.schema_head import at_head

log = structlog.get_logger(__name__)

MIGRATIONS = Path(__file__).with_name("migrations")


class Base(DeclarativeBase):
    pass


class ToolCall(Base):
    """One MCP tool call: who (sandbox key), what, how long, how it ended."""

    __tablename__ = "tool_calls"

    id: Mapped[int] = mapped_column(primary_key=True, autoincrement=True)
    request_id: Mapped[str] = mapped_column(sa.String(64), index=True)
    sandbox_key: Mapped[str] = mapped_column(sa.String(128), index=True)
    tool: Mapped[str] = mapped_column(sa.String(64))
    started_at: Mapped[datetime] = mapped_column(sa.DateTime(timezone=True))
    duration_ms: Mapped[float] = mapped_column(sa.Float)
    outcome: Mapped[str] = mapped_column(sa.String(64))  # "ok" or a stable error code
    # How many calls the row stands for: more than one for a count of calls not written
    # one by one (app/mcp/call_sampling.py), then started_at opens their window.
    calls: Mapped[int] = mapped_column(sa.Integer, default=1, server_default="1")


class AuditDay(Base):
    """How many of a day's audit rows the server processes together have reserved for
    one owner (``s:`` and a sandbox key, or ``a:`` and a sign-in address), handed out
    in blocks (app/storage/audit_day_store.py)."""

    __tablename__ = "audit_days"

    owner: Mapped[str] = mapped_column(sa.String(200), primary_key=True)
    day: Mapped[int] = mapped_column(sa.Integer, primary_key=True)  # UTC days since 1970
    granted: Mapped[int] = mapped_column(sa.Integer)


def create_engine(url: str, *, connections: int = 15) -> AsyncEngine:
    """An async engine of at most ``connections`` connections (all kept on PostgreSQL);
    SQLite gets WAL, foreign keys and a busy timeout on every connection."""
    if url.startswith("sqlite"):
        # SQLAlchemy's own split for 15 (5 kept, the rest closed at check-in).
        kept = min(connections, 5)
        engine = create_async_engine(
            url, connect_args={"timeout": 30}, pool_size=kept, max_overflow=connections - kept
        )
        event.listen(engine.sync_engine, "connect", _sqlite_pragmas)
        return engine
    # At most 15 connections per process, as SQLAlchemy's default (5 + 10 overflow), but
    # all kept: overflow connections were closed at check-in, so 16 concurrent light
    # calls opened a new PostgreSQL connection for most statements (a profile: a third
    # of the process's CPU in asyncpg's connect; bench_workers.py).
    return create_async_engine(url, pool_pre_ping=True, pool_size=connections, max_overflow=0)


def upsert_insert(dialect: str) -> Any:
    """The ``insert`` with ``ON CONFLICT`` of ``dialect`` (both dialects we run on have it)."""
    if dialect == "postgresql":
        # Imported here: the dialect (and asyncpg) cost a SQLite server's start.
        from sqlalchemy.dialects import postgresql

        return postgresql.insert
    from sqlalchemy.dialects import sqlite

    return sqlite.insert


def _sqlite_pragmas(dbapi_connection: Any, _record: Any) -> None:
    cursor = dbapi_connection.cursor()
    # WAL lets the health probe and readers proceed while a writer commits.
    cursor.execute("PRAGMA journal_mode=WAL")
    cursor.execute("PRAGMA foreign_keys=ON")
    cursor.execute("PRAGMA synchronous=NORMAL")
    cursor.close()


async def upgrade_schema(engine: AsyncEngine) -> None:
    """Bring the schema to Alembic's head revision.

    Raises:
        DatabaseUnavailable: the database cannot be reached or migrated.
    """
    try:
        async with engine.begin() as connection:
            await connection.run_sync(_upgrade)
    except (SQLAlchemyError, OSError) as exc:
        raise DatabaseUnavailable(describe_db_error(exc)) from exc


MIGRATION_LOCK = 0x534D434D  # "SMCM": processes starting together migrate one at a time


def _upgrade(connection: Connection) -> None:
    if connection.dialect.name == "postgresql":
        # Several processes starting at once (serve --workers, one unit per process)
        # would otherwise race to create the same tables; the others then find the head.
        connection.execute(sa.text("SELECT pg_advisory_xact_lock(:lock)"), {"lock": MIGRATION_LOCK})
    if at_head(connection, MIGRATIONS / "versions"):
        return  # nothing to do: spare the start-up Alembic's import
    from alembic import command
    from alembic.config import Config

    config = Config()
    config.set_main_option("script_location", str(MIGRATIONS))
    config.attributes["connection"] = connection
    command.upgrade(config, "head")


def describe_db_error(exc: BaseException) -> str:
    # The first line of the driver's message, without the SQL or the URL.
    original = getattr(exc, "orig", None) or exc
    return str(original).splitlines()[0][:200] if str(original) else type(original).__name__


@asynccontextmanager
async def transaction(
    sessions: async_sessionmaker[AsyncSession],
) -> AsyncIterator[AsyncSession]:
    """One committed transaction; driver and connection errors become DatabaseUnavailable."""
    try:
        async with sessions.begin() as session:
            yield session
    except (SQLAlchemyError, OSError) as exc:
        raise DatabaseUnavailable(describe_db_error(exc)) from exc


class Store:
    """Base of a store of records: each of its calls is one committed transaction."""

    def __init__(self, engine: AsyncEngine) -> None:
        self._sessions = async_sessionmaker(engine, expire_on_commit=False)

    def _transaction(self) -> AbstractAsyncContextManager[AsyncSession]:
        return transaction(self._sessions)


class Repository:
    """All reads and writes of the service's records."""

    def __init__(self, engine: AsyncEngine) -> None:
        self._engine = engine
        self._sessions = async_sessionmaker(engine, expire_on_commit=False)

    @property
    def engine(self) -> AsyncEngine:
        return self._engine

    async def ping(self) -> None:
        """Check the database answers.

        Raises:
            DatabaseUnavailable: it does not.
        """
        try:
            async with self._engine.connect() as connection:
                await connection.execute(sa.text("SELECT 1"))
        except (SQLAlchemyError, OSError) as exc:
            raise DatabaseUnavailable(describe_db_error(exc)) from exc

    async def forget_tool_calls_before(self, cutoff: float) -> int:
        """Delete audit rows of calls started before ``cutoff``; how many went."""
        async with transaction(self._sessions) as session:
            result = await session.execute(
                sa.delete(ToolCall).where(ToolCall.started_at < datetime.fromtimestamp(cutoff, UTC))
            )
            # The days' reservations go with them (one small row per sandbox and day).
            await session.execute(sa.delete(AuditDay).where(AuditDay.day < int(cutoff // 86_400)))
            return int(getattr(result, "rowcount", 0) or 0)

    async def tool_calls(self, sandbox_key: str) -> list[ToolCall]:
        """The audit rows of one sandbox key, oldest first."""
        async with self._sessions() as session:
            rows = await session.scalars(
                sa.select(ToolCall).where(ToolCall.sandbox_key == sandbox_key).order_by(ToolCall.id)
            )
            return list(rows)
