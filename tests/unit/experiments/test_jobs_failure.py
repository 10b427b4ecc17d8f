"""A job whose runtime fails after nobody waits on it any more (a background job, or a
call that stopped waiting): its record says why, one warning is logged, and the asyncio
loop never reports "Task exception was never retrieved" (seen under the fairness bench:
an ExecutorStopped raised by ``CommandRunner._finish`` in a background job's task)."""

from __future__ import annotations

import asyncio
import gc
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import structlog
from db_testkit import migrated_sqlite
from runtime_fakes import FakeBackend
from sqlalchemy.ext.asyncio import AsyncEngine

from app.experiments.core.jobs import JobRegistry
from app.experiments.creation import CreateRequest
from app.experiments.manager import ExperimentManager
from app.experiments.options import ExperimentOptions
from app.experiments.recovery.process_registry import ProcessRegistry
from app.runtime.backend import ExecResult
from app.runtime.errors import ContainerGone, ExecutorStopped
from app.storage.experiment_store import SqlExperimentStore
from app.storage.process_store import SqlProcessRecords
from jail import SandboxMemory, new_call_context


@dataclass
class FailingBackend(FakeBackend):
    """``stop after S`` / ``gone after S``: the command starts, then S seconds later its
    executor goes away / its container is gone."""

    async def run(
        self,
        container_id: str,
        command: str,
        *,
        timeout_s: float,
        job_id: str,
        max_output_bytes: int = 1_048_576,
        env: dict[str, str] | None = None,
        on_start: Callable[[tuple[int, int]], Awaitable[None]] | None = None,
    ) -> ExecResult:
        what, _, after = command.partition(" after ")
        if what in ("stop", "gone", "flood"):
            if on_start is not None and what != "flood":
                await on_start((1, 2))
            await asyncio.sleep(float(after))
            if what == "gone":
                raise ContainerGone(container_id)
            raise ExecutorStopped("the executor's connection closed")
        return await super().run(
            container_id,
            command,
            timeout_s=timeout_s,
            job_id=job_id,
            max_output_bytes=max_output_bytes,
            env=env,
            on_start=on_start,
        )


@pytest.fixture
async def engine(tmp_path: Path) -> AsyncIterator[AsyncEngine]:
    made = await migrated_sqlite(tmp_path)
    yield made
    await made.dispose()


async def make_manager(engine: AsyncEngine, tmp_path: Path, jobs: JobRegistry) -> ExperimentManager:
    (tmp_path / "slot-000").mkdir(exist_ok=True)
    options = ExperimentOptions(
        hosted=True, default_image="img:1", sync_wait_s=5, artifact_dir=tmp_path / "artifacts"
    )
    registry = ProcessRegistry(SqlProcessRecords(engine), stale_s=30)
    await registry.register()
    records = SqlExperimentStore(engine)
    return ExperimentManager(records, FailingBackend(), jobs, options, registry)


@pytest.mark.parametrize(
    ("command", "status", "words"),
    [
        ("stop after 0.05", "lost", "executor stopped"),
        ("gone after 0.05", "lost", "Docker engine failed"),
        # The command flooded the executor's stdout before its start was announced (the
        # flood overtook the announcement on a loaded host): it ran, and its result is
        # as lost as any other's under a stopped executor.
        ("flood after 0.05", "lost", "executor stopped"),
    ],
)
async def test_a_background_job_whose_runtime_fails_is_recorded_and_observed(
    engine: AsyncEngine, tmp_path: Path, command: str, status: str, words: str
) -> None:
    loop = asyncio.get_running_loop()
    reported: list[dict[str, Any]] = []
    previous = loop.get_exception_handler()
    loop.set_exception_handler(lambda _loop, context: reported.append(context))
    try:
        jobs = JobRegistry()
        manager = await make_manager(engine, tmp_path, jobs)
        call = new_call_context(
            SandboxMemory(), "alice", request_id="r1", slot_root=tmp_path / "slot-000"
        )
        exp = await manager.create(call, CreateRequest())
        with structlog.testing.capture_logs() as logs:
            job = await manager.execute(call, exp.experiment_id, command, background=True)
            assert job.status == "running"
            running = jobs.get(job.job_id)
            assert running is not None
            # Waits without reading the task's exception (as nobody does for a background
            # job); bounded by a generous time, never by the machine's speed.
            await asyncio.wait([running.task], timeout=60)
            assert running.task.done()
            await asyncio.sleep(0)  # the task's done callbacks have run
            del running
        # The task is gone from the registry: collected now, an unobserved exception
        # would be reported to the loop's handler here.
        gc.collect()
        await asyncio.sleep(0)
        assert [c.get("message") for c in reported] == []
        recorded = await manager.job_record(call, job.job_id)
        assert recorded.status == status, recorded.reason
        assert recorded.reason is not None
        assert words in recorded.reason
        warnings = [e for e in logs if e["log_level"] == "warning"]
        assert [e["event"] for e in warnings] == ["job.runtime_failed"]
        assert warnings[0]["job_id"] == job.job_id
    finally:
        loop.set_exception_handler(previous)
