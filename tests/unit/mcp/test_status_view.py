"""``sandbox_status``'s kept answers: reused while the pool stays the same, never stale."""

from __future__ import annotations

import pytest
from pool_fakes import FakeSlotStore, MemoryPoolState

from app.mcp.status_view import StatusView
from pool.leases import Queued, SlotPool


class Clock:
    def __init__(self) -> None:
        self.now = 1_000.0

    def __call__(self) -> float:
        return self.now


async def test_the_answer_follows_every_change_of_the_pool_at_once() -> None:
    clock = Clock()
    pool = SlotPool(MemoryPoolState(), FakeSlotStore(), size=1, idle_timeout_s=60, clock=clock)
    await pool.open()
    status = StatusView(pool)
    before = await status.of("a")
    assert (before.holds_slot, before.pool_free, before.pool_queued) == (False, 1, 0)
    assert await status.of("a") is before  # kept while nothing changed

    await pool.acquire("a")  # taken
    taken = await status.of("a")
    assert (taken.holds_slot, taken.slot, taken.pool_free) == (True, "slot-000", 0)
    assert (await status.of("b")).holds_slot is False

    with pytest.raises(Queued):
        await pool.acquire("b")  # queued
    assert (await status.of("b")).queue_position == 1
    assert (await status.of("a")).pool_queued == 1

    assert await pool.release("a")  # freed: reserved for the queue's head
    freed = await status.of("a")
    assert (freed.holds_slot, freed.pool_free, freed.pool_queued) == (False, 0, 0)
    assert (await status.of("b")).queue_position is None

    await pool.acquire("b")  # the reservation claimed
    assert (await status.of("b")).holds_slot is True

    clock.now += 120  # idle past the timeout: the watchdog's sweep frees the slot
    assert await pool.expire() == 1
    swept = await status.of("b")
    assert (swept.holds_slot, swept.pool_free) == (False, 1)


async def test_a_pool_replaced_from_its_storage_is_seen_at_once() -> None:
    state = MemoryPoolState()
    pool = SlotPool(state, FakeSlotStore(), size=2, idle_timeout_s=60)
    await pool.open()
    status = StatusView(pool)
    assert (await status.of("a")).pool_free == 2
    other = SlotPool(state, FakeSlotStore(), size=2, idle_timeout_s=60)
    await other.open()
    await other.acquire("a")
    await pool.open()  # the memory re-read from the storage (a restart's load)
    assert (await status.of("a")).holds_slot is True
