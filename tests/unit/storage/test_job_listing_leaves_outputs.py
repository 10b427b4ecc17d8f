"""Review 6, finding 8: every job's whole output is kept while its experiment lives, and
``get_experiment`` and ``compare_experiments`` load all of it to show none of it.

``JobRecords.jobs_of`` (app/storage/job_records.py) selects whole job rows, stdout
and stderr included (1 MB each a job, the output cap), for every job the experiment
ever ran; ``ExperimentView.of`` then shows each job ``with_output=False`` and the
comparison only its exit code. Nothing bounds how many finished jobs a live
experiment keeps: a tenant's loop of commands that print 1 MB adds 2 MB a command to
the shared database, and each of its cheap ``get_experiment`` calls then decodes all
of it (on the event loop, through the async driver) and holds it in memory.
"""

from __future__ import annotations

import tracemalloc

from db_testkit import an_experiment
from sqlalchemy.ext.asyncio import AsyncEngine

from app.experiments.records import JobOutcome, JobRecord
from app.storage.experiment_store import ExperimentRecords

JOBS = 20
MB = 1_048_576


async def test_listing_an_experiment_s_jobs_does_not_load_their_outputs(
    sqlite_engine: AsyncEngine,
) -> None:
    records = ExperimentRecords(sqlite_engine)
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
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert len(jobs) == JOBS
    assert peak < 4 * MB, (
        f"listing {JOBS} jobs (for their status and exit codes) took {peak / MB:.0f} MB: "
        "every job's whole output was loaded"
    )
