"""This server process among those sharing one database: its id and heartbeat.

Every process writes a heartbeat row (``app.storage.process_store``) every
``stale_s / 6`` seconds; one whose row is older than ``stale_s`` is taken for dead.
Jobs record the process that runs them, and containers carry it as a label, so
recovery and the orphan sweep take over only what a dead process owned, never a
live process's running jobs.
"""

from __future__ import annotations

import os
import socket
import time
import uuid
from collections.abc import Callable
from typing import Protocol

import structlog

log = structlog.get_logger(__name__)

BEATS_PER_STALE = 6


class ProcessRecords(Protocol):
    """The server processes' heartbeat rows (``app.storage.process_store``)."""

    async def register(self, process_id: str, host: str, pid: int, at: float) -> None: ...
    async def beat(self, process_id: str, at: float) -> bool:
        """Refresh the process's row; False if it was no longer there."""
        ...

    async def live(self, fresh_after: float) -> set[str]:
        """The processes whose heartbeat is newer than ``fresh_after``."""
        ...

    async def forget_stale(self, fresh_after: float) -> int: ...
    async def deregister(self, process_id: str) -> None: ...


class ProcessRegistry:
    def __init__(
        self,
        records: ProcessRecords,
        *,
        stale_s: float,
        process_id: str | None = None,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self._records = records
        self.stale_s = stale_s
        self.beat_s = stale_s / BEATS_PER_STALE
        self.process_id = process_id or "proc_" + uuid.uuid4().hex[:16]
        self._clock = clock

    async def register(self) -> None:
        now = self._clock()
        await self._records.register(self.process_id, socket.gethostname()[:255], os.getpid(), now)
        log.info("process.registered", process_id=self.process_id)

    async def beat(self) -> None:
        if not await self._records.beat(self.process_id, self._clock()):
            # Taken for dead (the loop stalled past stale_s) and forgotten: back in.
            log.warning("process.reregistered", process_id=self.process_id)
            await self.register()

    async def live(self) -> set[str]:
        """The live processes, this one always among them."""
        return await self._records.live(self._clock() - self.stale_s) | {self.process_id}

    async def is_live(self, process_id: str | None) -> bool:
        return process_id is not None and process_id in await self.live()

    async def forget_dead(self) -> int:
        return await self._records.forget_stale(self._clock() - self.stale_s)

    async def deregister(self) -> None:
        await self._records.deregister(self.process_id)
