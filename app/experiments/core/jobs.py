"""Running commands: which are in flight, for whom, and waiting on them (bounded)."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Coroutine
from dataclasses import dataclass, field
from typing import Any

import structlog

from app.runtime.backend import SandboxBackend
from app.runtime.errors import RuntimeFailure

log = structlog.get_logger(__name__)


@dataclass
class RunningJob:
    job_id: str
    sandbox_key: str
    experiment_id: str
    container_id: str
    task: asyncio.Task[Any]
    # Set by whoever stops the job; its run reads it before it reaches the runtime,
    # where a cancel would find nothing yet to kill (see ``stop_job``).
    stopping: asyncio.Event = field(default_factory=asyncio.Event)
    # Its whole command: the record may keep only its head (app/experiments/output_budget.py).
    command: str = ""


async def stop_job(backend: SandboxBackend, job: RunningJob) -> None:
    """Stop a job's command, whether it runs or has not yet reached the runtime.

    The one way a job of this process is stopped (cancel_job, a cancelled MCP task,
    destroy, the disk budget). A job whose task has not had its first step yet is not
    known to the runtime, so the runtime's cancel misses it: the flag makes its run end
    as cancelled instead of starting the command."""
    job.stopping.set()
    await backend.cancel(job.container_id, job.job_id)


def _observe(task: asyncio.Task[Any]) -> None:
    """Read how a job's task ended, so a failure nobody waits for (a background job, a
    call that stopped waiting) is logged here once instead of asyncio's "Task exception
    was never retrieved" when the task is collected. Its record already says why (the
    run records every ending before raising: ``CommandRunner._finish``); a caller still
    waiting gets the same exception from the task."""
    if task.cancelled():
        return
    exc = task.exception()
    if exc is None:
        return
    job_id = task.get_name().removeprefix("job-")
    if isinstance(exc, RuntimeFailure):
        log.warning("job.runtime_failed", job_id=job_id, code=exc.code, reason=exc.message)
    else:
        log.warning("job.failed", job_id=job_id, exc_info=exc)


class JobRegistry:
    """In-memory index of jobs in flight (their records are in the database)."""

    def __init__(self) -> None:
        self._jobs: dict[str, RunningJob] = {}

    def start(
        self,
        job_id: str,
        sandbox_key: str,
        experiment_id: str,
        container_id: str,
        work: Coroutine[Any, Any, Any],
        stopping: asyncio.Event,
        command: str = "",
    ) -> RunningJob:
        """Run ``work`` as the job's task; ``stopping`` is the flag ``work`` reads."""
        task = asyncio.create_task(work, name=f"job-{job_id}")
        job = RunningJob(job_id, sandbox_key, experiment_id, container_id, task, stopping, command)
        self._jobs[job_id] = job
        task.add_done_callback(lambda _: self._jobs.pop(job_id, None))
        task.add_done_callback(_observe)
        return job

    def get(self, job_id: str) -> RunningJob | None:
        return self._jobs.get(job_id)

    def is_busy(self, sandbox_key: str) -> bool:
        """A running job keeps its sandbox alive (the idle watchdog asks this)."""
        return any(job.sandbox_key == sandbox_key for job in self._jobs.values())

    def running(self) -> list[RunningJob]:
        return list(self._jobs.values())

    def running_in(self, experiment_id: str) -> list[RunningJob]:
        return [job for job in self._jobs.values() if job.experiment_id == experiment_id]

    @staticmethod
    async def wait(job: RunningJob, timeout_s: float) -> bool:
        """Wait for a job to finish without cancelling it; True if it finished."""
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(asyncio.shield(job.task), timeout_s)
        return job.task.done()

    async def close(self) -> None:
        """At shutdown: stop waiting on jobs (their containers are left to the sweep)."""
        for job in list(self._jobs.values()):
            job.task.cancel()
        for job in list(self._jobs.values()):
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await job.task
