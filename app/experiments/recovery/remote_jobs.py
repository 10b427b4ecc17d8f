"""Jobs another server process runs: waiting on their records, and cancelling them.

Their outcome (exit code, output, duration) is written to the database when they
end, so any process reads it there; waiting is a bounded re-poll of the record. A
cancel kills the job's process tree at once through the Docker engine (every
process reaches it) with the pids the job announced, and flags the record, so its
owner records it as cancelled (and kills it itself within a heartbeat, should the
pids not be known yet). If the owner died meanwhile, the cancel is recorded here.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Callable

from app.errors import ServiceError
from app.experiments.core.records import JobOutcome, JobRecord
from app.experiments.core.store import ExperimentStore
from app.experiments.recovery.process_registry import ProcessRegistry
from app.runtime.backend import SandboxBackend

FIRST_POLL_S = 0.1
MAX_POLL_S = 1.0
# How long a cancel waits for the job's pids (its first output line) and its record.
PIDS_WAIT_S = 5.0
SETTLE_WAIT_S = 10.0


class RemoteJobs:
    def __init__(
        self,
        records: ExperimentStore,
        backend: SandboxBackend,
        registry: ProcessRegistry,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self._records = records
        self._backend = backend
        self._registry = registry
        self._clock = clock

    async def wait(self, sandbox_key: str, job_id: str, wait_s: float) -> JobRecord | None:
        """The job's record once it is no longer running, or as it is after ``wait_s``."""
        deadline = time.monotonic() + wait_s
        pause = FIRST_POLL_S
        while True:
            row = await self._records.load_job(sandbox_key, job_id)
            left = deadline - time.monotonic()
            if row is None or row.status != "running" or left <= 0:
                return row
            await asyncio.sleep(min(pause, left))
            pause = min(pause * 1.5, MAX_POLL_S)

    async def cancel(self, row: JobRecord) -> None:
        """Kill the tree of a job another process runs, and wait (bounded) for its record."""
        await self._records.request_cancel(row.job_id)
        experiment = await self._records.load(row.sandbox_key, row.experiment_id)
        container_id = experiment.container_id if experiment is not None else None
        control = await self._records.job_control(row.job_id)
        deadline = time.monotonic() + PIDS_WAIT_S
        while control is not None and control.pids is None and time.monotonic() < deadline:
            await asyncio.sleep(FIRST_POLL_S)
            control = await self._records.job_control(row.job_id)
        if container_id and control is not None and control.pids is not None:
            with contextlib.suppress(ServiceError):  # the owner kills it on the request
                await self._backend.kill_tree(container_id, control.pids)
        settled = await self.wait(row.sandbox_key, row.job_id, SETTLE_WAIT_S)
        if (
            settled is not None
            and settled.status == "running"
            and not await self._registry.is_live(settled.owner_process)
        ):
            await self._records.finish_job(row.job_id, _cancelled_here(self._clock(), row))


def _cancelled_here(now: float, row: JobRecord) -> JobOutcome:
    return JobOutcome.without_output(
        "cancelled",
        finished_at=now,
        duration_s=round(now - row.started_at, 3),
        reason=(
            "Cancelled; its whole process tree was killed. The server process that ran it "
            "had stopped, so its output is lost."
        ),
    )
