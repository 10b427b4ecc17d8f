"""The one way a test gets a database: a migrated SQLite file, or a new database of its
own on the PostgreSQL that .ci/run starts (``SANDBOX_MCP_TEST_POSTGRES_URL``)."""

from __future__ import annotations

import asyncio
import os
import uuid
from collections.abc import AsyncIterator, Iterator
from contextlib import asynccontextmanager, contextmanager
from pathlib import Path

import sqlalchemy as sa
from sqlalchemy.engine import make_url
from sqlalchemy.ext.asyncio import AsyncEngine, create_async_engine

from app.experiments.core.records import Experiment
from app.experiments.core.states import State
from app.storage.db import create_engine, upgrade_schema


async def migrated_sqlite(folder: Path) -> AsyncEngine:
    """A SQLite database in ``folder`` with every migration applied; dispose it when done."""
    engine = create_engine(f"sqlite+aiosqlite:///{folder / 'db.sqlite'}")
    await upgrade_schema(engine)
    return engine


def postgres_url() -> str:
    """The PostgreSQL that .ci/run starts; a test needing it fails (never skips) without it."""
    url = os.environ.get("SANDBOX_MCP_TEST_POSTGRES_URL")
    if not url:
        raise AssertionError(
            "SANDBOX_MCP_TEST_POSTGRES_URL is not set: this test needs the PostgreSQL that "
            ".ci/run starts (source .ci/lib/services.sh; start_postgres)."
        )
    return url


async def _admin(statement: str) -> None:
    admin = create_async_engine(postgres_url(), isolation_level="AUTOCOMMIT")
    try:
        async with admin.connect() as conn:
            await conn.execute(sa.text(statement))
    finally:
        await admin.dispose()


async def create_postgres_database() -> tuple[str, str]:
    """A new, empty database on the real PostgreSQL (.ci/run starts it): its name and
    URL. Drop it with ``drop_postgres_database``."""
    name = f"t_{uuid.uuid4().hex[:12]}"
    await _admin(f'CREATE DATABASE "{name}"')
    return name, make_url(postgres_url()).set(database=name).render_as_string(hide_password=False)


async def drop_postgres_database(name: str) -> None:
    await _admin(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')


@asynccontextmanager
async def fresh_postgres() -> AsyncIterator[str]:
    """The URL of a new, empty database, dropped afterwards, so concurrent tests never
    share rows."""
    name, url = await create_postgres_database()
    try:
        yield url
    finally:
        await drop_postgres_database(name)


@contextmanager
def fresh_postgres_blocking() -> Iterator[str]:
    """``fresh_postgres`` for a synchronous fixture (no event loop running)."""
    name, url = asyncio.run(create_postgres_database())
    try:
        yield url
    finally:
        asyncio.run(drop_postgres_database(name))


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
