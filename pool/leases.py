"""Leases and the FIFO queue: which sandbox key holds which slot, and who waits next.

Invariants, checked by ``check_invariants`` in the tests after every step:
- a sandbox key holds at most one slot (leased or reserved), and a slot at most one key;
- a key that holds a slot is not in the queue;
- a slot is free only while nobody waits (a freed slot goes to the queue's head).

State lives in memory, guarded by one lock, and every change is written
through ``PoolState`` before the caller gets an answer, so a restart finds it
as it was. Activity times are the exception: they are flushed in batches.

On a ``SharedPoolState`` (PostgreSQL, several processes) every change also runs
inside the state's ``exclusive()`` transaction: the memory is first replaced by
what the database holds under the lock every process takes, so the same state
machine decides from the shared truth, and its writes commit with that read.
Every committed change is logged as ``pool.event`` lines (with the database's
order of the change), the record the multi-process tests replay.

Longer than 400 lines for a reason: the pool's state machine (acquire, release,
expire, hand-over, reservations) lives under one lock, so every transition and
its invariants are read in one place, whether the state is private or shared.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import heapq
import math
import time
from collections import OrderedDict, deque
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass, replace
from typing import Protocol

import structlog

from pool.errors import PoolError
from pool.slots import Slot, SlotStore
from pool.state import (
    NoteKind,
    NoteRecord,
    PoolChanges,
    PoolSnapshot,
    PoolState,
    QueueRecord,
    SharedPoolState,
    SlotRecord,
)

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


@dataclass(frozen=True)
class PoolView:
    """What one key sees of the pool (``sandbox_status``), read without changing anything."""

    slot: Slot | None
    queue_position: int | None
    stats: PoolStats


def label_of(sandbox_key: str) -> str:
    """The key's public label in logs and notifications (the sandbox fingerprint)."""
    return "sbx-" + hashlib.sha256(sandbox_key.encode()).hexdigest()[:12]


class _Writes(Protocol):
    order: object

    async def apply(self, changes: PoolChanges) -> None: ...

    def announce(self, keys: list[str]) -> None: ...


class _WriteThrough:
    """The transaction of a pool alone on its state: each write is its own commit."""

    def __init__(self, state: PoolState) -> None:
        self._state = state
        self.order: object = None

    async def apply(self, changes: PoolChanges) -> None:
        await self._state.apply(changes)

    def announce(self, keys: list[str]) -> None:
        return None  # nobody else to tell


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
        self._shared = state if isinstance(state, SharedPoolState) else None
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
        self._dirty_activity: dict[str, float] = {}  # by key: a slot may change hands
        self._dirty_seen: dict[str, float] = {}
        self._releases: deque[float] = deque(maxlen=50)
        self._granted: dict[str, asyncio.Event] = {}  # by label (notifications carry one)
        self._resets_running: set[int] = set()
        self._events: list[dict[str, object]] = []

    # -- start-up ---------------------------------------------------------

    async def open(self) -> None:
        """Load the persisted state and finish interrupted resets (the store is open).

        Raises:
            PoolError: the storage fails while finishing a reset.
        """
        if self._shared is not None:
            await self._shared.listen(self._heard_reserved)
        self._adopt(await self._state.load())
        interrupted = [r.index for r in self._slots.values() if r.state == "resetting"]
        await self.resume_resets()
        log.info(
            "pool.opened",
            leased=len(self._idle_leases),
            reserved=len(self._reservations),
            queued=len(self._queue),
            resumed_resets=len(interrupted),
        )

    def _adopt(self, snapshot: PoolSnapshot) -> None:
        """Replace the memory by ``snapshot`` (at start-up; on a shared state, before each
        change). Activity this process saw but has not flushed yet is kept."""
        self._slots.clear()
        self._by_key.clear()
        self._queue.clear()
        self._notes.clear()
        self._reservations.clear()
        leases: dict[int, float] = {}
        seen: dict[str, float] = {}
        for record in snapshot.slots:
            if record.index >= self.size:
                continue  # the pool shrank; a lease on a retired slot is dropped below
            self._slots[record.index] = record
            if record.sandbox_key is not None:
                self._by_key[record.sandbox_key] = record.index
            if record.state == "leased":
                assert record.sandbox_key is not None
                unflushed = self._dirty_activity.get(record.sandbox_key, 0.0)
                leases[record.index] = max(record.last_activity, unflushed)
            elif record.state == "reserved":
                self._reservations[record.index] = record.reserved_until or self._clock()
        # A shared queue's numbers come from the database; a private one never goes back.
        self._next_seq = 1 if self._shared is not None else self._next_seq
        for entry in snapshot.queue:
            if entry.sandbox_key not in self._by_key:
                self._queue[entry.sandbox_key] = entry
                seen[entry.sandbox_key] = max(
                    entry.last_seen, self._dirty_seen.get(entry.sandbox_key, 0.0)
                )
            self._next_seq = max(self._next_seq, entry.seq + 1)
        for note in snapshot.notes:
            self._notes.setdefault(note.sandbox_key, []).append(note.kind)
        self._free = [i for i in range(self.size) if i not in self._slots]
        heapq.heapify(self._free)
        self._idle_leases = OrderedDict(sorted(leases.items(), key=lambda kv: kv[1]))
        self._idle_queue = OrderedDict(sorted(seen.items(), key=lambda kv: kv[1]))
        self._reservations = OrderedDict(sorted(self._reservations.items(), key=lambda kv: kv[1]))

    @contextlib.asynccontextmanager
    async def _locked(self) -> AsyncIterator[_Writes]:
        """One change of the pool: under the process's lock and, when shared, inside the
        state's exclusive transaction, starting from the state it read. Its events are
        logged only once it committed."""
        async with self._lock:
            self._events = []
            writes: _Writes
            if self._shared is None:
                writes = _WriteThrough(self._state)
                yield writes
            else:
                async with self._shared.exclusive() as writes:
                    self._adopt(writes.snapshot)
                    yield writes
            for event in self._events:
                log.info("pool.event", order=writes.order, **event)

    def _event(self, kind: str, key: str | None, **facts: object) -> None:
        self._events.append({"kind": kind, "sandbox": label_of(key) if key else None, **facts})

    # -- the calls of one sandbox key ------------------------------------

    async def acquire(self, key: str) -> Lease:
        """The caller's slot: its lease, its reservation, a free slot, or a queue place.

        Raises:
            Queued: no slot is free; the caller is (still) in the queue.
        """
        queued: Queued | None = None
        notes: tuple[NoteKind, ...] = ()
        async with self._locked() as tx:
            now = self._clock()
            changes = PoolChanges()
            index = self._by_key.get(key)
            state = self._slots[index].state if index is not None else None
            if state == "reserved":
                assert index is not None
                previous = self._slots[index]
                changes.put_slot(self._claim_reservation(index, now), previous)
                self._event("claimed", key, slot=index)
            elif state == "leased":
                assert index is not None
                self._touch_locked(key, index, now)
            elif state is None and self._free and key not in self._queue:
                index = heapq.heappop(self._free)
                record = SlotRecord(index, "leased", key, now, now)
                self._slots[index] = record
                self._by_key[key] = index
                self._idle_leases[index] = now
                changes.put_slot(record, None)
                self._event("leased", key, slot=index)
            else:
                # No slot free, or the key's old sandbox is being emptied right now.
                queued = self._enqueue(key, now, changes)
            if queued is None:
                assert index is not None
                notes = tuple(self._notes.pop(key, ()))
                if notes:
                    changes.drop_notes.append(key)
                    self._event("notes", key, notes=list(notes))
            if changes:
                await tx.apply(changes)
        if queued is not None:
            raise queued  # after the block: the queue place is committed, not rolled back
        assert index is not None
        return Lease(self._store.slot(index), key, notes)

    def touch(self, key: str) -> None:
        """Record activity (a call, a running job) for the key's lease, if it has one.

        On a shared state this process may not know of a lease taken through another
        one: the activity is kept by key and the flush writes it to whatever lease the
        key holds then.
        """
        index = self._by_key.get(key)
        if index is not None and self._slots[index].state == "leased":
            self._touch_locked(key, index, self._clock())
        elif self._shared is not None:
            self._dirty_activity[key] = self._clock()

    def lease_of(self, key: str) -> Slot | None:
        """The key's leased slot, without taking one or refreshing anything."""
        index = self._by_key.get(key)
        if index is None or self._slots[index].state != "leased":
            return None
        return self._store.slot(index)

    async def holding(self, key: str) -> Slot | None:
        """``lease_of``, from the shared truth when there is one (whichever process
        leased the slot)."""
        if self._shared is None:
            return self.lease_of(key)
        index = await self._shared.leased_index(key)
        return self._store.slot(index) if index is not None and index < self.size else None

    async def view(self, key: str) -> PoolView:
        """The key's slot, queue place and the pool's figures, changing nothing."""
        if self._shared is None:
            return PoolView(self.lease_of(key), self.position_of(key), self.stats())
        # Counted by the database, leaving the memory alone: light calls never wait
        # for the pool's lock (nor for each other), nor read the whole pool.
        survey = await self._shared.survey(key, self.size)
        stats = PoolStats(
            size=self.size,
            busy=survey.held - survey.reserved,
            free=self.size - survey.held,
            reserved=survey.reserved,
            queued=survey.queued,
            oldest_wait_s=(
                None
                if survey.oldest_enqueued_at is None
                else round(self._clock() - survey.oldest_enqueued_at, 3)
            ),
        )
        index = survey.leased_index
        return PoolView(
            None if index is None else self._store.slot(index), survey.queue_position, stats
        )

    async def current_stats(self) -> PoolStats:
        return (await self.view("")).stats

    async def refresh(self) -> None:
        """Re-read a shared state (each watchdog tick), so ``holders`` and the figures
        include what other processes did. Nothing to do on a private state."""
        if self._shared is not None:
            await self._shared.listen(self._heard_reserved)  # reopens a lost listener
            async with self._lock:
                self._adopt(await self._state.load())

    def next_free(self, n: int) -> list[Slot]:
        """The ``n`` free slots handed out first (lowest index first), without taking any."""
        return [self._store.slot(i) for i in heapq.nsmallest(n, self._free)]

    def holders(self) -> set[str]:
        """Every sandbox key that holds a slot (leased or reserved)."""
        return set(self._by_key)

    def leased_keys(self) -> list[str]:
        return [
            r.sandbox_key for r in self._slots.values() if r.state == "leased" and r.sandbox_key
        ]

    def position_of(self, key: str) -> int | None:
        for position, queued in enumerate(self._queue, start=1):
            if queued == key:
                return position
        return None

    async def wait_until_granted(self, key: str, timeout_s: float) -> bool:
        """Wait (bounded) until a queued key gets a reservation; True if it did."""
        if key in self._by_key:
            return True
        label = label_of(key)
        event = self._granted.setdefault(label, asyncio.Event())
        try:
            await asyncio.wait_for(event.wait(), timeout_s)
            return True
        except TimeoutError:
            return False
        finally:
            if self._granted.get(label) is event and not event.is_set():
                del self._granted[label]

    def _heard_reserved(self, label: str) -> None:
        """Another process reserved a slot for the key with this label."""
        event = self._granted.pop(label, None)
        if event is not None:
            event.set()

    # -- taking slots back -------------------------------------------------

    async def release(self, key: str, *, note: NoteKind | None = None) -> bool:
        """Empty the key's sandbox and hand its slot on; False if it held none.

        ``note`` is left for the key's next call (``emptied`` after an idle timeout).
        """
        return await self._release(key, note=note, idle_since=None)

    async def _release(self, key: str, *, note: NoteKind | None, idle_since: float | None) -> bool:
        """``release``; with ``idle_since``, only if the lease is still idle since then
        (another process may have seen the key active since the watchdog looked)."""
        async with contextlib.AsyncExitStack() as claims:
            async with self._locked() as tx:
                index = self._by_key.get(key)
                if index is None or self._slots[index].state != "leased":
                    return False
                if idle_since is not None and self._idle_leases.get(index, 0.0) > idle_since:
                    return False
                # Claimed before "resetting" commits, so no other process empties it too.
                await claims.enter_async_context(self._claim_reset(index))
                changes = PoolChanges()
                self._start_reset_locked(index, changes)
                if note is not None:
                    self._notes.setdefault(key, []).append(note)
                    changes.add_notes.append(NoteRecord(key, note, self._clock()))
                    self._event("noted", key, note=note)
                await tx.apply(changes)
            await self._finish_reset(index, key)
        return True

    def _claim_reset(self, index: int) -> contextlib.AbstractAsyncContextManager[bool]:
        if self._shared is None:
            return contextlib.nullcontext(True)
        return self._shared.claim_reset(index)

    async def resume_resets(self) -> int:
        """Finish the resets a crash interrupted (at start-up; on a shared state, on the
        watchdog's ticks too: only those no live process is still doing). How many."""
        finished = 0
        for index in [i for i, r in self._slots.items() if r.state == "resetting"]:
            async with self._claim_reset(index) as claimed:
                if not claimed:
                    continue  # its process is alive and emptying it
                async with self._locked():
                    record = self._slots.get(index)
                if record is None or record.state != "resetting":
                    continue  # finished by its own process meanwhile
                await self._finish_reset(index, record.sandbox_key)
                finished += 1
        return finished

    async def expire(self, is_busy: Callable[[str], bool] = lambda _: False) -> int:
        """Take back what has been idle for ``idle_timeout_s``; the watchdog calls this.

        Idle leases (unless ``is_busy`` says a job runs), unclaimed reservations and
        silent queue places expire. Returns how many things expired.
        """
        expired = 0
        idle_keys: list[str] = []
        async with self._locked() as tx:
            now = self._clock()
            deadline = now - self.idle_timeout_s
            for index, last in list(self._idle_leases.items()):
                if last > deadline:
                    break
                key = self._slots[index].sandbox_key
                assert key is not None
                if is_busy(key):
                    self._touch_locked(key, index, now)  # a running job is activity
                else:
                    idle_keys.append(key)
            changes = PoolChanges()
            for key, seen in list(self._idle_queue.items()):
                if seen > deadline:
                    break
                del self._idle_queue[key], self._queue[key]
                self._dirty_seen.pop(key, None)
                changes.drop_queue.append(key)
                self._event("dequeued", key)
                expired += 1
            granted: list[str] = []
            for index, until in list(self._reservations.items()):
                if until > now:
                    break
                # Nobody claimed it, so nothing was written: pass it on as it is.
                lapsed = self._slots[index].sandbox_key
                self._by_key.pop(lapsed or "", None)
                del self._reservations[index]
                self._event("lapsed", lapsed, slot=index)
                granted += self._hand_on_locked(index, now, changes)
                expired += 1
            if changes:
                await tx.apply(changes)
            tx.announce(granted)
        await self._announce(granted)
        for key in idle_keys:
            expired += await self._release(key, note="emptied", idle_since=deadline)
        if self._shared is not None:
            expired += await self.resume_resets()
        if expired:
            log.info("pool.expired", count=expired)
        return expired

    async def keep_busy_alive(self, is_busy: Callable[[str], bool]) -> None:
        """Count this process's running jobs as activity (each tick, every process: on a
        shared state the elected watchdog cannot see another process's jobs)."""
        for key in self.leased_keys():
            if is_busy(key):
                self.touch(key)

    async def close(self) -> None:
        if self._shared is not None:
            await self._shared.close()

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

    def _touch_locked(self, key: str, index: int, now: float) -> None:
        self._idle_leases[index] = now
        self._idle_leases.move_to_end(index)
        self._dirty_activity[key] = now

    def _enqueue(self, key: str, now: float, changes: PoolChanges) -> Queued:
        entry = self._queue.get(key)
        if entry is None:
            entry = QueueRecord(key, self._next_seq, now, now)
            self._next_seq += 1
            self._queue[key] = entry
            changes.put_queue.append(entry)
            self._event("queued", key, seq=entry.seq)
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
            self._dirty_activity.pop(record.sandbox_key, None)
        self._idle_leases.pop(index, None)
        self._reservations.pop(index, None)
        resetting = SlotRecord(index, "resetting", record.sandbox_key, self._clock(), self._clock())
        self._slots[index] = resetting
        changes.put_slot(resetting, record)
        self._event("resetting", record.sandbox_key, slot=index)

    async def _finish_reset(self, index: int, key: str | None) -> None:
        if index in self._resets_running:
            return  # another task is emptying it; resetting twice could wipe the next owner
        self._resets_running.add(index)
        try:
            if key is not None and self._before_reset is not None:
                await self._before_reset(key)
            await self._store.reset(self._store.slot(index))
            async with self._locked() as tx:
                changes = PoolChanges()
                now = self._clock()
                self._releases.append(now)
                granted = self._hand_on_locked(index, now, changes)
                await tx.apply(changes)
                tx.announce(granted)
        finally:
            self._resets_running.discard(index)
        log.info("slot.released", slot=index, reserved=bool(granted))
        await self._announce(granted)

    def _hand_on_locked(self, index: int, now: float, changes: PoolChanges) -> list[str]:
        """Give an empty slot to the head of the queue, or free it; returns who got it."""
        previous = self._slots.get(index)
        if not self._queue:
            self._slots.pop(index, None)
            heapq.heappush(self._free, index)
            changes.free_slots.append(index)
            self._event("freed", None, slot=index)
            return []
        key, entry = self._queue.popitem(last=False)
        self._idle_queue.pop(key, None)
        self._dirty_seen.pop(key, None)
        until = now + self.idle_timeout_s
        reserved = SlotRecord(index, "reserved", key, now, now, until)
        self._slots[index] = reserved
        self._by_key[key] = index
        self._reservations[index] = until
        self._notes.setdefault(key, []).append("ready")
        changes.put_slot(reserved, previous)
        changes.drop_queue.append(key)
        changes.add_notes.append(NoteRecord(key, "ready", now))
        self._event("reserved", key, slot=index, seq=entry.seq)
        return [key]

    async def _announce(self, granted: list[str]) -> None:
        for key in granted:
            event = self._granted.pop(label_of(key), None)
            if event is not None:
                event.set()
            if self._on_reserved is not None:
                await self._on_reserved(key)
