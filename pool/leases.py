"""Leases and the FIFO queue: which sandbox key holds which slot, and who waits next.

Invariants, checked by ``check_invariants`` in the tests after every step:
- a sandbox key holds at most one slot (leased or reserved), and a slot at most one key;
- a key that holds a slot is not in the queue;
- a slot is free only while nobody waits (a freed slot goes to the queue's head).

State lives in memory, guarded by one lock, and every change is written
through ``PoolState`` before the caller gets an answer, so a restart finds it
as it was. Activity times are the exception: they are flushed in batches.

Longer than 400 lines for a reason: the pool's state machine (acquire, release,
expire, hand-over, reservations) lives under one lock, so every transition and
its invariants are read in one place.
"""

from __future__ import annotations

import asyncio
import heapq
import math
import time
from collections import OrderedDict, deque
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, replace

import structlog

from pool.errors import PoolError
from pool.slots import Slot, SlotStore
from pool.state import NoteKind, NoteRecord, PoolChanges, PoolState, QueueRecord, SlotRecord

log = structlog.get_logger(__name__)

Clock = Callable[[], float]
KeyHook = Callable[[str], Awaitable[None]]


@dataclass(frozen=True)
class Lease:
    """The caller's slot, and the one-time notes to show it with this call's result."""

    slot: Slot
    sandbox_key: str
    notes: tuple[NoteKind, ...]


@dataclass(frozen=True)
class PoolStats:
    size: int
    busy: int
    free: int
    reserved: int
    queued: int
    oldest_wait_s: float | None


class Queued(PoolError):
    """Every slot is taken: the caller has a place in the queue."""

    def __init__(self, position: int, queued: int, estimated_wait_s: int) -> None:
        super().__init__(
            "SANDBOX_QUEUED",
            f"All sandboxes are busy. You are number {position} in the queue; a sandbox should "
            f"be free in about {estimated_wait_s} s. Call again to keep your place and check "
            "your position.",
            {"position": position, "queued": queued, "estimated_wait_s": estimated_wait_s},
        )
        self.position = position
        self.estimated_wait_s = estimated_wait_s


class SlotPool:
    """Hands out slots to sandbox keys, queues callers when none is free, takes slots back."""

    def __init__(
        self,
        state: PoolState,
        store: SlotStore,
        *,
        size: int,
        idle_timeout_s: float,
        clock: Clock = time.time,
        before_reset: KeyHook | None = None,
        on_reserved: KeyHook | None = None,
    ) -> None:
        self._store = store
        self._state = state
        self.size = size
        self.idle_timeout_s = idle_timeout_s
        self._clock = clock
        self._before_reset = before_reset
        self._on_reserved = on_reserved
        self._lock = asyncio.Lock()
        self._slots: dict[int, SlotRecord] = {}
        self._by_key: dict[str, int] = {}
        self._free: list[int] = []  # a heap: the lowest free index goes first
        self._queue: OrderedDict[str, QueueRecord] = OrderedDict()
        self._notes: dict[str, list[NoteKind]] = {}
        self._next_seq = 1
        # Ordered by last activity (oldest first), so expiry costs what expires.
        self._idle_leases: OrderedDict[int, float] = OrderedDict()
        self._idle_queue: OrderedDict[str, float] = OrderedDict()
        self._reservations: OrderedDict[int, float] = OrderedDict()  # slot -> reserved_until
        self._dirty_activity: dict[int, float] = {}
        self._dirty_seen: dict[str, float] = {}
        self._releases: deque[float] = deque(maxlen=50)
        self._granted: dict[str, asyncio.Event] = {}
        self._resets_running: set[int] = set()

    # -- start-up ---------------------------------------------------------

    async def open(self) -> None:
        """Load the persisted state and finish interrupted resets (the store is open).

        Raises:
            PoolError: the storage fails while finishing a reset.
        """
        snapshot = await self._state.load()
        for record in snapshot.slots:
            if record.index >= self.size:
                continue  # the pool shrank; a lease on a retired slot is dropped below
            self._slots[record.index] = record
            if record.sandbox_key is not None:
                self._by_key[record.sandbox_key] = record.index
            if record.state == "leased":
                self._idle_leases[record.index] = record.last_activity
            elif record.state == "reserved":
                self._reservations[record.index] = record.reserved_until or self._clock()
        for entry in snapshot.queue:
            if entry.sandbox_key not in self._by_key:
                self._queue[entry.sandbox_key] = entry
                self._idle_queue[entry.sandbox_key] = entry.last_seen
            self._next_seq = max(self._next_seq, entry.seq + 1)
        for note in snapshot.notes:
            self._notes.setdefault(note.sandbox_key, []).append(note.kind)
        self._free = [i for i in range(self.size) if i not in self._slots]
        heapq.heapify(self._free)
        self._idle_leases = OrderedDict(sorted(self._idle_leases.items(), key=lambda kv: kv[1]))
        self._idle_queue = OrderedDict(sorted(self._idle_queue.items(), key=lambda kv: kv[1]))
        interrupted = [r.index for r in self._slots.values() if r.state == "resetting"]
        for index in interrupted:
            await self._finish_reset(index)
        log.info(
            "pool.opened",
            leased=len(self._idle_leases),
            reserved=len(self._reservations),
            queued=len(self._queue),
            resumed_resets=len(interrupted),
        )

    # -- the calls of one sandbox key ------------------------------------

    async def acquire(self, key: str) -> Lease:
        """The caller's slot: its lease, its reservation, a free slot, or a queue place.

        Raises:
            Queued: no slot is free; the caller is (still) in the queue.
        """
        async with self._lock:
            now = self._clock()
            changes = PoolChanges()
            index = self._by_key.get(key)
            state = self._slots[index].state if index is not None else None
            if state == "reserved":
                assert index is not None
                changes.put_slots.append(self._claim_reservation(index, now))
            elif state == "leased":
                assert index is not None
                self._touch_locked(index, now)
            elif state is None and self._free and key not in self._queue:
                index = heapq.heappop(self._free)
                record = SlotRecord(index, "leased", key, now, now)
                self._slots[index] = record
                self._by_key[key] = index
                self._idle_leases[index] = now
                changes.put_slots.append(record)
            else:
                # No slot free, or the key's old sandbox is being emptied right now.
                queued = self._enqueue(key, now, changes)
                if changes:
                    await self._state.apply(changes)
                raise queued
            assert index is not None
            notes = tuple(self._notes.pop(key, ()))
            if notes:
                changes.drop_notes.append(key)
            if changes:
                await self._state.apply(changes)
            return Lease(self._store.slot(index), key, notes)

    def touch(self, key: str) -> None:
        """Record activity (a call, a running job) for the key's lease, if it has one."""
        index = self._by_key.get(key)
        if index is not None and self._slots[index].state == "leased":
            self._touch_locked(index, self._clock())

    def lease_of(self, key: str) -> Slot | None:
        """The key's leased slot, without taking one or refreshing anything."""
        index = self._by_key.get(key)
        if index is None or self._slots[index].state != "leased":
            return None
        return self._store.slot(index)

    def next_free(self, n: int) -> list[Slot]:
        """The ``n`` free slots handed out first (lowest index first), without taking any."""
        return [self._store.slot(i) for i in heapq.nsmallest(n, self._free)]

    def holders(self) -> set[str]:
        """Every sandbox key that holds a slot (leased or reserved)."""
        return set(self._by_key)

    def position_of(self, key: str) -> int | None:
        for position, queued in enumerate(self._queue, start=1):
            if queued == key:
                return position
        return None

    async def wait_until_granted(self, key: str, timeout_s: float) -> bool:
        """Wait (bounded) until a queued key gets a reservation; True if it did."""
        if key in self._by_key:
            return True
        event = self._granted.setdefault(key, asyncio.Event())
        try:
            await asyncio.wait_for(event.wait(), timeout_s)
            return True
        except TimeoutError:
            return False
        finally:
            if self._granted.get(key) is event and not event.is_set():
                del self._granted[key]

    # -- taking slots back -------------------------------------------------

    async def release(self, key: str, *, note: NoteKind | None = None) -> bool:
        """Empty the key's sandbox and hand its slot on; False if it held none.

        ``note`` is left for the key's next call (``emptied`` after an idle timeout).
        """
        async with self._lock:
            index = self._by_key.get(key)
            if index is None or self._slots[index].state != "leased":
                return False
            changes = PoolChanges()
            self._start_reset_locked(index, changes)
            if note is not None:
                self._notes.setdefault(key, []).append(note)
                changes.add_notes.append(NoteRecord(key, note, self._clock()))
            await self._state.apply(changes)
        await self._finish_reset(index)
        return True

    async def expire(self, is_busy: Callable[[str], bool] = lambda _: False) -> int:
        """Take back what has been idle for ``idle_timeout_s``; the watchdog calls this.

        Idle leases (unless ``is_busy`` says a job runs), unclaimed reservations and
        silent queue places expire. Returns how many things expired.
        """
        now = self._clock()
        deadline = now - self.idle_timeout_s
        expired = 0
        idle_keys: list[str] = []
        async with self._lock:
            for index, last in list(self._idle_leases.items()):
                if last > deadline:
                    break
                key = self._slots[index].sandbox_key
                assert key is not None
                if is_busy(key):
                    self._touch_locked(index, now)  # a running job is activity
                else:
                    idle_keys.append(key)
            changes = PoolChanges()
            for key, seen in list(self._idle_queue.items()):
                if seen > deadline:
                    break
                del self._idle_queue[key], self._queue[key]
                changes.drop_queue.append(key)
                expired += 1
            granted: list[str] = []
            for index, until in list(self._reservations.items()):
                if until > now:
                    break
                # Nobody claimed it, so nothing was written: pass it on as it is.
                lapsed = self._slots[index].sandbox_key
                self._by_key.pop(lapsed or "", None)
                del self._reservations[index]
                granted += self._hand_on_locked(index, now, changes)
                expired += 1
            if changes:
                await self._state.apply(changes)
        await self._announce(granted)
        for key in idle_keys:
            expired += await self.release(key, note="emptied")
        if expired:
            log.info("pool.expired", count=expired)
        return expired

    async def flush_activity(self) -> None:
        """Persist the activity times gathered since the last flush."""
        activity, seen = self._dirty_activity, self._dirty_seen
        self._dirty_activity, self._dirty_seen = {}, {}
        if activity or seen:
            await self._state.record_activity(activity, seen)

    # -- figures -------------------------------------------------------------

    def stats(self) -> PoolStats:
        reserved = len(self._reservations)
        busy = len(self._slots) - reserved
        oldest = next(iter(self._queue.values()), None)
        return PoolStats(
            size=self.size,
            busy=busy,
            free=len(self._free),
            reserved=reserved,
            queued=len(self._queue),
            oldest_wait_s=round(self._clock() - oldest.enqueued_at, 3) if oldest else None,
        )

    def check_invariants(self) -> None:
        """Raise AssertionError if the bookkeeping contradicts itself (tests call this)."""
        assert len(self._by_key) == sum(1 for r in self._slots.values() if r.sandbox_key)
        for key, index in self._by_key.items():
            assert self._slots[index].sandbox_key == key
            assert key not in self._queue
        assert set(self._free).isdisjoint(self._slots)
        assert len(self._free) + len(self._slots) == self.size
        assert not (self._free and self._queue), "a slot is free while callers wait"

    # -- internals -------------------------------------------------------------

    def _touch_locked(self, index: int, now: float) -> None:
        self._idle_leases[index] = now
        self._idle_leases.move_to_end(index)
        self._dirty_activity[index] = now

    def _enqueue(self, key: str, now: float, changes: PoolChanges) -> Queued:
        entry = self._queue.get(key)
        if entry is None:
            entry = QueueRecord(key, self._next_seq, now, now)
            self._next_seq += 1
            self._queue[key] = entry
            changes.put_queue.append(entry)
        self._idle_queue[key] = now
        self._idle_queue.move_to_end(key)
        self._dirty_seen[key] = now
        position = self.position_of(key) or len(self._queue)
        return Queued(position, len(self._queue), self.estimated_wait_s(position))

    def estimated_wait_s(self, position: int) -> int:
        """From the recent release rate; before any release, from the idle timeout."""
        if len(self._releases) >= 2 and self._releases[-1] > self._releases[0]:
            rate = (len(self._releases) - 1) / (self._releases[-1] - self._releases[0])
            return max(1, math.ceil(position / rate))
        return math.ceil(self.idle_timeout_s * math.ceil(position / self.size))

    def _claim_reservation(self, index: int, now: float) -> SlotRecord:
        record = replace(self._slots[index], state="leased", last_activity=now, reserved_until=None)
        self._slots[index] = record
        del self._reservations[index]
        self._idle_leases[index] = now
        return record

    def _start_reset_locked(self, index: int, changes: PoolChanges) -> None:
        record = self._slots[index]
        if record.sandbox_key is not None:
            self._by_key.pop(record.sandbox_key, None)
        self._idle_leases.pop(index, None)
        self._reservations.pop(index, None)
        self._dirty_activity.pop(index, None)
        resetting = SlotRecord(index, "resetting", record.sandbox_key, self._clock(), self._clock())
        self._slots[index] = resetting
        changes.put_slots.append(resetting)

    async def _finish_reset(self, index: int) -> None:
        if index in self._resets_running:
            return  # another task is emptying it; resetting twice could wipe the next owner
        self._resets_running.add(index)
        try:
            record = self._slots[index]
            if record.sandbox_key is not None and self._before_reset is not None:
                await self._before_reset(record.sandbox_key)
            await self._store.reset(self._store.slot(index))
            async with self._lock:
                changes = PoolChanges()
                now = self._clock()
                self._releases.append(now)
                granted = self._hand_on_locked(index, now, changes)
                await self._state.apply(changes)
        finally:
            self._resets_running.discard(index)
        log.info("slot.released", slot=index, reserved=bool(granted))
        await self._announce(granted)

    def _hand_on_locked(self, index: int, now: float, changes: PoolChanges) -> list[str]:
        """Give an empty slot to the head of the queue, or free it; returns who got it."""
        if not self._queue:
            self._slots.pop(index, None)
            heapq.heappush(self._free, index)
            changes.free_slots.append(index)
            return []
        key, _ = self._queue.popitem(last=False)
        self._idle_queue.pop(key, None)
        self._dirty_seen.pop(key, None)
        until = now + self.idle_timeout_s
        reserved = SlotRecord(index, "reserved", key, now, now, until)
        self._slots[index] = reserved
        self._by_key[key] = index
        self._reservations[index] = until
        self._notes.setdefault(key, []).append("ready")
        changes.put_slots.append(reserved)
        changes.drop_queue.append(key)
        changes.add_notes.append(NoteRecord(key, "ready", now))
        return [key]

    async def _announce(self, granted: list[str]) -> None:
        for key in granted:
            event = self._granted.pop(key, None)
            if event is not None:
                event.set()
            if self._on_reserved is not None:
                await self._on_reserved(key)
