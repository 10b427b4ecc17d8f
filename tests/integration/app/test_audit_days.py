"""The shared count of the day's audit rows, on SQLite and on the real PostgreSQL (.ci/run
starts it): blocks are granted until the day is spent, by concurrent processes alike,
and rows given back are granted again."""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator
from pathlib import Path

import pytest
from db_testkit import migrated_postgres
from sqlalchemy import event
from sqlalchemy.ext.asyncio import AsyncEngine

from app.storage.audit_day_store import SqlDayLedger
from app.storage.db import Repository, create_engine, upgrade_schema

pytestmark = pytest.mark.integration


@pytest.fixture(params=["sqlite", "postgresql"])
async def engine(request: pytest.FixtureRequest, tmp_path: Path) -> AsyncIterator[AsyncEngine]:
    if request.param == "postgresql":
        async with migrated_postgres() as engine:
            yield engine
        return
    engine = create_engine(f"sqlite+aiosqlite:///{tmp_path / 'db.sqlite'}")
    await upgrade_schema(engine)
    yield engine
    await engine.dispose()


async def test_blocks_are_granted_until_the_day_is_spent(engine: AsyncEngine) -> None:
    days = SqlDayLedger(engine)
    assert await days.reserve("s:m", 7, 40, cap=100) == 40
    assert await days.reserve("s:m", 7, 40, cap=100) == 40
    assert await days.reserve("s:m", 7, 40, cap=100) == 20  # what was left
    assert await days.reserve("s:m", 7, 40, cap=100) == 0
    assert await days.reserve("s:m", 8, 40, cap=100) == 40  # the next day
    assert await days.reserve("s:other", 7, 40, cap=100) == 40  # another owner
    # Given back (past the overshoot), they are granted again.
    await days.give_back("s:m", 7, 15, cap=100)
    assert await days.reserve("s:m", 7, 40, cap=100) == 15
    assert await days.reserve("s:m", 7, 40, cap=100) == 0


async def test_concurrent_reservations_never_grant_more_than_the_day(
    engine: AsyncEngine,
) -> None:
    """Processes reserving at once (separate engines: separate connections) share it."""
    engines = [create_engine(str(engine.url.render_as_string(hide_password=False)))]
    engines.append(create_engine(engines[0].url.render_as_string(hide_password=False)))
    try:
        ledgers = [SqlDayLedger(e) for e in engines]
        grants = await asyncio.gather(
            *(ledgers[i % 2].reserve("s:m", 1, 7, cap=100) for i in range(40))
        )
    finally:
        for e in engines:
            await e.dispose()
    assert sum(grants) == 100, grants


async def test_retention_forgets_past_days_counts(engine: AsyncEngine) -> None:
    days = SqlDayLedger(engine)
    today = int(time.time() // 86_400)
    await days.reserve("s:m", today - 9, 5, cap=100)
    await days.reserve("s:m", today, 5, cap=100)
    await Repository(engine).forget_tool_calls_before(time.time() - 7 * 86_400)
    assert await days.reserve("s:m", today - 9, 100, cap=100) == 100  # its row was gone
    assert await days.reserve("s:m", today, 100, cap=100) == 95


async def test_a_burst_of_first_reservations_takes_a_few_transactions(
    engine: AsyncEngine,
) -> None:
    """A hundred new sandboxes' first calls reserve at once: those that queue while one
    transaction is written are decided together in the next (it was one transaction
    each, one after another on SQLite, before each call's answer); every owner still
    gets what it would alone, the one that asks twice included."""
    commits = 0

    def counted(*_: object) -> None:
        nonlocal commits
        commits += 1

    event.listen(engine.sync_engine, "commit", counted)
    days = SqlDayLedger(engine)
    owners = [f"s:{i}" for i in range(100)] + ["s:0"]
    grants = await asyncio.gather(*(days.reserve(owner, 3, 60, cap=100) for owner in owners))
    assert grants == [60] * 100 + [40]  # s:0's second block: what was left of its day
    assert commits <= 10, commits
    assert await days.reserve("s:0", 3, 60, cap=100) == 0


async def test_a_batch_decides_each_reservation_as_if_alone_in_order(engine: AsyncEngine) -> None:
    """One batch with an owner asking three times (a statement may change a row only
    once: PostgreSQL refuses otherwise) and owners of two caps (sandboxes', addresses')."""
    days = SqlDayLedger(engine)
    batch: list[dict[str, int | str]] = [
        {"owner": "s:m", "day": 5, "want": 40, "cap": 100},
        {"owner": "a:x", "day": 5, "want": 300, "cap": 400},
        {"owner": "s:m", "day": 5, "want": 40, "cap": 100},
        {"owner": "s:n", "day": 5, "want": 40, "cap": 100},
        {"owner": "s:m", "day": 5, "want": 40, "cap": 100},
        {"owner": "a:x", "day": 5, "want": 300, "cap": 400},
        {"owner": "s:m", "day": 6, "want": 40, "cap": 100},
    ]
    assert await days._reserve_all(batch) == [40, 300, 40, 40, 20, 100, 40]
    assert await days.reserve("s:m", 5, 40, cap=100) == 0
    assert await days.reserve("a:x", 5, 300, cap=400) == 0
