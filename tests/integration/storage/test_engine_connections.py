"""The PostgreSQL engine keeps the connections concurrent calls opened (issue 13)."""

from __future__ import annotations

import asyncio

import pytest
import sqlalchemy as sa
from db_testkit import fresh_postgres

from app.storage.db import create_engine

pytestmark = pytest.mark.integration


async def test_connections_opened_under_concurrency_are_kept_for_the_next_calls() -> None:
    """SQLAlchemy's default pool closed every connection past 5 at check-in, so 16
    concurrent light calls opened a new PostgreSQL connection for most statements."""
    async with fresh_postgres() as url:
        engine = create_engine(url)
        try:
            both_in = asyncio.Barrier(12)

            async def one_call() -> int:
                async with engine.connect() as connection:
                    await both_in.wait()  # all twelve hold a connection at once
                    return int(await connection.scalar(sa.text("SELECT pg_backend_pid()")))

            first = set(await asyncio.gather(*(one_call() for _ in range(12))))
            assert len(first) == 12
            assert engine.pool.checkedin() == 12, "every connection was kept"  # type: ignore[attr-defined]
            again = set(await asyncio.gather(*(one_call() for _ in range(12))))
            assert again == first, "the next calls reuse them: no new connection"
        finally:
            await engine.dispose()
