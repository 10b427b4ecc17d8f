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
writer therefore keeps a connection of its own and writes each batch as plain tuples,
one multi-row ``INSERT`` (its own transaction), on a thread of its own (see
``_SqliteSink``; never on the loop: a disk that another tenant's writes throttle
would then hold every call).
PostgreSQL keeps the engine's pooled, pre-pinged connections and sends each batch as
one statement on asyncpg's connection (``_PostgresSink``).
"""

from __future__ import annotations

import asyncio
import contextlib
import queue
import sqlite3
import threading
import time
from collections.abc import Callable, Sequence
from datetime import UTC, datetime
from typing import Any, Protocol

import sqlalchemy as sa
from sqlalchemy.exc import SQLAlchemyError
from sqlalchemy.ext.asyncio import AsyncEngine

from app.errors import DatabaseUnavailable
from app.storage.db import ToolCall, describe_db_error

MAX_BATCH = 1_000

# A row as the writer hands it over: request_id, sandbox_key, tool, started_at,
# duration_ms, outcome, calls (the columns' order in the INSERT below).
Values = tuple[str, str, str, datetime, float, str, int]
COLUMNS = ("request_id", "sandbox_key", "tool", "started_at", "duration_ms", "outcome", "calls")


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


class _PostgresSink:
    """PostgreSQL through asyncpg: one statement per batch, on a pooled connection.

    Through SQLAlchemy a batch was ``BEGIN``, an ``executemany`` and ``COMMIT``: three
    round trips and Core's statement machinery for a row or two. Here the batch is one
    ``INSERT ... SELECT FROM unnest(...)`` of one array per column, sent on the
    driver's connection outside any transaction: one statement is one transaction,
    all its rows or none, and one prepared statement serves every batch size. The
    engine's pool still checks the connection out (pre-pinged) and takes it back.
    """

    _INSERT = (
        "INSERT INTO tool_calls (request_id, sandbox_key, tool, started_at, duration_ms, "
        "outcome, calls) SELECT * FROM unnest($1::text[], $2::text[], $3::text[], "
        "$4::timestamptz[], $5::float8[], $6::text[], $7::int4[])"
    )

    def __init__(self, engine: AsyncEngine) -> None:
        import asyncpg  # here: a SQLite server never loads the driver

        self._engine = engine
        self._errors: tuple[type[Exception], ...] = (
            SQLAlchemyError,
            OSError,
            asyncpg.PostgresError,
            asyncpg.InterfaceError,
        )

    async def write(self, rows: Sequence[Values]) -> None:
        columns = [list(column) for column in zip(*rows, strict=True)]
        try:
            async with self._engine.connect() as connection:
                driver = (await connection.get_raw_connection()).driver_connection
                assert driver is not None  # a checked-out connection has its driver's
                await driver.execute(self._INSERT, *columns)
        except self._errors as exc:
            raise DatabaseUnavailable(describe_db_error(exc)) from exc

    async def close(self) -> None:
        return None


# A batch for the writer's thread: its rows, and whom to tell once they are committed.
_Job = tuple[Sequence[Values], asyncio.AbstractEventLoop, "asyncio.Future[None]"]


class _SqliteSink:
    """A SQLite file through a connection and a thread of the writer's own.

    The same file, pragmas and busy timeout as the engine's connections; values go
    through the columns' own SQLAlchemy bind processors, so a row reads back exactly
    as one the ORM wrote.

    A batch is one multi-row ``INSERT`` in autocommit mode (one statement is one
    transaction: all its rows or none), so the thread takes the GIL back once per
    batch rather than around each of ``BEGIN``, every row and ``COMMIT``: each of
    those returns is a hand-over with the busy event loop, and they were most of
    what a light call's row cost. The thread is a plain one fed by a queue:
    ``run_in_executor``'s futures and locks cost the loop more than the batch.
    """

    def __init__(self, engine: AsyncEngine, path: str) -> None:
        self._path = path
        self._jobs: queue.SimpleQueue[_Job | None] = queue.SimpleQueue()
        self._thread: threading.Thread | None = None
        self._connection: sqlite3.Connection | None = None
        dialect = engine.dialect
        self._convert: list[Callable[[Any], Any] | None] = [
            ToolCall.__table__.c[name].type.dialect_impl(dialect).bind_processor(dialect)
            for name in COLUMNS
        ]
        insert = sa.insert(ToolCall).compile(dialect=dialect, column_keys=[*COLUMNS])
        if insert.positiontup != [*COLUMNS]:  # qmark parameters, in the tuples' order
            raise RuntimeError(f"unexpected INSERT parameters: {insert.positiontup}")
        self._head, self._one_row = str(insert).split(" VALUES ")
        self._statements: dict[int, str] = {}  # by rows in the statement (the thread's)

    async def write(self, rows: Sequence[Values]) -> None:
        loop = asyncio.get_running_loop()
        done: asyncio.Future[None] = loop.create_future()
        if self._thread is None:
            self._thread = threading.Thread(target=self._serve, name="audit-sqlite", daemon=True)
            self._thread.start()
        self._jobs.put((rows, loop, done))
        try:
            await done
        except sqlite3.Error as exc:
            raise DatabaseUnavailable(describe_db_error(exc)) from exc

    def _serve(self) -> None:
        """The writer's thread: each batch in turn, its outcome posted back to its loop."""
        while (job := self._jobs.get()) is not None:
            rows, loop, done = job
            failure: sqlite3.Error | None = None
            try:
                self._commit(rows)
            except sqlite3.Error as exc:
                failure = exc
            with contextlib.suppress(RuntimeError):  # the loop is closed: nobody waits
                loop.call_soon_threadsafe(_settle, done, failure)
        if self._connection is not None:
            self._connection.close()
            self._connection = None

    def _commit(self, rows: Sequence[Values]) -> None:
        """On the writer's thread: every row of ``rows`` in one transaction."""
        connection = self._connection
        if connection is None:
            connection = self._connection = self._open()
        limit = connection.getlimit(sqlite3.SQLITE_LIMIT_VARIABLE_NUMBER)
        convert, size = self._convert, max(1, limit // len(COLUMNS))
        chunks = [rows[i : i + size] for i in range(0, len(rows), size)]
        try:
            if len(chunks) > 1:  # more rows than one statement takes: one transaction
                connection.execute("BEGIN IMMEDIATE")
            for chunk in chunks:
                params = [
                    v if fn is None else fn(v)
                    for row in chunk
                    for fn, v in zip(convert, row, strict=True)
                ]
                connection.execute(self._insert(len(chunk)), params)
            if len(chunks) > 1:
                connection.execute("COMMIT")
        except sqlite3.Error:
            # A connection in an unknown state is not reused: the next batch opens anew
            # (closing it rolls back a transaction left open).
            self._connection = None
            connection.close()
            raise

    def _insert(self, rows: int) -> str:
        statement = self._statements.get(rows)
        if statement is None:
            values = ", ".join([self._one_row] * rows)
            statement = self._statements[rows] = f"{self._head} VALUES {values}"
        return statement

    def _open(self) -> sqlite3.Connection:
        # Autocommit mode: a batch's statement is its own transaction.
        connection = sqlite3.connect(
            self._path, timeout=30, isolation_level=None, check_same_thread=False
        )
        connection.execute("PRAGMA journal_mode=WAL")
        connection.execute("PRAGMA synchronous=NORMAL")
        return connection

    async def close(self) -> None:
        thread, self._thread = self._thread, None
        if thread is not None:
            self._jobs.put(None)  # after every batch already handed over
            await asyncio.to_thread(thread.join)


def _settle(done: asyncio.Future[None], failure: BaseException | None) -> None:
    if done.done():
        return  # its writer task was cancelled meanwhile
    if failure is None:
        done.set_result(None)
    else:
        done.set_exception(failure)


def _sink_for(engine: AsyncEngine) -> _Sink:
    url = engine.url
    path = url.database
    if url.get_backend_name() == "sqlite" and path and path != ":memory:" and not url.query:
        return _SqliteSink(engine, path)
    if url.get_backend_name() == "postgresql" and url.get_driver_name() == "asyncpg":
        return _PostgresSink(engine)
    # In-memory or URI-style SQLite (another connection would not see the same
    # database), and any other database or driver.
    return _EngineSink(engine)


class AuditTrail:
    def __init__(self, engine: AsyncEngine) -> None:
        self._sink = _sink_for(engine)
        # (values, started) pairs waiting for the next commit, each with its caller's future.
        self._waiting: list[tuple[str, str, str, float, str, int, asyncio.Future[None]]] = []
        self._writer: asyncio.Task[None] | None = None

    async def record(
        self,
        *,
        request_id: str,
        sandbox_key: str,
        tool: str,
        started: float,
        outcome: str,
        calls: int = 1,
    ) -> None:
        """Append one row (``started`` is a ``time.time()`` value) standing for ``calls``
        calls; returns once committed.

        Raises:
            DatabaseUnavailable: the commit that carried this row failed.
        """
        done: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self._waiting.append((request_id, sandbox_key, tool, started, outcome, calls, done))
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
                    calls,
                )
                for request_id, sandbox_key, tool, started, outcome, calls, _ in batch
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
