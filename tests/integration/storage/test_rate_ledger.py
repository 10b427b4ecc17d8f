"""The shared rate ledger (issue 25): the takes queued behind a slow one are decided
together, so a flood of registrations does not make an honest one wait for each of
the flood's transactions in turn; the budgets hold as if each take came alone."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

import pytest
from sqlalchemy.ext.asyncio import AsyncEngine
from turns_testkit import counted_transactions, database_held, settle

from app.storage.rate_store import _LEDGER_LOCK, MAX_BATCH, SqlEventLedger

pytestmark = pytest.mark.integration

REGISTER = 60.0  # the registrations' window
HOUR = 3600.0  # the e-mails'


@asynccontextmanager
async def ledger_held(engine: AsyncEngine) -> AsyncIterator[None]:
    """The ledger's database held by someone else (``database_held``)."""
    async with database_held(engine, _LEDGER_LOCK):
        yield


async def test_a_take_behind_a_flood_waits_for_one_transaction_not_one_each(
    engine: AsyncEngine,
) -> None:
    """An honest registration arrives behind 60 of a flood's, while the first of them
    waits for the database. Before, each take held the ledger for a transaction of its
    own: the honest one waited for 61 of them (60 s of waits at a second each on a
    busy SQLite). Now the queued takes are decided in one transaction, in the order
    they came, with the budgets as if they came one by one."""
    ledger = SqlEventLedger(engine)

    def flood(n: int) -> list[tuple[str, int]]:
        return [(f"register:flood-{n % 8}", 3), ("register", 30)]

    with counted_transactions(engine) as began:
        async with ledger_held(engine):
            first = asyncio.create_task(ledger.take(flood(0), REGISTER, 1000.0))
            await settle()
            queued = [
                asyncio.create_task(ledger.take(flood(n), REGISTER, 1000.0 + n / 100))
                for n in range(1, 60)
            ]
            honest = asyncio.create_task(
                ledger.take([("register:honest", 3), ("register", 30)], REGISTER, 1001.0)
            )
            await settle()
        waits = await asyncio.gather(first, *queued)
        wait = await honest
    assert began[0] == 2, f"the first take and the 60 behind it took {began[0]} transactions"
    # Each flood key (flood-0..7) had 3 places, the global budget 30: the first 24 of
    # the flood granted in order, the rest refused; the honest one still had a place.
    assert waits[:24] == [0] * 24
    assert all(w > 0 for w in waits[24:])
    assert wait == 0


async def test_budgets_hold_as_if_each_take_came_alone(engine: AsyncEngine) -> None:
    """Decided together or alone, the same answers: a full window refuses with the
    seconds until its oldest counted event leaves it; windows of different lengths
    in one batch each count their own events."""
    ledger = SqlEventLedger(engine)
    assert [await ledger.take([("a", 2)], REGISTER, t) for t in (100.0, 110.0)] == [0, 0]
    assert await ledger.take([("a", 2)], REGISTER, 120.0) == 41  # 100 leaves at 160
    assert await ledger.take([("a", 2)], REGISTER, 160.5) == 0
    async with ledger_held(engine):
        together = [
            asyncio.create_task(ledger.take(budgets, window, now))
            for budgets, window, now in (
                ([("mail", 1)], HOUR, 170.0),  # a place left in the hour: granted
                ([("a", 2)], REGISTER, 165.0),  # 110 and 160.5 in the window: refused
                ([("mail", 1)], HOUR, 172.0),  # the hour's place taken just before
                ([("b", 1), ("a", 2)], REGISTER, 175.0),  # 110 has left: granted
                ([("b", 1)], REGISTER, 176.0),  # taken by the one before it
            )
        ]
        await settle()
    assert await asyncio.gather(*together) == [0, 6, 3599, 0, 60]


async def test_a_cancelled_take_spends_nothing(engine: AsyncEngine) -> None:
    """A caller gone before its take was decided (the client hung up) leaves its
    place to the next."""
    ledger = SqlEventLedger(engine)
    async with ledger_held(engine):
        first = asyncio.create_task(ledger.take([("x", 2)], REGISTER, 10.0))
        await settle()
        gone = asyncio.create_task(ledger.take([("x", 2)], REGISTER, 11.0))
        await settle()
        gone.cancel()
        await settle()
    assert await first == 0
    assert gone.cancelled()
    assert await ledger.take([("x", 2)], REGISTER, 12.0) == 0


@pytest.mark.parametrize("takes", [MAX_BATCH * 2 + 5])
async def test_a_transaction_decides_at_most_max_batch_takes(
    engine: AsyncEngine, takes: int
) -> None:
    """However many queue, a transaction reads a bounded number of buckets."""
    ledger = SqlEventLedger(engine)
    with counted_transactions(engine) as began:
        async with ledger_held(engine):
            first = asyncio.create_task(ledger.take([("y", 1000)], REGISTER, 1.0))
            await settle()
            rest = [
                asyncio.create_task(ledger.take([(f"y{n}", 1), ("y", 1000)], REGISTER, 2.0))
                for n in range(takes)
            ]
            await settle()
        assert await asyncio.gather(first, *rest) == [0] * (takes + 1)
    assert began[0] == 1 + -(-takes // MAX_BATCH)
