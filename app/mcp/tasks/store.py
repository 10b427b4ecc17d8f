"""The tasks of the MCP Tasks extension, in memory: whose they are, where they stand.

A task belongs to the sandbox key that started it; every look-up names that key,
and another key's task id reads exactly like one that never existed. The store is
bounded twice: a sandbox holds at most ``max_per_sandbox`` tasks (a new one evicts
its own oldest finished task, never a running one), and the server at most
``max_total``. At that bound a new task evicts the oldest finished task of the
sandbox holding the most tasks, if that is more than the caller would hold: else
finished tasks, kept for an hour, would let a hundred sandboxes' instant failures
lock every other tenant out of tasks. A running task is never evicted; when no
finished one may go, no task is opened and the call is served the ordinary way.
A finished task is kept ``keep_s`` seconds, then forgotten.

Tasks live in the memory of the process serving them; ``on_finish`` lets
``app.mcp.tasks.mirror`` mirror them to the database, where the other server
processes read them. A restart forgets the tasks it served (their commands'
records stay in the database, as jobs).
"""

from __future__ import annotations

import asyncio
import time
import uuid
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Literal

TaskStatus = Literal["working", "input_required", "completed", "failed", "cancelled"]

TERMINAL: frozenset[TaskStatus] = frozenset({"completed", "failed", "cancelled"})


@dataclass
class TaskRecord:
    """One task; ``result`` (a ``CallToolResult`` as sent) or ``error`` (a JSON-RPC
    error object) once it ends."""

    task_id: str
    sandbox_key: str
    tool: str
    created_at: float
    updated_at: float
    status: TaskStatus = "working"
    status_message: str | None = None
    result: dict[str, Any] | None = None
    error: dict[str, Any] | None = None
    finished_at: float | None = None
    # The call doing the work; held here so it is not garbage-collected mid-run.
    work: asyncio.Task[None] | None = field(default=None, repr=False)

    @property
    def finished(self) -> bool:
        return self.status in TERMINAL


class TaskStore:
    def __init__(
        self,
        *,
        keep_s: float,
        max_per_sandbox: int,
        max_total: int,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self.keep_s = keep_s
        self._max_per_sandbox = max_per_sandbox
        self._max_total = max_total
        self._clock = clock
        self._tasks: dict[str, TaskRecord] = {}
        # Per sandbox key, its task ids oldest first (dicts keep insertion order).
        self._by_key: dict[str, dict[str, None]] = {}
        # Finished task ids in the order they finished: expiry looks only at the front.
        self._finished: dict[str, None] = {}
        # Per sandbox key, how many of its tasks are finished (only keys with some).
        self._finished_of: Counter[str] = Counter()
        # Told of every task as it ends, and as it is forgotten (app.mcp.tasks.mirror);
        # must not block.
        self.on_finish: Callable[[TaskRecord], None] | None = None
        self.on_forget: Callable[[str], None] | None = None

    def __len__(self) -> int:
        return len(self._tasks)

    def open(self, sandbox_key: str, tool: str) -> TaskRecord | None:
        """A new working task for ``sandbox_key``, or ``None`` when there is no room
        (the sandbox's tasks are all running, or the server holds ``max_total`` and no
        larger share than the caller's has a finished task to give up)."""
        self.expire()
        own = self._by_key.get(sandbox_key, {})
        if len(own) >= self._max_per_sandbox:
            if not self._finished_of[sandbox_key]:
                return None
            self._forget(self._oldest_finished(sandbox_key))
        if len(self._tasks) >= self._max_total:
            # Only from a larger share than the caller's once it has this task: two
            # sandboxes of one task each never take turns evicting each other's result.
            crowded = self._most_crowded_with_finished(len(own) + 1)
            if crowded is None:
                return None
            self._forget(self._oldest_finished(crowded))
        now = self._clock()
        # uuid4 draws 122 bits from the OS's random source: ids cannot be guessed.
        record = TaskRecord(str(uuid.uuid4()), sandbox_key, tool, now, now)
        self._tasks[record.task_id] = record
        self._by_key.setdefault(sandbox_key, {})[record.task_id] = None
        return record

    def get(self, sandbox_key: str, task_id: str) -> TaskRecord | None:
        """The caller's task, or ``None``: unknown, expired and another key's alike."""
        self.expire()
        record = self._tasks.get(task_id)
        if record is None or record.sandbox_key != sandbox_key:
            return None
        return record

    def finish(
        self,
        record: TaskRecord,
        status: TaskStatus,
        *,
        result: dict[str, Any] | None = None,
        error: dict[str, Any] | None = None,
        message: str | None = None,
    ) -> None:
        """End ``record`` (the first ending wins: a task never leaves a terminal status)."""
        if record.finished:
            return
        now = self._clock()
        record.status, record.result, record.error = status, result, error
        record.status_message = message
        record.finished_at = record.updated_at = now
        record.work = None
        self._finished[record.task_id] = None
        self._finished_of[record.sandbox_key] += 1
        if self.on_finish is not None:
            self.on_finish(record)

    def ttl_s(self, record: TaskRecord) -> float | None:
        """Seconds from creation after which the task may be gone; ``None`` while it runs
        (a running task is never discarded)."""
        if record.finished_at is None:
            return None
        return record.finished_at - record.created_at + self.keep_s

    def expire(self) -> int:
        """Forget the finished tasks kept ``keep_s`` already; how many went.

        Costs only what it forgets (it runs on every look-up)."""
        cutoff = self._clock() - self.keep_s
        forgotten = 0
        while self._finished:
            oldest = next(iter(self._finished))
            finished_at = self._tasks[oldest].finished_at
            if finished_at is None or finished_at > cutoff:
                break
            self._forget(oldest)
            forgotten += 1
        return forgotten

    def _most_crowded_with_finished(self, callers_tasks: int) -> str | None:
        """The key holding the most tasks among those with a finished one, if it holds
        more than ``callers_tasks``; costs one pass over the keys (only when full)."""
        crowded, most = None, callers_tasks
        for key in self._finished_of:
            held = len(self._by_key[key])
            if held > most:
                crowded, most = key, held
        return crowded

    def _oldest_finished(self, sandbox_key: str) -> str:
        """The oldest by creation of the key's finished tasks (the key has one)."""
        return next(t for t in self._by_key[sandbox_key] if self._tasks[t].finished)

    def _forget(self, task_id: str) -> None:
        if self.on_forget is not None:
            self.on_forget(task_id)
        record = self._tasks.pop(task_id)
        if task_id in self._finished:
            del self._finished[task_id]
            self._finished_of[record.sandbox_key] -= 1
            if not self._finished_of[record.sandbox_key]:
                del self._finished_of[record.sandbox_key]
        own = self._by_key[record.sandbox_key]
        del own[task_id]
        if not own:
            del self._by_key[record.sandbox_key]
