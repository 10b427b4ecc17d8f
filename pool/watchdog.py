"""The idle watchdog: empties sandboxes nobody has used for the idle timeout."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Awaitable, Callable, Sequence

import structlog

from pool.leases import SlotPool

log = structlog.get_logger(__name__)


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
    ) -> None:
        self._pool = pool
        self._interval_s = interval_s
        self._is_busy = is_busy
        self._housekeeping = tuple(housekeeping)
        self._task: asyncio.Task[None] | None = None

    async def tick(self) -> int:
        expired = await self._pool.expire(self._is_busy)
        await self._pool.flush_activity()
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
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
            self._task = None
        await self._pool.flush_activity()
