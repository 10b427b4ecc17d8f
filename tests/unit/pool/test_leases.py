"""Leases, the FIFO queue and expiry, on fakes of the slot store and the state store."""

from __future__ import annotations

import asyncio

import pytest
from pool_fakes import FakeSlotStore, MemoryPoolState

from pool.leases import Lease, Queued, SlotPool
from pool.slots import Slot
from pool.state import PoolChanges


class Clock:
    def __init__(self) -> None:
        self.now = 1_000.0

    def __call__(self) -> float:
        return self.now


async def make_pool(
    size: int,
    *,
    state: MemoryPoolState | None = None,
    clock: Clock | None = None,
    idle: float = 600,
) -> tuple[SlotPool, FakeSlotStore, MemoryPoolState, Clock]:
    store, state, clock = FakeSlotStore(), state or MemoryPoolState(), clock or Clock()
    pool = SlotPool(state, store, size=size, idle_timeout_s=idle, clock=clock)
    await pool.open()
    return pool, store, state, clock


async def queued(pool: SlotPool, key: str) -> Queued:
    with pytest.raises(Queued) as caught:
        await pool.acquire(key)
    return caught.value


async def test_first_call_takes_a_slot_and_later_calls_keep_it() -> None:
    pool, _, state, _ = await make_pool(3)
    first = await pool.acquire("alice")
    again = await pool.acquire("alice")
    assert first.slot == again.slot
    assert first.notes == ()
    assert again.notes == ()
    assert pool.stats().busy == 1
    assert pool.stats().free == 2
    assert state.slots[first.slot.index].sandbox_key == "alice"
    pool.check_invariants()


async def test_when_full_callers_queue_in_arrival_order_and_keep_their_place() -> None:
    pool, _, state, _ = await make_pool(1)
    await pool.acquire("holder")
    first = await queued(pool, "w1")
    second = await queued(pool, "w2")
    assert (first.position, second.position) == (1, 2)
    assert (await queued(pool, "w1")).position == 1  # calling again keeps the place
    assert first.code == "SANDBOX_QUEUED"
    assert first.details["estimated_wait_s"] == first.estimated_wait_s > 0
    assert [q.sandbox_key for q in sorted(state.queue.values(), key=lambda q: q.seq)] == [
        "w1",
        "w2",
    ]
    pool.check_invariants()


async def test_a_freed_slot_is_reserved_for_the_head_with_a_one_time_ready_note() -> None:
    pool, store, _, _ = await make_pool(1)
    lease = await pool.acquire("holder")
    await queued(pool, "w1")
    await queued(pool, "w2")
    assert await pool.release("holder")
    assert store.resets == [lease.slot.index]
    assert pool.stats().reserved == 1
    assert (await queued(pool, "w2")).position == 1  # w1 holds the reservation now
    granted = await pool.acquire("w1")
    assert granted.slot == lease.slot
    assert granted.notes == ("ready",)
    assert (await pool.acquire("w1")).notes == ()  # shown once, never twice
    pool.check_invariants()


async def test_idle_lease_is_emptied_and_the_next_call_gets_a_fresh_sandbox_with_a_note() -> None:
    pool, store, _, clock = await make_pool(2, idle=600)
    old = await pool.acquire("alice")
    clock.now += 599
    assert await pool.expire() == 0
    clock.now += 2
    assert await pool.expire() == 1
    assert store.resets == [old.slot.index]
    assert pool.lease_of("alice") is None
    fresh = await pool.acquire("alice")
    assert fresh.notes == ("emptied",)
    assert (await pool.acquire("alice")).notes == ()
    pool.check_invariants()


async def test_activity_and_running_jobs_keep_a_sandbox_alive() -> None:
    pool, store, _, clock = await make_pool(2, idle=600)
    await pool.acquire("alice")
    await pool.acquire("bob")
    clock.now += 500
    pool.touch("alice")
    clock.now += 200
    assert await pool.expire(is_busy=lambda key: key == "bob") == 0
    assert store.resets == []
    clock.now += 601
    assert await pool.expire() == 2


async def test_unclaimed_reservation_passes_to_the_next_in_line() -> None:
    pool, _, _, clock = await make_pool(1, idle=600)
    await pool.acquire("holder")
    await queued(pool, "w1")
    await queued(pool, "w2")
    await pool.release("holder")
    clock.now += 300
    await queued(pool, "w2")  # w2 stays active; w1 never comes back
    clock.now += 301
    await pool.expire()
    assert (await pool.acquire("w2")).notes == ("ready",)
    assert (await queued(pool, "w1")).position == 1  # w1 lost its turn and queues again
    pool.check_invariants()


async def test_a_silent_queue_place_is_dropped() -> None:
    pool, _, state, clock = await make_pool(1, idle=600)
    await pool.acquire("holder")
    await queued(pool, "w1")
    clock.now += 601
    pool.touch("holder")
    await pool.expire()
    assert pool.stats().queued == 0
    assert state.queue == {}


async def test_state_survives_a_restart() -> None:
    state, clock = MemoryPoolState(), Clock()
    pool, _, _, _ = await make_pool(2, state=state, clock=clock)
    a = await pool.acquire("a")
    await pool.acquire("b")
    await queued(pool, "c")
    await queued(pool, "d")
    await pool.release("b")  # c gets a reservation
    pool.touch("a")
    await pool.flush_activity()

    reopened, _, _, _ = await make_pool(2, state=state, clock=clock)
    reopened.check_invariants()
    assert (await reopened.acquire("a")).slot == a.slot
    assert (await reopened.acquire("c")).notes == ("ready",)
    assert (await queued(reopened, "d")).position == 1
    assert (await queued(reopened, "e")).position == 2


async def test_a_reset_interrupted_by_a_crash_is_finished_at_start() -> None:
    state = MemoryPoolState()
    pool, store, _, _ = await make_pool(1, state=state)
    lease = await pool.acquire("a")

    async def crash(_: object) -> None:
        raise RuntimeError("power cut")

    store.reset = crash  # type: ignore[method-assign,assignment]
    with pytest.raises(RuntimeError):
        await pool.release("a")
    assert state.slots[lease.slot.index].state == "resetting"

    reopened, new_store, _, _ = await make_pool(1, state=state)
    assert new_store.resets == [lease.slot.index]
    assert (await reopened.acquire("b")).slot == lease.slot


async def test_waiting_in_the_queue_wakes_when_granted() -> None:
    pool, _, _, _ = await make_pool(1)
    await pool.acquire("holder")
    await queued(pool, "w1")
    waiter = asyncio.create_task(pool.wait_until_granted("w1", timeout_s=5))
    await asyncio.sleep(0)
    assert not waiter.done()
    await pool.release("holder")
    assert await waiter is True
    assert await pool.wait_until_granted("nobody-queued", timeout_s=0.01) is False


async def test_fairness_under_load_pool_of_50_and_200_keys() -> None:
    pool, _, _, _ = await make_pool(50)
    keys = [f"key-{i:03d}" for i in range(200)]

    async def call(key: str) -> int | None:
        try:
            return (await pool.acquire(key)).slot.index
        except Queued as q:
            return -q.position

    results = await asyncio.gather(*(call(k) for k in keys))
    pool.check_invariants()
    holders = [k for k, r in zip(keys, results, strict=True) if r is not None and r >= 0]
    waiting = sorted((-r, k) for k, r in zip(keys, results, strict=True) if r is not None and r < 0)
    assert len(holders) == 50
    assert len({r for r in results if r is not None and r >= 0}) == 50  # no slot held twice
    assert [pos for pos, _ in waiting] == list(range(1, 151))
    # Arrival order is the order of the gather: the queue must match it exactly.
    assert [k for _, k in waiting] == keys[50:]
    served = []
    for holder in holders:
        await pool.release(holder)
        pool.check_invariants()
        head = keys[50 + len(served)]
        lease = await pool.acquire(head)
        assert lease.notes == ("ready",)
        served.append(head)
        pool.check_invariants()
    assert served == keys[50:100]
    assert pool.stats().queued == 100


async def test_a_lease_active_again_while_the_watchdog_empties_others_is_kept() -> None:
    pool, store, _, clock = await make_pool(3, idle=600)
    for key in ("alice", "bob", "carol"):
        await pool.acquire(key)
    clock.now += 601
    emptied: list[str] = []

    async def before_reset(key: str) -> None:
        emptied.append(key)
        pool.touch("carol")  # carol calls while alice's sandbox is being emptied

    pool._before_reset = before_reset
    assert await pool.expire() == 2
    assert emptied == ["alice", "bob"]
    assert pool.lease_of("carol") is not None
    assert store.resets == [0, 1]


class SlowResetStore(FakeSlotStore):
    """A reset that lasts until the test lets it end (zfs-fuse took 3.5 s in CI)."""

    def __init__(self) -> None:
        super().__init__()
        self.started = asyncio.Event()
        self.finish = asyncio.Event()

    async def reset(self, slot: Slot) -> None:
        self.started.set()
        await self.finish.wait()
        await super().reset(slot)


async def test_a_key_calling_while_its_old_sandbox_is_emptied_waits_for_that_slot() -> None:
    """Seen in CI: the key's next call took another free slot while its emptied one was
    still resetting; the database (one slot row per key) refused it, and the agent got
    SANDBOX_UNAVAILABLE. It queues instead, and gets its old slot, empty, with the notes."""
    store, state, clock = SlowResetStore(), MemoryPoolState(), Clock()
    pool = SlotPool(state, store, size=2, idle_timeout_s=600, clock=clock)
    await pool.open()
    old = await pool.acquire("alice")
    clock.now += 601
    expiring = asyncio.create_task(pool.expire())
    await store.started.wait()
    waiting = await queued(pool, "alice")  # not a second slot while the first is emptied
    assert waiting.position == 1
    assert [r.sandbox_key for r in pool._slots.values()] == ["alice"]
    store.finish.set()
    assert await expiring == 1
    fresh = await pool.acquire("alice")
    assert fresh.slot.index == old.slot.index
    assert fresh.notes == ("emptied", "ready")
    pool.check_invariants()


class HeldWrites(MemoryPoolState):
    """A state store whose writes wait until ``released`` (a slow database)."""

    def __init__(self) -> None:
        super().__init__()
        self.released = asyncio.Event()
        self.waiting = 0
        self.second_write = asyncio.Event()

    async def apply(self, changes: object) -> None:
        self.waiting += 1
        if self.waiting == 2:
            self.second_write.set()
        await self.released.wait()
        await super().apply(changes)  # type: ignore[arg-type]


async def test_a_key_holding_its_lease_is_not_held_behind_another_keys_lease_write() -> None:
    """A burst: every call of a sandbox that already holds its slot used to wait for the
    pool's lock behind the burst's first leases, each written in turn."""
    state = HeldWrites()
    state.released.set()
    pool, _, _, clock = await make_pool(3, state=state)
    alice = await pool.acquire("alice")
    state.released.clear()
    bob = asyncio.create_task(pool.acquire("bob"))  # a new lease: its write is held
    await state.second_write.wait()
    clock.now += 5
    again = await asyncio.wait_for(pool.acquire("alice"), 5)
    assert again.slot == alice.slot
    assert again.notes == ()
    assert not bob.done()
    state.released.set()
    assert (await bob).slot != alice.slot
    # Alice's activity counts from that call (the idle timeout starts again from it).
    assert pool._idle_leases[alice.slot.index] == clock.now
    pool.check_invariants()


class GatedWrites(MemoryPoolState):
    """A state store that records every write, holds each one until ``open`` is set (a
    slow database), and fails the writes whose number is in ``failing``."""

    def __init__(self, failing: tuple[int, ...] = ()) -> None:
        super().__init__()
        self.open = asyncio.Event()
        self.open.set()
        self.writes: list[PoolChanges] = []
        self.failing = failing
        self.writing = asyncio.Event()

    async def apply(self, changes: PoolChanges) -> None:
        self.writes.append(changes)
        self.writing.set()
        await self.open.wait()
        if len(self.writes) in self.failing:
            raise OSError("the database is away")
        await super().apply(changes)


async def settle() -> None:
    for _ in range(20):
        await asyncio.sleep(0)


async def test_first_calls_that_arrive_during_a_lease_write_are_written_together() -> None:
    """A burst of first calls: each lease was its own transaction, written in turn under
    the pool's lock, so the last of 100 waited 100 writes (issue 26's burst)."""
    state = GatedWrites()
    pool, _, _, _ = await make_pool(12, state=state)
    state.open.clear()
    first = asyncio.create_task(pool.acquire("k0"))
    await state.writing.wait()  # k0's write is at the database
    rest = [asyncio.create_task(pool.acquire(f"k{i}")) for i in range(1, 11)]
    await settle()
    state.open.set()
    leases = await asyncio.gather(first, *rest)
    assert len(state.writes) == 2  # k0's, then one for the ten that came meanwhile
    assert [len(w.put_slots) for w in state.writes] == [1, 10]
    # Each as if it came alone, in arrival order: the lowest free slot first.
    assert [lease.slot.index for lease in leases] == list(range(11))
    assert {i: r.sandbox_key for i, r in state.slots.items()} == {i: f"k{i}" for i in range(11)}
    pool.check_invariants()


async def test_a_batch_hands_out_the_free_slots_then_queue_places_in_arrival_order() -> None:
    state = GatedWrites()
    pool, _, _, _ = await make_pool(3, state=state)
    state.open.clear()
    first = asyncio.create_task(pool.acquire("a"))
    await state.writing.wait()
    rest = [asyncio.create_task(pool.acquire(key)) for key in ("b", "c", "d", "e", "b")]
    await settle()
    state.open.set()
    outcomes = await asyncio.gather(first, *rest, return_exceptions=True)
    assert [o.slot.index for o in outcomes[:3] if isinstance(o, Lease)] == [0, 1, 2]
    # Each as it was when its turn came: d first, alone in the queue.
    assert [(o.position, o.details["queued"]) for o in outcomes[3:5] if isinstance(o, Queued)] == [
        (1, 1),
        (2, 2),
    ]
    assert isinstance(outcomes[5], Lease)
    assert outcomes[5].slot.index == 1  # b again: its lease kept
    assert len(state.writes) == 2
    assert [q.sandbox_key for q in sorted(state.queue.values(), key=lambda q: q.seq)] == [
        "d",
        "e",
    ]
    pool.check_invariants()


async def test_a_failed_batch_write_fails_its_callers_only() -> None:
    """The callers behind it are decided by the next batch, from the memory as it is."""
    state = GatedWrites(failing=(2,))
    pool, _, _, _ = await make_pool(5, state=state)
    state.open.clear()
    first = asyncio.create_task(pool.acquire("a"))
    await state.writing.wait()
    batch = [asyncio.create_task(pool.acquire(key)) for key in ("b", "c")]
    await settle()
    state.open.set()
    assert (await first).slot.index == 0
    failed = await asyncio.gather(*batch, return_exceptions=True)
    assert [type(outcome) for outcome in failed] == [OSError, OSError]
    assert (await pool.acquire("d")).slot.index == 3
    assert len(state.writes) == 3


async def test_a_caller_that_goes_away_before_its_decision_is_not_written() -> None:
    state = GatedWrites()
    pool, _, _, _ = await make_pool(5, state=state)
    state.open.clear()
    first = asyncio.create_task(pool.acquire("a"))
    await state.writing.wait()
    gone = asyncio.create_task(pool.acquire("gone"))
    stays = asyncio.create_task(pool.acquire("stays"))
    await settle()
    gone.cancel()
    await settle()
    state.open.set()
    await first
    assert (await stays).slot.index == 1
    with pytest.raises(asyncio.CancelledError):
        await gone
    assert "gone" not in {r.sandbox_key for r in state.slots.values()}
    assert pool.lease_of("gone") is None
    pool.check_invariants()


async def test_a_batch_whose_deciding_caller_goes_away_is_decided_by_the_next() -> None:
    """Cancelled mid-write, the caller that held the batch leaves it to the next one."""
    state = GatedWrites()
    pool, _, _, _ = await make_pool(5, state=state)
    await pool.acquire("holder")
    state.open.clear()
    state.writing.clear()
    first = asyncio.create_task(pool.acquire("a"))
    await state.writing.wait()
    state.writing.clear()
    behind = [asyncio.create_task(pool.acquire(key)) for key in ("b", "c")]
    await settle()
    first.cancel()  # while "a"'s write waits at the database
    with pytest.raises(asyncio.CancelledError):
        await first
    state.open.set()
    assert [(await task).slot.index for task in behind] == [2, 3]
    assert {r.sandbox_key for r in state.slots.values()} >= {"holder", "b", "c"}
    pool.check_invariants()
