"""Helpers for the decisions taken in batches behind one lock (the rate ledger's takes,
the sign-in's admissions): count the transactions an engine begins, hold the database
as a busy tenant or another process would, and let started tasks reach their waits."""

from __future__ import annotations

import asyncio
import sqlite3
from collections.abc import AsyncIterator, Iterator
from contextlib import asynccontextmanager, contextmanager
from typing import Any

import sqlalchemy as sa
from sqlalchemy import event
from sqlalchemy.ext.asyncio import AsyncEngine, create_async_engine


@contextmanager
def counted_transactions(engine: AsyncEngine) -> Iterator[list[int]]:
    """How many transactions ``engine`` began meanwhile (a one-item list)."""
    began = [0]

    def on_begin(_connection: Any) -> None:
        began[0] += 1

    event.listen(engine.sync_engine, "begin", on_begin)
    try:
        yield began
    finally:
        event.remove(engine.sync_engine, "begin", on_begin)


@asynccontextmanager
async def database_held(engine: AsyncEngine, advisory_key: int) -> AsyncIterator[None]:
    """The database held by someone else, as a tenant's long write holds SQLite's one
    write lock (or another process holds PostgreSQL's advisory lock ``advisory_key``):
    a decision's transaction waits until the block ends (on SQLite: at its first write)."""
    if engine.dialect.name == "postgresql":
        # An engine of its own: its transactions are not the engine's to count.
        holder = create_async_engine(engine.url.render_as_string(hide_password=False))
        try:
            async with holder.connect() as other:
                await other.execute(sa.text("SELECT pg_advisory_lock(:k)"), {"k": advisory_key})
                await other.commit()
                try:
                    yield
                finally:
                    await other.execute(
                        sa.text("SELECT pg_advisory_unlock(:k)"), {"k": advisory_key}
                    )
                    await other.commit()
        finally:
            await holder.dispose()
        return
    path = engine.url.database
    assert path
    writer = sqlite3.connect(path, isolation_level=None)
    try:
        writer.execute("BEGIN IMMEDIATE")  # SQLite's write lock, until the rollback
        try:
            yield
        finally:
            writer.execute("ROLLBACK")
    finally:
        writer.close()


async def settle() -> None:
    """Every task started so far runs up to its first wait (loop turns, not time)."""
    for _ in range(20):
        await asyncio.sleep(0)
