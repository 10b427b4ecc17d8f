"""The pool's memory and how it changes: the records every part of ``SlotPool`` shares.

``PoolBase`` holds the state machine's data (slots, keys, the free heap, the queue,
notes, activity clocks), replaces it from a snapshot (``_adopt``), and runs one
change at a time (``_locked``): under the process's lock and, on a
``SharedPoolState``, inside its exclusive transaction. The transitions themselves
live in the modules built on it: ``pool.queue`` (taking a slot or a place in the
queue), ``pool.handover`` (emptying a slot and handing it on), ``pool.expiry``
(the watchdog's sweeps); ``pool.leases`` assembles them into ``SlotPool``.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import heapq
import time
from collections import OrderedDict, deque
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass
from typing import Protocol

import structlog

from pool.slots import Slot, SlotStore
from pool.state import (
    NoteKind,
    PoolChanges,
    PoolSnapshot,
    PoolState,
    QueueRecord,
    SharedPoolState,
    SlotRecord,
)

log = structlog.get_logger("pool.leases")

Clock = Callable[[], float]
KeyHook = Callable[[str], Awaitable[None]]


@dataclass(frozen=True)
class Lease:
    """The caller's slot, and the one-time notes to show it with this call's result."""

    slot: Slot
    sandbox_key: str
    notes: tuple[NoteKind, ...]


@dataclass(eq=False)
class LeaseAsk:
    """A caller waiting for ``acquire``'s decision (``pool.queue``): its lease, or why
    not (its queue place, or the failed write)."""

    key: str
    decided: bool = False
    lease: Lease | None = None
    error: BaseException | None = None


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


class PoolBase:
    """The pool's records and the one way they change (see the module docstring)."""

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
        # Asks waiting for a change, decided in batches (``pool.queue``), one at a time.
        self._asks: list[LeaseAsk] = []
        self._asking = asyncio.Lock()
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
        self._changes = 0  # counts every change of the memory (see ``view_version``)

    def _adopt(self, snapshot: PoolSnapshot) -> None:
        """Replace the memory by ``snapshot`` (at start-up; on a shared state, before each
        change). Activity this process saw but has not flushed yet is kept."""
        self._changes += 1
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
            try:
                if self._shared is None:
                    writes = _WriteThrough(self._state)
                    yield writes
                else:
                    async with self._shared.exclusive() as writes:
                        self._adopt(writes.snapshot)
                        yield writes
            finally:
                self._changes += 1  # whatever the block changed, even if it then failed
            for event in self._events:
                log.info("pool.event", order=writes.order, **event)

    def _event(self, kind: str, key: str | None, **facts: object) -> None:
        self._events.append({"kind": kind, "sandbox": label_of(key) if key else None, **facts})

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

    def view_version(self) -> int | None:
        """A number that changes with every change of the pool (each one runs in
        ``_locked`` or replaces the memory): what a key sees of the pool is the same
        while it stays the same. None on a shared state, where another process may
        change the pool at any time: there the view is read from the database."""
        return self._changes if self._shared is None else None

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

    def _touch_locked(self, key: str, index: int, now: float) -> None:
        self._idle_leases[index] = now
        self._idle_leases.move_to_end(index)
        self._dirty_activity[key] = now

    async def close(self) -> None:
        if self._shared is not None:
            await self._shared.close()

    async def flush_activity(self) -> None:
        """Persist the activity times gathered since the last flush."""
        activity, seen = self._dirty_activity, self._dirty_seen
        self._dirty_activity, self._dirty_seen = {}, {}
        if activity or seen:
            await self._state.record_activity(activity, seen)
