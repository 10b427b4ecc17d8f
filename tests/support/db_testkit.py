"""The one way a test gets a database: a migrated SQLite file, or a new database of its
own on the PostgreSQL that .ci/run starts (``SANDBOX_MCP_TEST_POSTGRES_URL``)."""

from __future__ import annotations

import os
import uuid
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path

import pytest
import sqlalchemy as sa
from sqlalchemy.engine import make_url
from sqlalchemy.ext.asyncio import AsyncEngine, create_async_engine

from app.experiments.records import Experiment
from app.experiments.states import State
from app.storage.db import create_engine, upgrade_schema


async def migrated_sqlite(folder: Path) -> AsyncEngine:
    """A SQLite database in ``folder`` with every migration applied; dispose it when done."""
    engine = create_engine(f"sqlite+aiosqlite:///{folder / 'db.sqlite'}")
    await upgrade_schema(engine)
    return engine


def postgres_url() -> str:
    """The test PostgreSQL's URL; fails (never skips) when it is not configured."""
    url = os.environ.get("SANDBOX_MCP_TEST_POSTGRES_URL")
    if not url:
        pytest.fail(
            "SANDBOX_MCP_TEST_POSTGRES_URL is not set: these tests need the PostgreSQL "
            "that .ci/run starts (source .ci/lib/services.sh; start_postgres)."
        )
    return url


@asynccontextmanager
async def fresh_postgres() -> AsyncIterator[str]:
    """The URL of a new, empty PostgreSQL database, dropped afterwards."""
    server_url = postgres_url()
    name = f"t_{uuid.uuid4().hex[:12]}"
    admin = create_async_engine(server_url, isolation_level="AUTOCOMMIT")
    try:
        async with admin.connect() as conn:
            await conn.execute(sa.text(f'CREATE DATABASE "{name}"'))
        yield make_url(server_url).set(database=name).render_as_string(hide_password=False)
        async with admin.connect() as conn:
            await conn.execute(sa.text(f'DROP DATABASE "{name}" WITH (FORCE)'))
    finally:
        await admin.dispose()


@asynccontextmanager
async def migrated_postgres() -> AsyncIterator[AsyncEngine]:
    """A new PostgreSQL database with every migration applied, dropped afterwards."""
    async with fresh_postgres() as url:
        engine = create_engine(url)
        try:
            await upgrade_schema(engine)
            yield engine
        finally:
            await engine.dispose()


def an_experiment(experiment_id: str, sandbox_key: str = "k") -> Experiment:
    """A just-created experiment record, for tests of the stores."""
    return Experiment(
        experiment_id=experiment_id,
        sandbox_key=sandbox_key,
        name="",
        goal="",
        state=State.CREATING,
        image="sandbox-mcp/python:3",
        container_id=None,
        isolation={},
        warnings=[],
        source="empty",
        created_at=0.0,
        updated_at=0.0,
        findings=None,
    )
