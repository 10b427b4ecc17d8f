"""The pool's bookkeeping on the real databases (SQLite and PostgreSQL)."""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from dataclasses import replace

import pytest
import sqlalchemy as sa
from pool_fakes import FakeSlotStore
from sqlalchemy.ext.asyncio import AsyncEngine

from app.storage.slots.pool_store import SqlPoolState
from pool.errors import StaleSlot
from pool.leases import Queued, SlotPool
from pool.state import (
    NoteRecord,
    PoolChanges,
    PoolSnapshot,
    PoolSurvey,
    QueueRecord,
    SlotRecord,
)

pytestmark = pytest.mark.integration


@pytest.fixture
def state(engine: AsyncEngine) -> SqlPoolState:
    return SqlPoolState(engine)


async def test_changes_round_trip(state: SqlPoolState) -> None:
    leased, reserved = (
        SlotRecord(3, "leased", "k1", 1.0, 2.0),
        SlotRecord(4, "reserved", "k2", 1, 1, 9),
    )
    await state.apply(
        PoolChanges(
            put_slots=[leased, reserved],
            put_queue=[QueueRecord("k3", 1, 5.0, 5.0), QueueRecord("k4", 2, 6.0, 6.0)],
            add_notes=[NoteRecord("k2", "ready", 7.0)],
        )
    )
    # Activity goes to the key's lease, never backwards, never to a reservation.
    await state.record_activity({"k1": 42.0, "k2": 50.0, "gone": 1.0}, {"k4": 43.0, "gone": 1.0})
    await state.record_activity({"k1": 10.0}, {"k4": 10.0})
    snapshot = await state.load()
    assert sorted((r.index, r.sandbox_key, r.last_activity) for r in snapshot.slots) == [
        (3, "k1", 42.0),
        (4, "k2", 1.0),
    ]
    assert [(q.sandbox_key, q.last_seen) for q in snapshot.queue] == [("k3", 5.0), ("k4", 43.0)]
    assert [(n.sandbox_key, n.kind) for n in snapshot.notes] == [("k2", "ready")]
    # A held slot changes only from the record its writer saw there.
    resetting = SlotRecord(3, "resetting", "k1", 3.0, 3.0)
    changes = PoolChanges(drop_queue=["k3"], drop_notes=["k2"])
    changes.put_slot(resetting, replace(leased, last_activity=42.0))
    await state.apply(changes)
    snapshot = await state.load()
    assert [q.sandbox_key for q in snapshot.queue] == ["k4"]
    assert snapshot.notes == []
    assert {r.index: r.state for r in snapshot.slots} == {3: "resetting", 4: "reserved"}


@pytest.mark.parametrize(
    "write",
    [
        # A second key for a held slot, from a view that thought it free.
        lambda c: c.put_slot(SlotRecord(4, "leased", "intruder", 1.0, 1.0), None),
        # The same key twice.
        lambda c: c.put_slot(SlotRecord(7, "leased", "k2", 1.0, 1.0), None),
        # Handing on a slot from a stale record of it.
        lambda c: c.put_slot(
            SlotRecord(4, "reserved", "k9", 1.0, 1.0, 9.0), SlotRecord(4, "resetting", "k2", 1, 1)
        ),
    ],
)
async def test_a_write_from_a_stale_view_fails_loudly_and_changes_nothing(
    state: SqlPoolState, write: Callable[[PoolChanges], None]
) -> None:
    await state.apply(PoolChanges(put_slots=[SlotRecord(4, "reserved", "k2", 1, 1, 9)]))
    changes = PoolChanges(put_queue=[QueueRecord("k5", 1, 5.0, 5.0)])
    write(changes)
    with pytest.raises(StaleSlot):
        await state.apply(changes)
    snapshot = await state.load()
    assert [(r.index, r.sandbox_key, r.state) for r in snapshot.slots] == [(4, "k2", "reserved")]
    assert snapshot.queue == []  # the whole batch rolled back


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


def surveyed_from_snapshot(snapshot: PoolSnapshot, key: str, size: int) -> PoolSurvey:
    """What ``survey`` must say, computed from the whole pool (as view did before)."""
    slots = [r for r in snapshot.slots if r.index < size]
    holders = {r.sandbox_key for r in slots if r.sandbox_key is not None}
    queue = [q for q in snapshot.queue if q.sandbox_key not in holders]
    leased = [r.index for r in slots if r.sandbox_key == key and r.state == "leased"]
    return PoolSurvey(
        leased_index=leased[0] if leased else None,
        queue_position=next((n for n, q in enumerate(queue, 1) if q.sandbox_key == key), None),
        held=len(slots),
        reserved=sum(r.state == "reserved" for r in slots),
        queued=len(queue),
        oldest_enqueued_at=queue[0].enqueued_at if queue else None,
    )


async def test_a_survey_counts_what_the_whole_pool_says(state: SqlPoolState) -> None:
    """sandbox_status reads these counts on every call instead of the whole pool (issue 13):
    a retired slot (past the size) is not counted and its holder waits like anyone; a
    stale queue entry of a holder is not a place in the queue."""
    await state.apply(
        PoolChanges(
            put_slots=[
                SlotRecord(0, "leased", "k1", 1.0, 2.0),
                SlotRecord(1, "reserved", "k2", 1.0, 1.0, 99.0),
                SlotRecord(2, "resetting", "k3", 1.0, 1.0),
                SlotRecord(5, "leased", "k9", 1.0, 1.0),
            ],
            put_queue=[
                QueueRecord("k4", 1, 10.0, 10.0),
                QueueRecord("k1", 2, 11.0, 11.0),
                QueueRecord("k5", 3, 12.0, 12.0),
                QueueRecord("k9", 4, 13.0, 13.0),
            ],
        )
    )
    snapshot = await state.load()
    expected = {
        "k1": (0, None),
        "k2": (None, None),
        "k4": (None, 1),
        "k5": (None, 2),
        "k9": (None, 3),
        "nobody": (None, None),
    }
    for key, (leased, position) in expected.items():
        survey = await state.survey(key, 4)
        assert survey == surveyed_from_snapshot(snapshot, key, 4), key
        assert (survey.leased_index, survey.queue_position) == (leased, position), key
    assert await state.survey("k5", 4) == PoolSurvey(None, 2, 3, 1, 3, 10.0)
    # With room for slot 5, k9 holds it and waits no more.
    assert await state.survey("k9", 6) == PoolSurvey(5, None, 4, 1, 2, 10.0)
    empty = SqlPoolState(state._engine)
    await state.apply(PoolChanges(free_slots=[0, 1, 2, 5], drop_queue=["k1", "k4", "k5", "k9"]))
    assert await empty.survey("k1", 4) == PoolSurvey(None, None, 0, 0, 0, None)


async def test_a_burst_of_first_calls_takes_a_few_transactions_not_one_a_lease(
    engine: AsyncEngine,
) -> None:
    """Issue 26's burst: 100 first leases were 100 transactions in turn under the pool's
    lock. The ones that arrive while a lease is written are written together, and each
    is on the disk (the database's own rows) before its caller hears of it."""
    state = SqlPoolState(engine)
    pool = SlotPool(state, FakeSlotStore(), size=40, idle_timeout_s=600)
    await pool.open()
    commits: list[int] = []

    def listener(_connection: object) -> None:
        commits.append(1)

    sa.event.listen(engine.sync_engine, "commit", listener)
    try:
        leases = await asyncio.gather(*(pool.acquire(f"k{i}") for i in range(40)))
    finally:
        sa.event.remove(engine.sync_engine, "commit", listener)
    assert sorted(lease.slot.index for lease in leases) == list(range(40))
    # The first caller's lease alone, then the 39 that queued behind its write.
    assert len(commits) == 2
    stored = {r.sandbox_key: r.index for r in (await SqlPoolState(engine).load()).slots}
    assert stored == {lease.sandbox_key: lease.slot.index for lease in leases}
    pool.check_invariants()
