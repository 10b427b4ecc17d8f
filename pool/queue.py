"""Taking a slot, or a place in the FIFO queue when none is free, and waiting in it."""

from __future__ import annotations

import asyncio
import heapq
import math
from dataclasses import replace

from pool._pool_base import Lease, PoolBase, label_of
from pool.errors import PoolError
from pool.state import NoteKind, PoolChanges, QueueRecord, SlotRecord


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


class QueueingPool(PoolBase):
    """``acquire``: the caller's lease, its reservation, a free slot, or a queue place."""

    async def acquire(self, key: str) -> Lease:
        """The caller's slot: its lease, its reservation, a free slot, or a queue place.

        Raises:
            Queued: no slot is free; the caller is (still) in the queue.
        """
        if self._shared is None:
            index = self._by_key.get(key)
            if (
                index is not None
                and self._slots[index].state == "leased"
                and not self._notes.get(key)
            ):
                # A sandbox's every call comes here. Holding its lease, with nothing to
                # write, it need not queue for the lock behind other keys' lease writes
                # (a burst of first calls held every second call of the burst until the
                # last first lease was written): on a private state the memory is the
                # truth, read without the lock as ``lease_of`` and ``touch`` read it.
                self._touch_locked(key, index, self._clock())
                return Lease(self._store.slot(index), key, ())
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
            elif (
                state is None
                and self._free
                and key not in self._queue
                and not self._being_emptied(key)
            ):
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

    def _being_emptied(self, key: str) -> bool:
        """Whether the key's old slot is being reset: its record still names the key
        (a resumed reset needs it), and a key holds one slot row at most, so the key
        waits in the queue, whose head gets that slot once it is empty."""
        return any(r.state == "resetting" and r.sandbox_key == key for r in self._slots.values())

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
