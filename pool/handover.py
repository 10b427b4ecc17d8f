"""Taking a slot back: empty it (a reset that survives a crash) and hand it to the
head of the queue as a reservation, or free it; the waiter is told at once."""

from __future__ import annotations

import contextlib
import heapq

from pool._pool_base import label_of, log
from pool.queue import QueueingPool
from pool.state import NoteKind, NoteRecord, PoolChanges, SlotRecord


class HandingOverPool(QueueingPool):
    """``release`` and the resets and hand-overs behind it."""

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
