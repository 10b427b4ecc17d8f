"""Two pools on one real PostgreSQL, as two server processes would run them (issue 14).

Each "process" is a ``SlotPool`` with its own engine, its own memory and its own
slot store, sharing only the database, and both read one controllable clock. The
first three tests are the three bugs of the issue, reproduced with the landed
code: both processes gave slot 0 to different keys; the second process's queue
entry failed on the unique sequence; a release on one process reset a slot the
other was still serving.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from dataclasses import dataclass

import pytest
import sqlalchemy as sa
from db_testkit import fresh_postgres
from pool_fakes import FakeSlotStore

from app.mcp.status_view import StatusView
from app.storage.db import create_engine, upgrade_schema
from app.storage.slots.pool_pg_store import PgLeadership, PgPoolState, pool_state_for
from pool.leases import Queued, SlotPool
from pool.state import PoolChanges, SlotRecord
from pool.watchdog import IdleWatchdog

pytestmark = pytest.mark.integration


class Clock:
    def __init__(self) -> None:
        self.now = 1_000.0

    def __call__(self) -> float:
        return self.now


@dataclass
class Process:
    pool: SlotPool
    store: FakeSlotStore
    state: PgPoolState


@dataclass
class Cluster:
    url: str
    clock: Clock
    processes: list[Process]

    async def start(self, *, size: int, idle_timeout_s: float = 600) -> Process:
        engine = create_engine(self.url)
        state = pool_state_for(engine)
        assert isinstance(state, PgPoolState)
        store = FakeSlotStore()
        pool = SlotPool(state, store, size=size, idle_timeout_s=idle_timeout_s, clock=self.clock)
        await pool.open()
        process = Process(pool, store, state)
        self.processes.append(process)
        return process


@pytest.fixture
async def cluster() -> AsyncIterator[Cluster]:
    async with fresh_postgres() as url:
        engine = create_engine(url)
        await upgrade_schema(engine)
        await engine.dispose()
        running = Cluster(url, Clock(), [])
        try:
            yield running
        finally:
            for process in running.processes:
                await process.pool.close()
                await process.state._engine.dispose()


async def rows(url: str) -> list[tuple[int, str, str | None]]:
    engine = create_engine(url)
    try:
        async with engine.connect() as conn:
            result = await conn.execute(
                sa.text("SELECT slot_index, state, sandbox_key FROM pool_slots ORDER BY 1")
            )
            return [(r[0], r[1], r[2]) for r in result]
    finally:
        await engine.dispose()


async def test_a_slot_leased_through_one_process_is_not_leased_again_through_another(
    cluster: Cluster,
) -> None:
    a, b = await cluster.start(size=1), await cluster.start(size=1)
    assert (await a.pool.acquire("k1")).slot.index == 0
    with pytest.raises(Queued) as queued:
        await b.pool.acquire("k2")
    assert queued.value.position == 1
    assert await rows(cluster.url) == [(0, "leased", "k1")]
    # Both processes see the same pool, whichever took the slot.
    assert (await b.pool.holding("k1")) == a.store.slot(0)
    assert (await a.pool.view("k2")).queue_position == 1


async def test_callers_queued_through_different_processes_share_one_queue(
    cluster: Cluster,
) -> None:
    a, b = await cluster.start(size=1), await cluster.start(size=1)
    await a.pool.acquire("k1")
    positions = []
    for process, key in [(a, "k2"), (b, "k3"), (a, "k4"), (b, "k2")]:
        with pytest.raises(Queued) as queued:
            await process.pool.acquire(key)
        positions.append((key, queued.value.position))
    # k2 calling again through the other process keeps its place.
    assert positions == [("k2", 1), ("k3", 2), ("k4", 3), ("k2", 1)]
    view = await b.pool.view("k4")
    assert (view.queue_position, view.stats.queued, view.stats.free) == (3, 3, 0)


async def test_a_view_counts_in_the_database_without_reading_the_whole_pool(
    cluster: Cluster, monkeypatch: pytest.MonkeyPatch
) -> None:
    """sandbox_status on a shared pool read every slot, queue entry and note per call
    (226 calls/s against 1,129 on SQLite, issue 13); the view is counted by PostgreSQL."""
    a, b = await cluster.start(size=2), await cluster.start(size=2)
    await a.pool.acquire("k1")
    await b.pool.acquire("k2")
    for process, key in [(a, "k3"), (b, "k4")]:
        with pytest.raises(Queued):
            await process.pool.acquire(key)

    async def whole_pool() -> None:
        raise AssertionError("the view read the whole pool")

    monkeypatch.setattr(b.state, "load", whole_pool)
    mine = await b.pool.view("k1")
    assert mine.slot == b.store.slot(0)
    assert mine.queue_position is None
    waiting = await b.pool.view("k4")
    assert (waiting.slot, waiting.queue_position) == (None, 2)
    stats = waiting.stats
    assert (stats.size, stats.busy, stats.free, stats.reserved, stats.queued) == (2, 2, 0, 0, 2)
    assert stats.oldest_wait_s == 0.0  # the clock has not moved since k3 queued
    cluster.clock.now += 30
    assert (await b.pool.current_stats()).oldest_wait_s == 30.0


async def test_a_release_hands_the_slot_to_the_head_waiting_on_another_process(
    cluster: Cluster,
) -> None:
    a, b = await cluster.start(size=1), await cluster.start(size=1)
    await a.pool.acquire("k1")
    with pytest.raises(Queued):
        await b.pool.acquire("k2")
    # B's caller waits; A's release must wake it through PostgreSQL, not a timeout.
    waiter = asyncio.create_task(b.pool.wait_until_granted("k2", 60))
    await asyncio.sleep(0.2)
    assert await a.pool.release("k1")
    assert await asyncio.wait_for(waiter, 30) is True
    assert a.store.resets == [0]
    assert b.store.resets == []
    assert await rows(cluster.url) == [(0, "reserved", "k2")]
    # The one-time note is shown once, whichever process the next calls reach.
    assert (await b.pool.acquire("k2")).notes == ("ready",)
    assert (await a.pool.acquire("k2")).notes == ()
    # k1 comes back as a newcomer: the slot is k2's now.
    with pytest.raises(Queued):
        await a.pool.acquire("k1")
    assert await rows(cluster.url) == [(0, "leased", "k2")]


async def test_concurrent_callers_on_three_processes_are_served_in_arrival_order(
    cluster: Cluster,
) -> None:
    processes = [await cluster.start(size=2) for _ in range(3)]
    await processes[0].pool.acquire("holder-0")
    await processes[1].pool.acquire("holder-1")

    async def arrive(index: int) -> None:
        with pytest.raises(Queued):
            await processes[index % 3].pool.acquire(f"w{index:02d}")

    await asyncio.gather(*(arrive(i) for i in range(12)))
    positions = {}
    for index in range(12):
        view = await processes[(index + 1) % 3].pool.view(f"w{index:02d}")
        positions[view.queue_position] = f"w{index:02d}"
    assert sorted(positions) == list(range(1, 13))  # one queue, no place given twice
    arrival = [positions[place] for place in range(1, 13)]
    served: list[str] = []
    holders = ["holder-0", "holder-1"]
    while len(served) < len(arrival):
        # The oldest holder leaves through whichever process; the next in line is
        # served through yet another one.
        releasing = holders.pop(0)
        releaser = processes[len(served) % 3]
        assert await releaser.pool.release(releasing)
        await releaser.pool.refresh()
        granted = [key for key in arrival if key not in served and key in releaser.pool.holders()]
        assert granted == [arrival[len(served)]]
        lease = await processes[(len(served) + 1) % 3].pool.acquire(granted[0])
        assert lease.notes == ("ready",)
        served.append(granted[0])
        holders.append(granted[0])
        keys = [key for _, _, key in await rows(cluster.url)]
        assert len(keys) == len(set(keys)) == 2
    assert served == arrival


async def test_exactly_one_watchdog_and_a_takeover_when_its_process_dies(
    cluster: Cluster,
) -> None:
    electors = [PgLeadership(create_engine(cluster.url)) for _ in range(3)]
    try:
        first = [await e.is_leader() for e in electors]
        assert first.count(True) == 1
        again = [await e.is_leader() for e in electors]
        assert again == first  # the holder keeps it; the others stay out
        # The holder's process dies: its connection drops (kill -9 closes the socket).
        leader = electors[first.index(True)]
        assert leader._connection is not None
        leader._connection.terminate()
        leader._connection, leader._leading = None, False
        survivors = [e for e in electors if e is not leader]
        deadline = asyncio.get_running_loop().time() + 10
        while not any([await e.is_leader() for e in survivors]):
            assert asyncio.get_running_loop().time() < deadline, "nobody took over"
            await asyncio.sleep(0.1)
        assert [await e.is_leader() for e in survivors].count(True) == 1
    finally:
        for elector in electors:
            await elector.close()


async def test_activity_seen_by_any_process_keeps_a_lease_and_idle_ones_expire_once(
    cluster: Cluster,
) -> None:
    a, b = (
        await cluster.start(size=2, idle_timeout_s=100),
        await cluster.start(size=2, idle_timeout_s=100),
    )
    await a.pool.acquire("busy")
    await a.pool.acquire("idle")
    cluster.clock.now += 60
    b.pool.touch("busy")  # a call through B, which never leased it
    await b.pool.flush_activity()
    cluster.clock.now += 60
    assert await a.pool.expire() == 1
    assert await rows(cluster.url) == [(0, "leased", "busy")]
    assert await b.pool.expire() == 0  # nothing left to expire: emptied once
    assert a.store.resets == [1]
    assert b.store.resets == []
    assert (await b.pool.acquire("idle")).notes == ("emptied",)


async def test_a_reset_left_by_a_dead_process_is_finished_by_another_and_only_then(
    cluster: Cluster,
) -> None:
    a = await cluster.start(size=1)
    changes = PoolChanges()
    changes.put_slot(SlotRecord(0, "resetting", "gone", 1.0, 1.0), None)
    await a.state.apply(changes)
    # While a live process holds the slot's claim, nobody else empties it.
    async with a.state.claim_reset(0) as claimed:
        assert claimed
        b = await cluster.start(size=1)
        assert b.store.resets == []
        await b.pool.expire()
        assert b.store.resets == []
    # The claim is gone (its process died): the next tick finishes the reset.
    await b.pool.expire()
    assert b.store.resets == [0]
    assert await rows(cluster.url) == []


async def test_only_the_elected_watchdog_expires_and_every_process_keeps_its_jobs_alive(
    cluster: Cluster,
) -> None:
    a = await cluster.start(size=2, idle_timeout_s=100)
    b = await cluster.start(size=2, idle_timeout_s=100)
    await a.pool.acquire("job-on-b")  # leased through A; its job runs on B
    await a.pool.acquire("idle")
    watchdogs = [
        IdleWatchdog(
            process.pool,
            interval_s=1,
            is_busy=lambda key, mine=mine: key == mine,
            leadership=PgLeadership(create_engine(cluster.url)),
        )
        for process, mine in [(a, "none"), (b, "job-on-b")]
    ]
    try:
        cluster.clock.now += 101
        # B ticks first and is elected: it empties "idle" and keeps its job's lease.
        assert await watchdogs[1].tick() == 1
        # B's process dies; A is elected. B's successor ticks as a follower: it counts
        # its job as activity, so A (which cannot see that job) expires nothing.
        await watchdogs[1]._leadership.close()
        assert await watchdogs[0]._leadership.is_leader()
        cluster.clock.now += 101
        assert await watchdogs[1].tick() == 0  # not the leader: expires nothing itself
        assert await watchdogs[0].tick() == 0
        assert await rows(cluster.url) == [(0, "leased", "job-on-b")]
        assert a.store.resets + b.store.resets == [1]  # "idle" emptied once, by one process
        # Once B stops counting it, the elected watchdog does expire it.
        cluster.clock.now += 101
        assert await watchdogs[0].tick() == 1
    finally:
        for watchdog in watchdogs:
            await watchdog._leadership.close()


async def test_sandbox_status_on_one_process_sees_what_another_just_did(
    cluster: Cluster,
) -> None:
    """``sandbox_status`` keeps answers per pool change; a shared pool's change may come
    from another process, so there every answer is read at once from the database."""
    a, b = await cluster.start(size=1), await cluster.start(size=1)
    status = StatusView(b.pool)
    assert (await status.of("k1")).pool_free == 1
    await a.pool.acquire("k1")  # taken through the other process
    mine = await status.of("k1")
    assert (mine.holds_slot, mine.slot, mine.pool_free) == (True, "slot-000", 0)
    with pytest.raises(Queued):
        await a.pool.acquire("k2")  # queued through the other process
    assert (await status.of("k2")).queue_position == 1
    assert await a.pool.release("k1")  # freed (reserved for k2) through the other process
    assert (await status.of("k1")).holds_slot is False
    assert (await status.of("k2")).pool_queued == 0


async def test_first_calls_queued_behind_a_change_share_one_exclusive_transaction(
    cluster: Cluster,
) -> None:
    """Every change of a shared pool is one transaction under the lock all processes
    take: a burst of first calls to one process takes a few, not one a lease, and the
    other process sees every lease."""
    a, b = await cluster.start(size=30), await cluster.start(size=30)
    taken: list[int] = []
    exclusive = a.state.exclusive

    def counted() -> object:
        taken.append(1)
        return exclusive()

    a.state.exclusive = counted  # type: ignore[method-assign]
    leases = await asyncio.gather(*(a.pool.acquire(f"k{i}") for i in range(20)))
    assert sorted(lease.slot.index for lease in leases) == list(range(20))
    assert len(taken) == 2  # the first caller's, then the 19 behind it together
    assert (await b.pool.acquire("other")).slot.index == 20
    assert [key for _, _, key in await rows(cluster.url)] == [f"k{i}" for i in range(20)] + [
        "other"
    ]
