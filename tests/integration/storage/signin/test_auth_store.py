"""The sign-in's clients, grants and tokens on the real databases (SQLite and PostgreSQL)."""

from __future__ import annotations

import asyncio

import pytest
from sqlalchemy.ext.asyncio import AsyncEngine

from app.storage.signin.auth_store import SqlAuthStore
from auth.store import Client, Grant, TokenRecord

pytestmark = pytest.mark.integration


@pytest.fixture
def store(engine: AsyncEngine) -> SqlAuthStore:
    return SqlAuthStore(engine)


def a_grant(grant_id: str, prefix: str = "203.0.113.0/24", at: float = 10.0) -> Grant:
    return Grant(grant_id, "c1", "key", "https://mcp.test/mcp", ("sandbox",), at, None, prefix)


async def test_clients_save_upsert_and_go_stale(store: SqlAuthStore) -> None:
    await store.save_client(Client("c1", "One", ("https://a.test/cb",), 1.0))
    await store.upsert_client(Client("c1", "Renamed", ("https://a.test/cb2",), 99.0))
    loaded = await store.load_client("c1")
    assert loaded == Client("c1", "Renamed", ("https://a.test/cb2",), 1.0, None)
    await store.upsert_client(Client("c2", None, ("http://127.0.0.1/cb",), 2.0))
    assert await store.load_client("missing") is None
    await store.create_grant(a_grant("g1"), [])
    # c1 has a grant now; c2 never had one and is old.
    assert await store.delete_stale_clients(created_before=5.0) == 1
    assert await store.load_client("c2") is None
    c1 = await store.load_client("c1")
    assert c1 is not None
    assert c1.last_grant_at == 10.0


async def test_concurrent_upserts_of_one_client_both_succeed(store: SqlAuthStore) -> None:
    await asyncio.gather(
        *(
            store.upsert_client(Client("doc", f"n{i}", ("https://d.test/cb",), 1.0))
            for i in range(5)
        )
    )
    loaded = await store.load_client("doc")
    assert loaded is not None
    assert loaded.client_name in {f"n{i}" for i in range(5)}


async def test_tokens_load_rotate_once_revoke_and_expire(store: SqlAuthStore) -> None:
    await store.save_client(Client("c1", "One", ("https://a.test/cb",), 1.0))
    access = TokenRecord("h-access", "g1", "access", 100.0)
    refresh = TokenRecord("h-refresh", "g1", "refresh", 1000.0)
    await store.create_grant(a_grant("g1"), [access, refresh])
    found = await store.load_token("h-access")
    assert found == (access, a_grant("g1"))
    successor = TokenRecord("h-refresh-2", "g1", "refresh", 2000.0)
    # Compare-and-set: of two refreshes with one token, only the first wins.
    assert await store.rotate("h-refresh", 50.0, [successor]) is True
    assert (
        await store.rotate("h-refresh", 51.0, [TokenRecord("h-x", "g1", "refresh", 1.0)]) is False
    )
    rotated = await store.load_token("h-refresh")
    assert rotated is not None
    assert rotated[0].rotated_at == 50.0
    assert await store.load_token("h-x") is None
    assert await store.live_grant_expiries("203.0.113.0/24", now=60.0) == [2000.0]
    assert await store.live_grant_expiries("198.51.100.0/24", now=60.0) == []
    assert await store.delete_expired(now=150.0) == 1  # the access token
    assert await store.load_token("h-access") is None
    await store.delete_token("h-refresh")
    assert await store.load_token("h-refresh") is None
    await store.revoke_grant("g1", 70.0)
    assert await store.load_token("h-refresh-2") is None
    assert await store.live_grant_expiries("203.0.113.0/24", now=60.0) == []
