"""The same migrations on a real PostgreSQL (started by .ci/run)."""

from __future__ import annotations

import time
from collections.abc import AsyncIterator

import pytest
import sqlalchemy as sa
from db_testkit import fresh_postgres
from sqlalchemy.ext.asyncio import AsyncEngine

from app.storage.audit import AuditTrail
from app.storage.db import Repository, create_engine, upgrade_schema
from app.storage.signin.auth_store import SqlAuthStore
from auth.client_documents import MAX_URL_LENGTH
from auth.store import Client, Grant, TokenRecord

pytestmark = pytest.mark.integration


@pytest.fixture
async def fresh_engine() -> AsyncIterator[AsyncEngine]:
    """An engine on a new, empty database, dropped afterwards: each test proves an
    upgrade from nothing."""
    async with fresh_postgres() as url:
        engine = create_engine(url)
        try:
            yield engine
        finally:
            await engine.dispose()


async def test_migrations_run_on_postgresql(fresh_engine: AsyncEngine) -> None:
    await upgrade_schema(fresh_engine)
    await upgrade_schema(fresh_engine)  # idempotent: a restart runs it again
    async with fresh_engine.connect() as conn:
        result = await conn.execute(
            sa.text("SELECT table_name FROM information_schema.tables WHERE table_schema='public'")
        )
        tables = set(result.scalars().all())
    assert {"alembic_version", "tool_calls"} <= tables
    repo = Repository(fresh_engine)
    await repo.ping()
    await AuditTrail(fresh_engine).record(
        request_id="r", sandbox_key="k", tool="t", started=time.time(), outcome="ok"
    )
    assert [row.request_id for row in await repo.tool_calls("k")] == ["r"]


async def test_a_metadata_document_url_fits_as_client_id_on_postgresql(
    fresh_engine: AsyncEngine,
) -> None:
    # PostgreSQL enforces VARCHAR lengths (SQLite does not): migration 0006 must widen both
    # oauth_clients.client_id and oauth_grants.client_id for URL client IDs.
    await upgrade_schema(fresh_engine)
    store = SqlAuthStore(fresh_engine)
    client_id = "https://client.example/" + "p" * (MAX_URL_LENGTH - 23)
    assert len(client_id) == MAX_URL_LENGTH
    await store.upsert_client(
        Client(client_id, "Doc client", ("https://client.example/cb",), 1000.0)
    )
    grant = Grant("g1", client_id, "key", "https://mcp.test/mcp", ("sandbox",), 2000.0)
    await store.create_grant(grant, [TokenRecord("h1", "g1", "access", time.time() + 60)])
    # The document changed: name and URIs follow it, its history does not move.
    await store.upsert_client(Client(client_id, "Renamed", ("https://client.example/cb2",), 3000.0))
    loaded = await store.load_token("h1")
    assert loaded is not None
    assert loaded[1].client_id == client_id
    stored = await store.load_client(client_id)
    assert stored is not None
    assert stored.client_name == "Renamed"
    assert stored.redirect_uris == ("https://client.example/cb2",)
    assert stored.created_at == 1000.0
    assert stored.last_grant_at == 2000.0
    assert await store.delete_stale_clients(created_before=5000.0) == 0, "it has a grant"
