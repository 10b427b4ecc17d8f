"""A sandbox's daily budget of stored job output on the real databases: jobs finishing
at once (as on several server processes) never pass it between them, and the check
costs little per job (measured and printed, not asserted: machine speed)."""

from __future__ import annotations

import asyncio
import time

import pytest
from db_testkit import an_experiment
from sqlalchemy.ext.asyncio import AsyncEngine

from app.experiments.core.records import JobOutcome, JobRecord
from app.experiments.output_budget import COMMAND_KEPT_CHARS, JOB_ROW_BYTES, TAIL_CHARS
from app.storage.experiment_store import SqlExperimentStore

pytestmark = pytest.mark.integration

OUTPUT = 100_000
BUDGET = 1_000_000
NOW = 86_400.0 * 20_000 + 60


def a_job(job_id: str, key: str = "k") -> JobRecord:
    return JobRecord(job_id, "e1", key, "command", "c", "running", False, 30, NOW - 1)


def an_outcome(size: int) -> JobOutcome:
    return JobOutcome("completed", 0, "o" * size, "", False, False, NOW, 1.0, None, None)


async def test_jobs_finishing_at_once_never_pass_the_day_s_budget(engine: AsyncEngine) -> None:
    records = SqlExperimentStore(engine)
    await records.add(an_experiment("e1"), "created")
    ids = [f"job_{n:03d}" for n in range(30)]
    for job_id in ids:
        await records.add_job(a_job(job_id))

    async def finish(job_id: str) -> bool:
        return await records.finish_job_within(
            job_id, an_outcome(OUTPUT), sandbox_key="k", command="c", day_budget=BUDGET
        )

    kept = await asyncio.gather(*(finish(job_id) for job_id in ids))
    whole = JOB_ROW_BYTES + OUTPUT + 1
    assert sum(kept) == BUDGET // whole  # as many as fit, never one more
    day = int(NOW // 86_400)
    stored = await records.stored_output_of_day("k", day)
    assert stored == sum(kept) * whole + (len(ids) - sum(kept)) * (JOB_ROW_BYTES + TAIL_CHARS + 1)
    for job_id, whole_kept in zip(ids, kept, strict=True):
        record = await records.load_job("k", job_id)
        assert record is not None
        assert record.output_not_kept is not whole_kept
        assert len(record.stdout or "") == (OUTPUT if whole_kept else TAIL_CHARS)
    assert COMMAND_KEPT_CHARS > 1  # the one-character command is kept as it is


async def test_the_budget_check_costs_little_per_job(engine: AsyncEngine) -> None:
    records = SqlExperimentStore(engine)
    await records.add(an_experiment("e1"), "created")
    rounds = 200
    for n in range(2 * rounds):
        await records.add_job(a_job(f"job_{n:04d}"))
    # Interleaved, so a busy machine slows both alike.
    plain = charged = check = 0.0
    for n in range(rounds):
        before = time.perf_counter()
        await records.stored_output_of_day("k", int(NOW // 86_400))  # each job's start
        started = time.perf_counter()
        check += started - before
        await records.finish_job(f"job_{2 * n:04d}", an_outcome(1_000))
        middle = time.perf_counter()
        await records.finish_job_within(
            f"job_{2 * n + 1:04d}",
            an_outcome(1_000),
            sandbox_key="k",
            command="c",
            day_budget=BUDGET,
        )
        plain += middle - started
        charged += time.perf_counter() - middle
    plain, charged, check = plain / rounds, charged / rounds, check / rounds
    print(
        f"\n{engine.dialect.name}: finish_job {plain * 1000:.2f} ms, "
        f"with the budget {charged * 1000:.2f} ms a job; the ceiling's read at a job's "
        f"start {check * 1000:.2f} ms"
    )
    assert await records.stored_output_of_day("k", int(NOW // 86_400)) == rounds * (
        JOB_ROW_BYTES + 1_001
    )
