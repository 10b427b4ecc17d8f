"""The pool's bookkeeping on the real databases (SQLite and PostgreSQL)."""

from __future__ import annotations

import pytest
from pool_fakes import FakeSlotStore
from sqlalchemy.ext.asyncio import AsyncEngine

from app.storage.pool_store import SqlPoolState
from pool.leases import Queued, SlotPool
from pool.state import NoteRecord, PoolChanges, QueueRecord, SlotRecord

pytestmark = pytest.mark.integration


@pytest.fixture
def state(engine: AsyncEngine) -> SqlPoolState:
    return SqlPoolState(engine)


async def test_changes_round_trip(state: SqlPoolState) -> None:
    await state.apply(
        PoolChanges(
            put_slots=[
                SlotRecord(3, "leased", "k1", 1.0, 2.0),
                SlotRecord(4, "reserved", "k2", 1, 1, 9),
            ],
            put_queue=[QueueRecord("k3", 1, 5.0, 5.0), QueueRecord("k4", 2, 6.0, 6.0)],
            add_notes=[NoteRecord("k2", "ready", 7.0)],
        )
    )
    # A key moves from one slot to another in one batch (unique column on the key).
    await state.apply(
        PoolChanges(put_slots=[SlotRecord(5, "leased", "k1", 3.0, 3.0)], free_slots=[3])
    )
    await state.record_activity({5: 42.0, 99: 1.0}, {"k4": 43.0, "gone": 1.0})
    snapshot = await state.load()
    assert sorted((r.index, r.sandbox_key, r.last_activity) for r in snapshot.slots) == [
        (4, "k2", 1.0),
        (5, "k1", 42.0),
    ]
    assert [(q.sandbox_key, q.last_seen) for q in snapshot.queue] == [("k3", 5.0), ("k4", 43.0)]
    assert [(n.sandbox_key, n.kind) for n in snapshot.notes] == [("k2", "ready")]
    await state.apply(PoolChanges(drop_queue=["k3"], drop_notes=["k2"]))
    snapshot = await state.load()
    assert [q.sandbox_key for q in snapshot.queue] == ["k4"]
    assert snapshot.notes == []


async def test_a_pool_on_the_database_survives_a_restart(state: SqlPoolState) -> None:
    pool = SlotPool(state, FakeSlotStore(), size=2, idle_timeout_s=600)
    await pool.open()
    a = await pool.acquire("a")
    await pool.acquire("b")
    for key in ("c", "d"):
        with pytest.raises(Queued):
            await pool.acquire(key)
    await pool.release("b")
    pool.touch("a")
    await pool.flush_activity()

    reopened = SlotPool(state, FakeSlotStore(), size=2, idle_timeout_s=600)
    await reopened.open()
    reopened.check_invariants()
    assert (await reopened.acquire("a")).slot == a.slot
    assert (await reopened.acquire("c")).notes == ("ready",)
    with pytest.raises(Queued) as caught:
        await reopened.acquire("d")
    assert caught.value.position == 1
