"""Fakes of the pool's seams, for unit tests of the lease and queue logic."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path
from typing import TypeVar

from pool.errors import StaleSlot
from pool.slots import Slot, SlotStore, name_of
from pool.state import NoteRecord, PoolChanges, PoolSnapshot, QueueRecord, SlotRecord


class MemoryPoolState:
    """A ``PoolState`` that forgets everything on exit (unit tests, benchmarks)."""

    def __init__(self) -> None:
        self.slots: dict[int, SlotRecord] = {}
        self.queue: dict[str, QueueRecord] = {}
        self.notes: list[NoteRecord] = []

    async def load(self) -> PoolSnapshot:
        queue = sorted(self.queue.values(), key=lambda q: q.seq)
        return PoolSnapshot(list(self.slots.values()), queue, list(self.notes))

    async def apply(self, changes: PoolChanges) -> None:
        for index in changes.free_slots:
            self.slots.pop(index, None)
        seen = dict(changes.replaces)
        for record in changes.put_slots:
            # As the SQL store: a slot is written only from the record the pool saw there.
            if self.slots.get(record.index) != seen.get(record.index):
                raise StaleSlot(record.index)
            seen[record.index] = record
            self.slots[record.index] = record
        for key in changes.drop_queue:
            self.queue.pop(key, None)
        for entry in changes.put_queue:
            self.queue[entry.sandbox_key] = entry
        dropped = set(changes.drop_notes)
        self.notes = [n for n in self.notes if n.sandbox_key not in dropped]
        self.notes.extend(changes.add_notes)

    async def record_activity(
        self, last_activity: dict[str, float], seen: dict[str, float]
    ) -> None:
        for index, record in list(self.slots.items()):
            at = last_activity.get(record.sandbox_key or "")
            if record.state == "leased" and at is not None and at > record.last_activity:
                self.slots[index] = replace(record, last_activity=at)
        for key, at in seen.items():
            if key in self.queue and at > self.queue[key].last_seen:
                self.queue[key] = replace(self.queue[key], last_seen=at)


class FakeSlotStore:
    """Slots as names only; records every reset."""

    def __init__(self, root: Path = Path("/nonexistent")) -> None:
        self.root = root
        self.resets: list[int] = []

    @property
    def base(self) -> Path:
        return self.root

    async def open(self) -> None:
        return None

    async def missing(self, size: int) -> list[str]:
        return []

    def slot(self, index: int) -> Slot:
        return Slot(index, name_of(index), self.root / name_of(index))

    async def reset(self, slot: Slot) -> None:
        self.resets.append(slot.index)

    async def close(self) -> None:
        return None


StoreT = TypeVar("StoreT", bound=SlotStore)


async def opened(store: StoreT) -> StoreT:
    """``store``, opened: the one line every test of a real store starts with."""
    await store.open()
    return store
