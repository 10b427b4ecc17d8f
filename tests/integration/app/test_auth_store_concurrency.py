"""The auth store's one-step decisions under real concurrency on PostgreSQL: two
engines (two processes' connection pools) on one database race the same rotation,
the same redemption and the same last admission place."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator

import pytest

from app.storage.db import create_engine, upgrade_schema
from app.storage.signin.auth_store import SqlAuthStore
from auth.store import Client, Grant, IssuedCode, SigninCounts, TokenRecord

pytestmark = pytest.mark.integration
NOW = 1_700_000_000.0


@pytest.fixture
async def stores(database_url: str) -> AsyncIterator[list[SqlAuthStore]]:
    engines = [create_engine(database_url) for _ in range(2)]
    await upgrade_schema(engines[0])
    stores = [SqlAuthStore(engine) for engine in engines]
    await stores[0].save_client(Client("c", None, ("http://127.0.0.1:9/cb",), NOW))
    yield stores
    for engine in engines:
        await engine.dispose()


def a_grant(grant_id: str) -> Grant:
    return Grant(grant_id, "c", "key", "https://mcp.example.test/mcp", ("sandbox",), NOW)


def tokens(grant_id: str, tag: str) -> list[TokenRecord]:
    return [
        TokenRecord(f"at-{tag}", grant_id, "access", NOW + 3600),
        TokenRecord(f"rt-{tag}", grant_id, "refresh", NOW + 86400),
    ]


async def test_a_rotation_raced_on_two_processes_is_won_once(
    stores: list[SqlAuthStore],
) -> None:
    await stores[0].create_grant(a_grant("g"), tokens("g", "0"))
    for round_ in range(10):
        old = f"rt-{round_}"
        won = await asyncio.gather(
            *(store.rotate(old, NOW + round_, tokens("g", f"{round_ + 1}")) for store in stores),
            return_exceptions=True,
        )
        # The loser is refused cleanly (False), never a duplicate-key error.
        assert sorted(won, key=str) == [False, True], won


async def test_a_code_redeemed_on_two_processes_at_once_makes_one_grant(
    stores: list[SqlAuthStore],
) -> None:
    for round_ in range(10):
        code = IssuedCode(f"code-{round_}", None, NOW, NOW + 600)
        await stores[0].issue_code(code, burst_since=0, hourly_since=0, refuse=lambda _: None)
        outcomes = await asyncio.gather(
            stores[0].redeem_code(
                code.code_hash, a_grant(f"a{round_}"), tokens(f"a{round_}", f"a{round_}")
            ),
            stores[1].redeem_code(
                code.code_hash, a_grant(f"b{round_}"), tokens(f"b{round_}", f"b{round_}")
            ),
        )
        firsts = [o for o in outcomes if o.first]
        replays = [o for o in outcomes if not o.first]
        assert len(firsts) == 1
        assert len(replays) == 1
        winner = "a" if outcomes[0].first else "b"
        assert replays[0].previous_grant == f"{winner}{round_}", "the loser knows what to revoke"


async def test_two_processes_cannot_both_take_the_last_place(
    stores: list[SqlAuthStore],
) -> None:
    seen: list[int] = []

    def at_most_three(counts: SigninCounts) -> str | None:
        seen.append(len(counts.live_expiries))
        return "full" if len(counts.live_expiries) >= 3 else None

    outcomes = await asyncio.gather(
        *(
            stores[n % 2].issue_code(
                IssuedCode(f"c{n}", "198.51.100.7", NOW, NOW + 600),
                burst_since=NOW - 60,
                hourly_since=NOW - 3600,
                refuse=at_most_three,
            )
            for n in range(8)
        )
    )
    assert sum(isinstance(o, IssuedCode) for o in outcomes) == 3
    assert sorted(seen) == [0, 1, 2, 3, 3, 3, 3, 3], "each decision saw the one before"
