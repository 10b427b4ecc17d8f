"""The pool's persistence seam: leases, reservations, the queue and one-time notes.

The running ``SlotPool`` keeps its state in memory and writes every change
through this seam before it answers, in one transaction per change, so that a
restart (kill -9 included) finds every lease, reservation and queue place
where it was. The production implementation is ``app.storage.pool_store.SqlPoolState``
(``pool`` never imports ``app``); unit tests use an in-memory fake.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Literal, Protocol

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
    """One atomic batch of changes."""

    put_slots: list[SlotRecord] = field(default_factory=list)
    free_slots: list[int] = field(default_factory=list)
    put_queue: list[QueueRecord] = field(default_factory=list)
    drop_queue: list[str] = field(default_factory=list)
    add_notes: list[NoteRecord] = field(default_factory=list)
    drop_notes: list[str] = field(default_factory=list)

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
        self, last_activity: dict[int, float], seen: dict[str, float]
    ) -> None:
        """Persist the newest activity times (slot index -> time, queued key -> time).

        Called in batches: losing the last few seconds of it in a crash only
        makes a sandbox live slightly longer.
        """
        ...
