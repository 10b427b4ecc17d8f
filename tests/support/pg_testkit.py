"""A fresh PostgreSQL database for a test (on the server .ci/run starts), dropped after."""

from __future__ import annotations

import asyncio
import os
import uuid
from collections.abc import Iterator
from contextlib import contextmanager

import pytest
import sqlalchemy as sa
from sqlalchemy.engine import make_url
from sqlalchemy.ext.asyncio import create_async_engine


def postgres_url() -> str:
    url = os.environ.get("SANDBOX_MCP_TEST_POSTGRES_URL")
    if not url:
        pytest.fail(
            "SANDBOX_MCP_TEST_POSTGRES_URL is not set: these tests need the PostgreSQL "
            "that .ci/run starts (source .ci/lib/services.sh; start_postgres)."
        )
    return url


async def _admin(url: str, statement: str) -> None:
    admin = create_async_engine(url, isolation_level="AUTOCOMMIT")
    try:
        async with admin.connect() as conn:
            await conn.execute(sa.text(statement))
    finally:
        await admin.dispose()


@contextmanager
def fresh_database() -> Iterator[str]:
    """The SQLAlchemy URL of a new, empty database; dropped (connections and all) after."""
    base = postgres_url()
    name = f"t_{uuid.uuid4().hex[:12]}"
    asyncio.run(_admin(base, f'CREATE DATABASE "{name}"'))
    try:
        yield make_url(base).set(database=name).render_as_string(hide_password=False)
    finally:
        asyncio.run(_admin(base, f'DROP DATABASE "{name}" WITH (FORCE)'))
