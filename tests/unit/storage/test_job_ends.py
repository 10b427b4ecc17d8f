"""The logs resource reads the ends of each job's output, cut by the database.

The resource shows each job as the views show it: its command cut to 1,000 characters
and a head-and-tail excerpt of each output stream. ``SqlExperimentStore.load_job_ends``
reads that much with ``substr`` and ``length`` in SQL; before it, the resource read
each job whole (up to 1 MB a stream) to keep 10,000 characters of it. These check
that what is read is bounded, and that the resource's text is the one the whole
record gave.
"""

from __future__ import annotations

import tracemalloc

import pytest
import sqlalchemy as sa
from db_testkit import an_experiment
from sqlalchemy.ext.asyncio import AsyncEngine

from app.experiments.core.records import JobOutcome, JobRecord
from app.experiments.views import (
    EXCERPT_HEAD_CHARS,
    EXCERPT_TAIL_CHARS,
    MAX_LISTED_COMMAND_CHARS,
    excerpt,
)
from app.mcp.resources import _logged
from app.storage.experiment_rows import JobRow
from app.storage.experiment_store import SqlExperimentStore

MB = 1_048_576
BOTH = EXCERPT_HEAD_CHARS + EXCERPT_TAIL_CHARS


def old_logged(job: JobRecord) -> str:
    """The resource's text of one job as it was made from the whole record."""
    command = job.command[:MAX_LISTED_COMMAND_CHARS]
    if len(job.command) > len(command):
        command += f" [... {len(job.command) - len(command)} characters of the command]"
    stdout, _ = excerpt(job.stdout or "")
    stderr, _ = excerpt(job.stderr or "")
    return f"$ {command}\n{stdout}{stderr}[{job.status}, exit {job.exit_code}] {job.job_id}\n"


async def add_job(
    engine: AsyncEngine,
    records: SqlExperimentStore,
    job_id: str,
    command: str,
    stdout: str,
    stderr: str,
) -> None:
    await records.add_job(
        JobRecord(job_id, "exp", "k", "command", command, "running", False, 60, 1.0)
    )
    await records.finish_job(
        job_id, JobOutcome("failed", 3, stdout, stderr, False, False, 2.0, 1.0, None, None)
    )
    # As stored before NULs were replaced (a row of an older server): written as is.
    async with engine.begin() as connection:
        await connection.execute(
            sa.update(JobRow).where(JobRow.job_id == job_id).values(stdout=stdout, stderr=stderr)
        )


# Around both boundaries, several scripts (one to four UTF-8 bytes a character), a NUL
# (in a row an older server stored; SQLite's length and substr stop at one), and none.
OUTPUTS = [
    "",
    "short\n",
    "a" * BOTH,
    "a" * (BOTH + 1),
    "h" * EXCERPT_HEAD_CHARS + "é" * EXCERPT_TAIL_CHARS + "z",
    "".join(chr(0x20 + (i * 7919) % 0x2FFF) for i in range(30_000)),
    "🙂" * (BOTH + 5) + "end",
    "before\x00after" * 2_000,
    "x" * 5_000 + "\x00" + "y" * 50_000,
]


@pytest.mark.parametrize("index", range(len(OUTPUTS)))
async def test_the_log_of_a_job_is_the_text_its_whole_record_gave(
    sqlite_engine: AsyncEngine, index: int
) -> None:
    records = SqlExperimentStore(sqlite_engine)
    await records.add(an_experiment("exp"), "created")
    out, err = OUTPUTS[index], OUTPUTS[-1 - index]
    for n, command in enumerate(["make test", "é" * (MAX_LISTED_COMMAND_CHARS + 17)]):
        await add_job(sqlite_engine, records, f"job_{n}", command, out, err)
        ends = await records.load_job_ends(
            "k",
            f"job_{n}",
            head=EXCERPT_HEAD_CHARS,
            tail=EXCERPT_TAIL_CHARS,
            command_chars=MAX_LISTED_COMMAND_CHARS,
        )
        whole = await records.load_job("k", f"job_{n}")
        assert ends is not None
        assert whole is not None
        assert _logged(ends) == old_logged(whole)
    assert await records.load_job_ends("other", "job_0", head=1, tail=1, command_chars=1) is None, (
        "another sandbox's job reads like none"
    )


async def test_the_ends_of_big_outputs_are_read_not_the_outputs(
    sqlite_engine: AsyncEngine,
) -> None:
    records = SqlExperimentStore(sqlite_engine)
    await records.add(an_experiment("exp"), "created")
    jobs = 10
    for n in range(jobs):
        await add_job(
            sqlite_engine, records, f"job_{n}", "yes | head -c 1048576", "y" * MB, "e" * MB
        )

    tracemalloc.start()
    try:
        shown = [
            await records.load_job_ends(
                "k",
                f"job_{n}",
                head=EXCERPT_HEAD_CHARS,
                tail=EXCERPT_TAIL_CHARS,
                command_chars=MAX_LISTED_COMMAND_CHARS,
            )
            for n in range(jobs)
        ]
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    for ends in shown:
        assert ends is not None
        for stream in (ends.stdout, ends.stderr):
            assert stream.length == MB
            assert (len(stream.head), len(stream.tail)) == (EXCERPT_HEAD_CHARS, EXCERPT_TAIL_CHARS)
    # One job's output alone is 2 MB: the ten of them read whole were 20 MB.
    assert peak < MB, f"reading the ends of {jobs} jobs took {peak / MB:.1f} MB"
