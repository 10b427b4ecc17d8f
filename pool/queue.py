"""Taking a slot, or a place in the FIFO queue when none is free, and waiting in it.

The asks that need a change (a first lease, a reservation claimed, a queue place) are
decided in batches: those that arrive while a change is being written are decided
together by the next one, in arrival order, each as if it came alone, and written in
one transaction. A burst of first calls wrote one transaction a lease, in turn under
the pool's lock (100 first leases over 14 s, one every 104 ms on a loaded 2-core
machine: issue 26's burst), so the last of N waited N writes; now it waits for the
batch in progress and its own.
"""

from __future__ import annotations

import asyncio
import heapq
import math
from dataclasses import replace

from pool._pool_base import Lease, LeaseAsk, PoolBase, label_of
from pool.errors import PoolError
from pool.state import NoteKind, PoolChanges, QueueRecord, SlotRecord

# The most asks one change decides: each adds a slot row or a queue row (and a key to a
# delete's list) to its transaction.
MAX_ASKS = 100


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
        ask = LeaseAsk(key)
        self._asks.append(ask)
        try:
            async with self._asking:
                # The holder before us may have decided ours with its own batch.
                while not ask.decided:
                    batch = self._asks[:MAX_ASKS]
                    del self._asks[: len(batch)]
                    await self._decide(batch)
        except asyncio.CancelledError:
            # Not decided: nobody will read it, so nothing is written for it.
            if ask in self._asks:
                self._asks.remove(ask)
            raise
        if ask.error is not None:
            raise ask.error  # a queue place (committed) or the batch's failed write
        assert ask.lease is not None
        return ask.lease

    async def _decide(self, batch: list[LeaseAsk]) -> None:
        """The asks of ``batch`` in arrival order, each as if it came alone, in one change
        (one transaction); every ask of a batch whose write fails gets its error."""
        try:
            async with self._locked() as tx:
                now = self._clock()
                changes = PoolChanges()
                outcomes = [self._decide_one(ask.key, now, changes) for ask in batch]
                if changes:
                    await tx.apply(changes)
        except asyncio.CancelledError:
            # The holder went away mid-change: the next holder decides the batch again
            # (on a private state from the memory this one changed, as a retried call would).
            self._asks[:0] = batch
            raise
        except Exception as exc:
            for ask in batch:
                ask.decided, ask.error = True, exc
            return
        for ask, outcome in zip(batch, outcomes, strict=True):
            ask.decided = True
            if isinstance(outcome, Queued):
                ask.error = outcome  # raised after the change: the place is committed
            else:
                ask.lease = outcome

    def _decide_one(self, key: str, now: float, changes: PoolChanges) -> Lease | Queued:
        """One ask under the lock: its lease (claimed, kept or taken) with its notes, or its
        queue place; the writes added to ``changes``."""
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
            state is None and self._free and key not in self._queue and not self._being_emptied(key)
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
            return self._enqueue(key, now, changes)
        assert index is not None
        notes: tuple[NoteKind, ...] = tuple(self._notes.pop(key, ()))
        if notes:
            changes.drop_notes.append(key)
            self._event("notes", key, notes=list(notes))
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
