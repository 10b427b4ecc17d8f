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

The state machine lives under one lock, split by idea: the records and how a
change runs (``pool._pool_base``), taking a slot or a queue place (``pool.queue``),
emptying a slot and handing it on (``pool.handover``), the watchdog's sweeps
(``pool.expiry``). This module assembles them, with start-up and what a key sees.
"""

from __future__ import annotations

from dataclasses import dataclass

from pool._pool_base import Clock, KeyHook, Lease, label_of, log
from pool.expiry import ExpiringPool
from pool.queue import Queued
from pool.slots import Slot


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


class SlotPool(ExpiringPool):
    """Hands out slots to sandbox keys, queues callers when none is free, takes slots back."""

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

    async def refresh(self) -> None:
        """Re-read a shared state (each watchdog tick), so ``holders`` and the figures
        include what other processes did. Nothing to do on a private state."""
        if self._shared is not None:
            await self._shared.listen(self._heard_reserved)  # reopens a lost listener
            async with self._lock:
                self._adopt(await self._state.load())

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


__all__ = ["Clock", "KeyHook", "Lease", "PoolStats", "PoolView", "Queued", "SlotPool", "label_of"]
