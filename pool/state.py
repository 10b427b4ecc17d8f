"""The pool's persistence seam: leases, reservations, the queue and one-time notes.

The running ``SlotPool`` keeps its state in memory and writes every change
through this seam before it answers, in one transaction per change, so that a
restart (kill -9 included) finds every lease, reservation and queue place
where it was. The production implementation is ``app.storage.slots.pool_store.SqlPoolState``
(``pool`` never imports ``app``); unit tests use an in-memory fake.

A ``SharedPoolState`` (PostgreSQL, several server processes) turns that around:
the database is the truth, and every change runs inside ``exclusive()``, one
transaction under a lock every process takes, starting from the state read in
that transaction. A process's memory is then only a cache of the last read.
"""

from __future__ import annotations

from collections.abc import Callable
from contextlib import AbstractAsyncContextManager
from dataclasses import dataclass, field
from typing import Literal, Protocol, runtime_checkable

SlotState = Literal["leased", "reserved", "resetting"]
NoteKind = Literal["ready", "emptied"]


@dataclass(frozen=True)
class SlotRecord:
    """A slot that is not simply free.

    ``leased``: held by ``sandbox_key``. ``reserved``: handed to the head of the
    queue, waiting for that key's next call until ``reserved_until``.
    ``resetting``: being emptied; a restart empties it again before reuse.
    """

    index: int
    state: SlotState
    sandbox_key: str | None
    since: float
    last_activity: float
    reserved_until: float | None = None


@dataclass(frozen=True)
class QueueRecord:
    sandbox_key: str
    seq: int
    enqueued_at: float
    last_seen: float


@dataclass(frozen=True)
class NoteRecord:
    sandbox_key: str
    kind: NoteKind
    created_at: float


@dataclass
class PoolChanges:
    """One atomic batch of changes.

    ``replaces`` holds, for each slot in ``put_slots``, the record it replaces
    (``None``: the slot was free). The store writes a slot only if it still holds
    exactly that record, so a write from a stale view fails loudly instead of
    silently taking a slot from its holder.
    """

    put_slots: list[SlotRecord] = field(default_factory=list)
    replaces: dict[int, SlotRecord | None] = field(default_factory=dict)
    free_slots: list[int] = field(default_factory=list)
    put_queue: list[QueueRecord] = field(default_factory=list)
    drop_queue: list[str] = field(default_factory=list)
    add_notes: list[NoteRecord] = field(default_factory=list)
    drop_notes: list[str] = field(default_factory=list)

    def put_slot(self, record: SlotRecord, replacing: SlotRecord | None) -> None:
        self.put_slots.append(record)
        self.replaces.setdefault(record.index, replacing)

    def __bool__(self) -> bool:
        return any(
            (
                self.put_slots,
                self.free_slots,
                self.put_queue,
                self.drop_queue,
                self.add_notes,
                self.drop_notes,
            )
        )


@dataclass(frozen=True)
class PoolSnapshot:
    slots: list[SlotRecord]
    queue: list[QueueRecord]  # in arrival order (ascending seq)
    notes: list[NoteRecord]


@dataclass(frozen=True)
class PoolSurvey:
    """What one key sees of a shared pool, counted by the storage in one read: the
    slots counted are those below the pool's size, and the queue is the callers who
    hold no such slot, in arrival order."""

    leased_index: int | None  # the key's leased slot
    queue_position: int | None  # 1 for the head of the queue
    held: int  # slots leased, reserved or being emptied
    reserved: int
    queued: int
    oldest_enqueued_at: float | None  # the head's arrival


class PoolState(Protocol):
    """Durable storage for the pool's bookkeeping."""

    async def load(self) -> PoolSnapshot:
        """Read everything, at start-up.

        Returns:
            The slots that are not free, the queue in arrival order, and the notes.

        Raises:
            Exception: the storage's own error type when it cannot be read.
        """
        ...

    async def apply(self, changes: PoolChanges) -> None:
        """Write one batch of changes atomically: all of it or none of it.

        ``put_*`` replace any record with the same slot index or sandbox key;
        ``free_slots`` and ``drop_*`` delete (a missing record is not an error);
        ``drop_notes`` removes every note of those keys.

        Raises:
            Exception: the storage's own error type when it cannot be written.
        """
        ...

    async def record_activity(
        self, last_activity: dict[str, float], seen: dict[str, float]
    ) -> None:
        """Persist the newest activity times (leasing key -> time, queued key -> time).

        By key, not slot index: a slot handed on meanwhile must not inherit the
        activity of its previous holder. A time never moves backwards.

        Called in batches: losing the last few seconds of it in a crash only
        makes a sandbox live slightly longer.
        """
        ...


class PoolTransaction(Protocol):
    """One change of a shared pool: the state as read under the lock, and its writes."""

    snapshot: PoolSnapshot
    order: object  # the database's order of this change among all pool changes, once known

    async def apply(self, changes: PoolChanges) -> None:
        """Write ``changes`` in this transaction (committed when ``exclusive`` exits).

        Raises:
            StaleSlot: a slot no longer holds the record ``changes.replaces`` names.
            Exception: the storage's own error type when it cannot be written.
        """
        ...

    def announce(self, keys: list[str]) -> None:
        """Tell every process, once this commits, that these keys got a reservation."""
        ...


@runtime_checkable
class SharedPoolState(PoolState, Protocol):
    """A pool's state shared by several processes (see the module docstring)."""

    def exclusive(self) -> AbstractAsyncContextManager[PoolTransaction]:
        """One transaction under the pool's lock (every process waits its turn)."""
        ...

    def claim_reset(self, index: int) -> AbstractAsyncContextManager[bool]:
        """Hold the right to empty slot ``index`` while the block runs.

        Yields False if another live process is emptying it. The claim dies with
        its process, so a reset interrupted by a crash is finished by another one.
        """
        ...

    async def leased_index(self, sandbox_key: str) -> int | None:
        """The slot the key has leased right now, whichever process leased it."""
        ...

    async def survey(self, sandbox_key: str, size: int) -> PoolSurvey:
        """The key's slot and queue place and the pool's counts, for a pool of ``size``
        slots, without reading the whole pool (``sandbox_status`` on every call)."""
        ...

    async def listen(self, on_reserved: Callable[[str], None]) -> None:
        """Start hearing of reservations announced by any process (a key's label)."""
        ...

    async def close(self) -> None: ...
