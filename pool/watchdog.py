"""The idle watchdog: empties sandboxes nobody has used for the idle timeout.

With several processes on one shared pool state, every process ticks (it flushes
its activity times and counts its running jobs as activity) but only the elected
one expires leases, reservations and queue places: ``leadership`` says which.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, Sequence
from typing import Protocol

import structlog

from pool.background import cancel_and_wait
from pool.leases import SlotPool

log = structlog.get_logger(__name__)


class Leadership(Protocol):
    async def is_leader(self) -> bool: ...

    async def close(self) -> None: ...


class SoleWatchdog:
    """The only process on its pool: always the one that expires."""

    async def is_leader(self) -> bool:
        return True

    async def close(self) -> None:
        return None


class IdleWatchdog:
    """Calls ``SlotPool.expire`` every ``interval_s`` and flushes activity times.

    Each tick costs what expires, not the pool's size (the pool keeps its
    leases ordered by last activity).
    """

    def __init__(
        self,
        pool: SlotPool,
        *,
        interval_s: float,
        is_busy: Callable[[str], bool] = lambda _: False,
        housekeeping: Sequence[Callable[[], Awaitable[object]]] = (),
        leadership: Leadership | None = None,
    ) -> None:
        self._pool = pool
        self._leadership = leadership or SoleWatchdog()
        self._interval_s = interval_s
        self._is_busy = is_busy
        self._housekeeping = tuple(housekeeping)
        self._task: asyncio.Task[None] | None = None

    async def tick(self) -> int:
        await self._pool.refresh()
        await self._pool.keep_busy_alive(self._is_busy)
        await self._pool.flush_activity()
        expired = 0
        if await self._leadership.is_leader():
            expired = await self._pool.expire(self._is_busy)
            await self._pool.flush_activity()
        # Every process: the chores are idempotent, and some forget what this one holds.
        for chore in self._housekeeping:
            await chore()  # e.g. forgetting e-mail addresses older than a day
        return expired

    async def _run(self) -> None:
        while True:
            await asyncio.sleep(self._interval_s)
            try:
                await self.tick()
            except Exception:
                # One bad tick (a database hiccup, a slot that would not reset) must not
                # stop the watchdog: the next tick retries what is still due.
                log.exception("watchdog.tick_failed")

    def start(self) -> None:
        if self._task is None:
            self._task = asyncio.create_task(self._run(), name="idle-watchdog")

    async def stop(self) -> None:
        await cancel_and_wait(self._task)
        self._task = None
        await self._pool.flush_activity()
        await self._leadership.close()
