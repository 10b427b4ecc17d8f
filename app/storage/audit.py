"""The audit trail of tool calls, written in group commits.

One commit per call made the database the ceiling of every light call (a profile:
more than half of the process's time in SQLite's connection thread). Here calls that
finish together share one transaction: each caller still returns only once its own
row is committed (so no answered call lacks its row, kill -9 included), but while
one commit is in flight every row that arrives waits for the next, and goes in it.
"""

from __future__ import annotations

import asyncio
import time
from dataclasses import dataclass
from datetime import UTC, datetime

import sqlalchemy as sa
from sqlalchemy.exc import SQLAlchemyError
from sqlalchemy.ext.asyncio import AsyncEngine

from app.errors import DatabaseUnavailable
from app.storage.db import ToolCall, describe_db_error

MAX_BATCH = 1_000


@dataclass(frozen=True)
class _Row:
    request_id: str
    sandbox_key: str
    tool: str
    started: float
    outcome: str
    done: asyncio.Future[None]


class AuditTrail:
    def __init__(self, engine: AsyncEngine) -> None:
        self._engine = engine
        self._waiting: list[_Row] = []
        self._writer: asyncio.Task[None] | None = None

    async def record(
        self, *, request_id: str, sandbox_key: str, tool: str, started: float, outcome: str
    ) -> None:
        """Append one row (``started`` is a ``time.time()`` value); returns once committed.

        Raises:
            DatabaseUnavailable: the commit that carried this row failed.
        """
        done: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self._waiting.append(_Row(request_id, sandbox_key, tool, started, outcome, done))
        if self._writer is None or self._writer.done():
            self._writer = asyncio.create_task(self._write(), name="audit-writer")
        # Shielded: a caller that goes away does not take the others' commit with it.
        await asyncio.shield(done)

    async def _write(self) -> None:
        while self._waiting:
            batch, self._waiting = self._waiting[:MAX_BATCH], self._waiting[MAX_BATCH:]
            now = time.time()
            values = [
                {
                    "request_id": row.request_id,
                    "sandbox_key": row.sandbox_key,
                    "tool": row.tool,
                    "started_at": datetime.fromtimestamp(row.started, UTC),
                    "duration_ms": round((now - row.started) * 1000, 3),
                    "outcome": row.outcome,
                }
                for row in batch
            ]
            try:
                async with self._engine.begin() as connection:
                    await connection.execute(sa.insert(ToolCall), values)
            except (SQLAlchemyError, OSError) as exc:
                failure = DatabaseUnavailable(describe_db_error(exc))
                for row in batch:
                    if not row.done.done():
                        row.done.set_exception(failure)
                continue
            for row in batch:
                if not row.done.done():
                    row.done.set_result(None)

    async def close(self) -> None:
        """Wait for the rows already handed over to be written (at shutdown)."""
        if self._writer is not None:
            await asyncio.gather(self._writer, return_exceptions=True)
