"""Egress bytes per experiment on the real databases: added atomically, kept, capped."""

from __future__ import annotations

import asyncio

import pytest
from sqlalchemy.ext.asyncio import AsyncEngine

from app.egress.records import Notice, Usage
from app.storage.egress_store import SqlUsageRecords

pytestmark = pytest.mark.integration


async def test_bytes_add_up_and_come_back_after_a_new_store(engine: AsyncEngine) -> None:
    store = SqlUsageRecords(engine)
    assert await store.record({"e1": 100, "e2": 5}) == {
        "e1": Usage(100, False),
        "e2": Usage(5, False),
    }
    assert await store.record({"e1": 50}) == {"e1": Usage(150, False)}
    # A restarted server (a new store on the same database) finds the totals.
    again = SqlUsageRecords(engine)
    assert await again.load(["e1", "e2", "unknown"]) == {
        "e1": Usage(150, False),
        "e2": Usage(5, False),
    }
    assert await again.load([]) == {}


async def test_concurrent_additions_are_never_lost(engine: AsyncEngine) -> None:
    # Two server processes (two stores) adding to one experiment at once.
    stores = [SqlUsageRecords(engine), SqlUsageRecords(engine)]
    await asyncio.gather(*(stores[i % 2].record({"e": 7, f"other{i % 3}": 1}) for i in range(40)))
    loaded = await stores[0].load(["e", "other0", "other1", "other2"])
    assert loaded["e"] == Usage(280, False)
    assert sum(u.bytes for key, u in loaded.items() if key != "e") == 40


async def test_capped_is_kept_and_later_additions_keep_it(engine: AsyncEngine) -> None:
    store = SqlUsageRecords(engine)
    await store.mark_capped("fresh")  # cut before any transfer was logged
    assert await store.load(["fresh"]) == {"fresh": Usage(0, True)}
    await store.record({"e": 10})
    await store.mark_capped("e")
    assert await store.record({"e": 1}) == {"e": Usage(11, True)}


async def test_notices_wait_for_their_container_once_and_the_cap_is_flipped_once(
    engine: AsyncEngine,
) -> None:
    # Two processes: one counted the log, the other runs the experiment's next command.
    counting, running = SqlUsageRecords(engine), SqlUsageRecords(engine)
    refusals = [Notice("c1", "e", "refused", f"host{i}.example:443: no") for i in range(5)]
    totals = await counting.record({"e": 10}, {"e": 5}, refusals, max_pending=3)
    assert totals == {"e": Usage(10, False, 5)}
    flips = await asyncio.gather(
        counting.mark_capped("e", ["c1"]), running.mark_capped("e", ["c1"])
    )
    assert sorted(flips) == [False, True], "one of them stopped it"
    taken = await running.take_notices("c1")
    assert [n.kind for n in taken] == ["refused"] * 3 + ["cap"]  # at most 3 waited
    assert taken[0].text == "host0.example:443: no"
    assert await counting.take_notices("c1") == [], "told once"
    assert await running.load(["e"]) == {"e": Usage(10, True, 5)}


async def test_a_sandbox_day_adds_up_across_experiments_and_a_new_day_starts_afresh(
    engine: AsyncEngine,
) -> None:
    now = [1_000 * 86_400 + 10.0]
    counting = SqlUsageRecords(engine, clock=lambda: now[0])
    running = SqlUsageRecords(engine, clock=lambda: now[0])
    await counting.record({"e1": 100}, sandboxes={"sbx-a": 100})
    await counting.record({"e2": 40, "e3": 2}, sandboxes={"sbx-a": 40, "sbx-b": 2})
    assert await running.sandbox_days(["sbx-a", "sbx-b", "sbx-c"]) == {"sbx-a": 140, "sbx-b": 2}
    flips = await asyncio.gather(
        counting.mark_budget_spent("sbx-a", ["c1", "c2"]),
        running.mark_budget_spent("sbx-a", ["c1"]),
    )
    assert sorted(flips) == [False, True], "one of them stopped it"
    assert [n.kind for n in await running.take_notices("c1")] == ["budget"]
    assert [n.kind for n in await running.take_notices("c2")] == ["budget"]
    now[0] += 86_400  # the next day (UTC)
    assert await running.sandbox_days(["sbx-a"]) == {}
    assert await counting.mark_budget_spent("sbx-a") is True
