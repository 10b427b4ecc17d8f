"""MCP tasks across server processes: each task is mirrored to the database when it
opens and when it ends, so ``tasks/get`` answers through any process, and a
``tasks/cancel`` received by another process reaches the one serving the task
(which polls for such requests every ``poll_s``) and is awaited there, bounded.

The result is written once, when the task ends (the ``CallToolResult`` as sent,
bounded like every tool result); a task still working reads as working. A task
whose serving process died is ended as failed by the next process that looks.
A process polls only while it serves a task: the poll ends with its last one.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable, Coroutine
from typing import Any, Protocol

import structlog

from app.experiments.recovery.process_registry import ProcessRegistry
from app.mcp.tasks.store import TaskRecord, TaskStore
from pool.background import cancel_and_wait

log = structlog.get_logger(__name__)


class TaskRecords(Protocol):
    """The tasks' rows in the database (``app.storage.task_store``), with their cancel flags."""

    async def add(self, record: TaskRecord, owner_process: str) -> None: ...
    async def finish(self, record: TaskRecord) -> None: ...
    async def get(self, sandbox_key: str, task_id: str) -> tuple[TaskRecord, str] | None:
        """The sandbox's task and the process serving it; None for another key's."""
        ...

    async def delete(self, task_id: str) -> None: ...
    async def forget_finished_before(self, cutoff: float) -> int: ...
    async def forget_unfinished_of(self, live_processes: set[str], at: float) -> int:
        """Tasks whose serving process died can never finish: end them as failed."""
        ...

    async def request_cancel(self, row_id: str) -> None: ...
    async def cancel_requests(self, owner_process: str) -> list[str]: ...


# How often finished tasks are forgotten, and dead processes' tasks ended.
CLEANUP_EVERY_S = 60.0


class TaskMirror:
    def __init__(
        self,
        records: TaskRecords,
        registry: ProcessRegistry,
        store: TaskStore,
        *,
        poll_s: float = 1.0,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self._records = records
        self._registry = registry
        self._store = store
        self._poll_s = poll_s
        self._clock = clock
        self._local: dict[str, TaskRecord] = {}  # this process's working tasks
        self._writes: set[asyncio.Task[None]] = set()
        self._loop_task: asyncio.Task[None] | None = None
        store.on_finish = self._finished
        store.on_forget = self._forgotten

    async def opened(self, record: TaskRecord) -> None:
        self._local[record.task_id] = record
        if self._loop_task is None or self._loop_task.done():
            self._loop_task = asyncio.create_task(self._loop(), name="task-mirror")
        try:
            await self._records.add(record, self._registry.process_id)
        except Exception:  # the database away: the task is served, by this process only
            log.warning("task.not_mirrored", task=record.task_id[:8], exc_info=True)

    def _finished(self, record: TaskRecord) -> None:
        """TaskStore's finish hook (synchronous): the write goes on in the background."""
        self._local.pop(record.task_id, None)
        self._in_background(self._records.finish(record), record.task_id)

    def _forgotten(self, task_id: str) -> None:
        """TaskStore's forget hook (evicted, or kept long enough): gone everywhere."""
        self._local.pop(task_id, None)
        self._in_background(self._records.delete(task_id), task_id)

    def _in_background(self, write: Coroutine[Any, Any, None], task_id: str) -> None:
        task = asyncio.get_running_loop().create_task(self._write(write, task_id))
        self._writes.add(task)
        task.add_done_callback(self._writes.discard)

    @staticmethod
    async def _write(write: Coroutine[Any, Any, None], task_id: str) -> None:
        try:
            await write
        except Exception:
            log.warning("task.not_mirrored", task=task_id[:8], exc_info=True)

    async def lookup(self, sandbox_key: str, task_id: str) -> TaskRecord | None:
        """The caller's task served by another process, as recorded; None if unknown."""
        found = await self._records.get(sandbox_key, task_id)
        if found is None:
            return None
        record, owner = found
        if owner == self._registry.process_id:
            return None  # this process's own: its store has forgotten it (evicted, expired)
        if (
            record.finished_at is not None
            and record.finished_at < self._clock() - self._store.keep_s
        ):
            return None  # kept keep_s, as this process's own
        if not record.finished and not await self._registry.is_live(owner):
            await self._records.forget_unfinished_of(await self._registry.live(), self._clock())
            found = await self._records.get(sandbox_key, task_id)
            record = found[0] if found is not None else record
        return record

    async def cancel_elsewhere(self, sandbox_key: str, task_id: str, wait_s: float) -> None:
        """Ask the serving process to cancel, and wait (bounded) for the task to end."""
        await self._records.request_cancel(task_id)
        deadline = time.monotonic() + wait_s
        while time.monotonic() < deadline:
            record = await self.lookup(sandbox_key, task_id)
            if record is None or record.finished:
                return
            await asyncio.sleep(min(self._poll_s / 2, 0.5))

    # -- the serving side --------------------------------------------------------------

    async def answer_cancel_requests(self) -> None:
        for task_id in await self._records.cancel_requests(self._registry.process_id):
            record = self._local.get(task_id)
            if record is not None and record.work is not None and not record.finished:
                log.info("task.cancelled_elsewhere", task=task_id[:8])
                record.work.cancel()

    async def _cleanup(self) -> None:
        await self._records.forget_finished_before(self._clock() - self._store.keep_s)
        await self._records.forget_unfinished_of(await self._registry.live(), self._clock())

    async def _loop(self) -> None:
        since_cleanup = CLEANUP_EVERY_S
        while self._local:
            await asyncio.sleep(self._poll_s)
            since_cleanup += self._poll_s
            try:
                await self.answer_cancel_requests()
                if since_cleanup >= CLEANUP_EVERY_S:
                    since_cleanup = 0.0
                    await self._cleanup()
            except Exception:
                log.warning("task.mirror_failed", exc_info=True)

    async def stop(self) -> None:
        """Stop polling and let the last writes land (bounded)."""
        await cancel_and_wait(self._loop_task)
        if self._writes:
            await asyncio.wait(set(self._writes), timeout=10)
