"""The audit trail of tool calls, written in group commits.

One commit per call made the database the ceiling of every light call (a profile:
more than half of the process's time in SQLite's connection thread). Here calls that
finish together share one transaction: each caller still returns only once its own
row is committed (so no answered call lacks its row, kill -9 included), but while
one commit is in flight every row that arrives waits for the next, and goes in it.

At a light call's pace a commit carries one or two rows, so what a commit costs the
event loop is what a call costs. Through the engine that was a pool checkout, four
trips to aiosqlite's thread (cursor, insert, commit, reset) and SQLAlchemy's
statement machinery: about 200 us of the loop's time per call. On a SQLite file the
writer therefore keeps a connection of its own on a thread of its own and hands it
each batch as plain tuples: one trip does ``BEGIN IMMEDIATE``, one ``executemany``
and ``COMMIT``, the GIL released while SQLite works. Other databases (PostgreSQL)
keep the engine's pooled, pre-pinged connections and SQLAlchemy Core's executemany.
"""

from __future__ import annotations

import asyncio
import sqlite3
import time
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from datetime import UTC, datetime
from typing import Any, Protocol

import sqlalchemy as sa
from sqlalchemy.exc import SQLAlchemyError
from sqlalchemy.ext.asyncio import AsyncEngine

from app.errors import DatabaseUnavailable
from app.storage.db import ToolCall, describe_db_error

MAX_BATCH = 1_000

# A row as the writer hands it over: request_id, sandbox_key, tool, started_at,
# duration_ms, outcome (the columns' order in the INSERT below).
Values = tuple[str, str, str, datetime, float, str]
COLUMNS = ("request_id", "sandbox_key", "tool", "started_at", "duration_ms", "outcome")


class _Sink(Protocol):
    async def write(self, rows: Sequence[Values]) -> None:
        """Commit ``rows`` in one transaction; raises DatabaseUnavailable."""

    async def close(self) -> None: ...


class _EngineSink:
    """Through the engine's pool (PostgreSQL): one Core ``executemany`` per batch."""

    def __init__(self, engine: AsyncEngine) -> None:
        self._engine = engine
        self._insert = sa.insert(ToolCall)

    async def write(self, rows: Sequence[Values]) -> None:
        try:
            async with self._engine.begin() as connection:
                values = [dict(zip(COLUMNS, row, strict=True)) for row in rows]
                await connection.execute(self._insert, values)
        except (SQLAlchemyError, OSError) as exc:
            raise DatabaseUnavailable(describe_db_error(exc)) from exc

    async def close(self) -> None:
        return None


class _SqliteSink:
    """A SQLite file through a connection and a thread of the writer's own.

    The same file, pragmas and busy timeout as the engine's connections; values go
    through the columns' own SQLAlchemy bind processors, so a row reads back exactly
    as one the ORM wrote.
    """

    def __init__(self, engine: AsyncEngine, path: str) -> None:
        self._path = path
        self._thread = ThreadPoolExecutor(max_workers=1, thread_name_prefix="audit-sqlite")
        self._connection: sqlite3.Connection | None = None
        dialect = engine.dialect
        self._convert: list[Callable[[Any], Any] | None] = [
            ToolCall.__table__.c[name].type.dialect_impl(dialect).bind_processor(dialect)
            for name in COLUMNS
        ]
        insert = sa.insert(ToolCall).compile(dialect=dialect, column_keys=[*COLUMNS])
        if insert.positiontup != [*COLUMNS]:  # qmark parameters, in the tuples' order
            raise RuntimeError(f"unexpected INSERT parameters: {insert.positiontup}")
        self._sql = str(insert)

    async def write(self, rows: Sequence[Values]) -> None:
        convert = self._convert
        params = [
            tuple(v if fn is None else fn(v) for fn, v in zip(convert, row, strict=True))
            for row in rows
        ]
        loop = asyncio.get_running_loop()
        try:
            await loop.run_in_executor(self._thread, self._commit, params)
        except sqlite3.Error as exc:
            raise DatabaseUnavailable(describe_db_error(exc)) from exc

    def _commit(self, params: list[tuple[Any, ...]]) -> None:
        """On the writer's thread: the whole batch in one transaction."""
        connection = self._connection
        if connection is None:
            connection = self._connection = self._open()
        try:
            connection.execute("BEGIN IMMEDIATE")
            connection.executemany(self._sql, params)
            connection.execute("COMMIT")
        except sqlite3.Error:
            # A connection in an unknown state is not reused: the next batch opens anew.
            self._connection = None
            connection.close()
            raise

    def _open(self) -> sqlite3.Connection:
        # Autocommit mode: the transaction is the explicit BEGIN/COMMIT above.
        connection = sqlite3.connect(self._path, timeout=30, isolation_level=None)
        connection.execute("PRAGMA journal_mode=WAL")
        connection.execute("PRAGMA synchronous=NORMAL")
        return connection

    async def close(self) -> None:
        def shut() -> None:
            if self._connection is not None:
                self._connection.close()
                self._connection = None

        await asyncio.get_running_loop().run_in_executor(self._thread, shut)
        self._thread.shutdown(wait=False)


def _sink_for(engine: AsyncEngine) -> _Sink:
    url = engine.url
    path = url.database
    if url.get_backend_name() == "sqlite" and path and path != ":memory:" and not url.query:
        return _SqliteSink(engine, path)
    # In-memory or URI-style SQLite (another connection would not see the same
    # database), and every server database.
    return _EngineSink(engine)


class AuditTrail:
    def __init__(self, engine: AsyncEngine) -> None:
        self._sink = _sink_for(engine)
        # (values, started) pairs waiting for the next commit, each with its caller's future.
        self._waiting: list[tuple[str, str, str, float, str, asyncio.Future[None]]] = []
        self._writer: asyncio.Task[None] | None = None

    async def record(
        self, *, request_id: str, sandbox_key: str, tool: str, started: float, outcome: str
    ) -> None:
        """Append one row (``started`` is a ``time.time()`` value); returns once committed.

        Raises:
            DatabaseUnavailable: the commit that carried this row failed.
        """
        done: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self._waiting.append((request_id, sandbox_key, tool, started, outcome, done))
        if self._writer is None or self._writer.done():
            self._writer = asyncio.create_task(self._write(), name="audit-writer")
        # Not shielded, and need not be: a caller that goes away cancels only its own
        # future; its row stays in the batch and the writer task runs on.
        await done

    async def _write(self) -> None:
        while self._waiting:
            batch, self._waiting = self._waiting[:MAX_BATCH], self._waiting[MAX_BATCH:]
            now = time.time()
            rows: list[Values] = [
                (
                    request_id,
                    sandbox_key,
                    tool,
                    datetime.fromtimestamp(started, UTC),
                    round((now - started) * 1000, 3),
                    outcome,
                )
                for request_id, sandbox_key, tool, started, outcome, _ in batch
            ]
            try:
                await self._sink.write(rows)
            except DatabaseUnavailable as failure:
                for *_, done in batch:
                    if not done.done():
                        done.set_exception(failure)
                continue
            for *_, done in batch:
                if not done.done():
                    done.set_result(None)

    async def close(self) -> None:
        """Wait for the rows already handed over to be written (at shutdown)."""
        if self._writer is not None:
            await asyncio.gather(self._writer, return_exceptions=True)
        await self._sink.close()
