"""The same migrations on a real PostgreSQL (started by .ci/run)."""

from __future__ import annotations

import os
import time
import uuid

import pytest
import sqlalchemy as sa
from sqlalchemy.engine import make_url
from sqlalchemy.ext.asyncio import create_async_engine

from app.db import Repository, create_engine, upgrade_schema

pytestmark = pytest.mark.integration


@pytest.fixture
def postgres_url() -> str:
    url = os.environ.get("SANDBOX_MCP_TEST_POSTGRES_URL")
    if not url:
        pytest.fail(
            "SANDBOX_MCP_TEST_POSTGRES_URL is not set: integration tests need the PostgreSQL "
            "that .ci/run starts (source .ci/lib/services.sh; start_postgres)."
        )
    return url


async def test_migrations_run_on_postgresql(postgres_url: str) -> None:
    # A fresh database per run, so the test proves an upgrade from nothing.
    name = f"t_{uuid.uuid4().hex[:12]}"
    admin = create_async_engine(postgres_url, isolation_level="AUTOCOMMIT")
    async with admin.connect() as conn:
        await conn.execute(sa.text(f'CREATE DATABASE "{name}"'))
    url = make_url(postgres_url).set(database=name).render_as_string(hide_password=False)
    engine = create_engine(url)
    try:
        await upgrade_schema(engine)
        await upgrade_schema(engine)  # idempotent: a restart runs it again
        async with engine.connect() as conn:
            result = await conn.execute(
                sa.text(
                    "SELECT table_name FROM information_schema.tables WHERE table_schema='public'"
                )
            )
            tables = set(result.scalars().all())
        assert {"alembic_version", "tool_calls"} <= tables
        repo = Repository(engine)
        await repo.ping()
        await repo.record_tool_call(
            request_id="r", sandbox_key="k", tool="t", started=time.time(), outcome="ok"
        )
        assert [row.request_id for row in await repo.tool_calls("k")] == ["r"]
    finally:
        await engine.dispose()
        async with admin.connect() as conn:
            await conn.execute(sa.text(f'DROP DATABASE "{name}"'))
        await admin.dispose()
