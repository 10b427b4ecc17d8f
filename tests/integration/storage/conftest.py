"""The stores' suites run on both databases the server supports: each test gets a
migrated SQLite file and a new PostgreSQL database (the one .ci/run starts)."""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path

import pytest
from db_testkit import migrated_postgres, migrated_sqlite
from sqlalchemy.ext.asyncio import AsyncEngine


@pytest.fixture(params=["sqlite", "postgresql"])
async def engine(request: pytest.FixtureRequest, tmp_path: Path) -> AsyncIterator[AsyncEngine]:
    if request.param == "sqlite":
        sqlite = await migrated_sqlite(tmp_path)
        yield sqlite
        await sqlite.dispose()
    else:
        async with migrated_postgres() as postgres:
            yield postgres
