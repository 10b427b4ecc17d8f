"""Listing an experiment's jobs, or reading a job's status, leaves their output unread.

A job keeps its stdout and stderr (up to 1 MB each, the output cap) while its
experiment lives. ``get_experiment``, ``compare_experiments``, evidence and destroy's
findings show only each job's status, exit code and duration, and ``get_job_status``
only its status: ``SqlExperimentStore.jobs_of`` and ``load_job_summary``
(app/storage/experiment_store.py) select every column but the output and return
``JobSummary`` records, which have no output fields; only ``load_job`` (a job's result
and logs) reads it.
"""

from __future__ import annotations

import tracemalloc

from db_testkit import an_experiment
from sqlalchemy.ext.asyncio import AsyncEngine

from app.experiments.core.records import JobOutcome, JobRecord
from app.storage.experiment_store import SqlExperimentStore

JOBS = 20
MB = 1_048_576


async def test_listing_an_experiment_s_jobs_does_not_load_their_outputs(
    sqlite_engine: AsyncEngine,
) -> None:
    records = SqlExperimentStore(sqlite_engine)
    await records.add(an_experiment("exp"), "created")
    for n in range(JOBS):
        job_id = f"job_{n:012d}"
        await records.add_job(
            JobRecord(
                job_id=job_id,
                experiment_id="exp",
                sandbox_key="k",
                kind="command",
                command="yes | head -c 1048576",
                status="running",
                background=False,
                timeout_s=60,
                started_at=float(n),
            )
        )
        await records.finish_job(
            job_id,
            JobOutcome("completed", 0, "y" * MB, "e" * MB, True, True, n + 0.5, 0.5, None, None),
        )

    tracemalloc.start()
    try:
        jobs = await records.jobs_of("exp")  # what get_experiment and compare use
        status = await records.load_job_summary("k", "job_000000000007")  # get_job_status
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert [job.job_id for job in jobs] == [f"job_{n:012d}" for n in range(JOBS)]
    assert {(job.status, job.exit_code) for job in jobs} == {("completed", 0)}
    assert all(not hasattr(job, "stdout") for job in jobs)  # the type says it has none
    assert status is not None
    assert status.status == "completed"
    assert await records.load_job_summary("other", "job_000000000007") is None
    assert peak < 4 * MB, (
        f"listing {JOBS} jobs (for their status and exit codes) took {peak / MB:.0f} MB: "
        "every job's whole output was loaded"
    )
    whole = await records.load_job("k", "job_000000000007")  # a job's result reads it
    assert whole is not None
    assert whole.stdout == "y" * MB
