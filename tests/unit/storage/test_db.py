from __future__ import annotations

import time
from pathlib import Path

import pytest
import sqlalchemy as sa

from app.errors import DatabaseUnavailable
from app.storage.audit import AuditTrail
from app.storage.db import Repository, create_engine, upgrade_schema


async def test_migrations_create_the_schema_on_sqlite_with_wal_and_foreign_keys(
    tmp_path: Path,
) -> None:
    engine = create_engine(f"sqlite+aiosqlite:///{tmp_path / 'db.sqlite'}")
    try:
        await upgrade_schema(engine)
        await upgrade_schema(engine)  # idempotent: a restart runs it again
        async with engine.connect() as conn:
            tables = set(
                (await conn.execute(sa.text("SELECT name FROM sqlite_master WHERE type='table'")))
                .scalars()
                .all()
            )
            assert {"alembic_version", "tool_calls"} <= tables
            assert (await conn.execute(sa.text("PRAGMA journal_mode"))).scalar() == "wal"
            assert (await conn.execute(sa.text("PRAGMA foreign_keys"))).scalar() == 1
    finally:
        await engine.dispose()


async def test_tool_calls_are_recorded_per_sandbox_key(tmp_path: Path) -> None:
    engine = create_engine(f"sqlite+aiosqlite:///{tmp_path / 'db.sqlite'}")
    try:
        await upgrade_schema(engine)
        repo = Repository(engine)
        started = time.time()
        audit = AuditTrail(engine)
        await audit.record(
            request_id="r1", sandbox_key="k1", tool="t", started=started, outcome="ok"
        )
        await audit.record(
            request_id="r2", sandbox_key="k2", tool="t", started=started, outcome="NOT_FOUND"
        )
        rows = await repo.tool_calls("k2")
        assert [(r.request_id, r.outcome) for r in rows] == [("r2", "NOT_FOUND")]
        assert rows[0].duration_ms >= 0
    finally:
        await engine.dispose()


async def test_an_unreachable_database_is_a_typed_error_without_the_url() -> None:
    engine = create_engine("postgresql+asyncpg://user:hunter2@127.0.0.1:1/nothing")
    try:
        with pytest.raises(DatabaseUnavailable) as caught:
            await Repository(engine).ping()
        assert "hunter2" not in caught.value.message
        assert caught.value.code == "DATABASE_UNAVAILABLE"
        with pytest.raises(DatabaseUnavailable):
            await upgrade_schema(engine)
    finally:
        await engine.dispose()
