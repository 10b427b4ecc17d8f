"""Retention: finished work is forgotten after its time, and nothing else is."""

from __future__ import annotations

from datetime import UTC, datetime

import sqlalchemy as sa
from db_testkit import an_experiment
from sqlalchemy.ext.asyncio import AsyncEngine

from app.egress.records import Notice
from app.experiments.core.records import ArtifactRecord, JobRecord
from app.experiments.core.states import State
from app.storage.audit import AuditTrail
from app.storage.db import Repository, ToolCall
from app.storage.egress_store import SqlUsageRecords
from app.storage.experiment_store import SqlExperimentStore
from app.storage.retention import Retention

DAY = 86_400.0
NOW = 100 * DAY


def egress_at(engine: AsyncEngine, at: float = NOW) -> SqlUsageRecords:
    return SqlUsageRecords(engine, clock=lambda: at)


async def make(records: SqlExperimentStore, experiment_id: str, destroyed_at: float | None) -> None:
    await records.add(an_experiment(experiment_id), "created")
    job = JobRecord(
        job_id=f"job_{experiment_id}",
        experiment_id=experiment_id,
        sandbox_key="k",
        kind="command",
        command="true",
        status="completed",
        background=False,
        timeout_s=60,
        started_at=0.0,
        stdout="x" * 1000,
    )
    await records.add_job(job)
    if destroyed_at is not None:
        await records.transition(experiment_id, State.DESTROYED, "destroyed", destroyed_at)


async def test_old_destroyed_experiments_and_old_calls_go_and_the_rest_stays(
    sqlite_engine: AsyncEngine,
) -> None:
    records, repository = SqlExperimentStore(sqlite_engine), Repository(sqlite_engine)
    await make(records, "old", destroyed_at=NOW - 8 * DAY)
    await make(records, "recent", destroyed_at=NOW - 1 * DAY)
    await make(records, "live", destroyed_at=None)  # never destroyed, however old
    await make(records, "kept", destroyed_at=NOW - 8 * DAY)
    await records.add_artifacts(
        [
            ArtifactRecord(
                artifact_id="art_1",
                experiment_id="kept",
                sandbox_key="k",
                path="out.txt",
                size=1,
                sha256="0" * 64,
                stored_as="art_1",
                created_at=0.0,
            )
        ]
    )
    for started in (NOW - 8 * DAY, NOW - 1 * DAY):
        await AuditTrail(sqlite_engine).record(
            request_id=f"r{started}", sandbox_key="k", tool="t", started=started, outcome="ok"
        )

    await Retention(
        repository, records, egress_at(sqlite_engine), keep_s=7 * DAY, clock=lambda: NOW
    ).sweep()

    left = {e.experiment_id for e in await records.of_sandbox("k")}
    assert left == {"recent", "live", "kept"}
    assert await records.jobs_of("old") == []  # the job's output went with it
    assert await records.transitions("old") == []
    assert [j.job_id for j in await records.jobs_of("kept")] == ["job_kept"]
    async with sqlite_engine.connect() as connection:
        starts = (await connection.execute(sa.select(ToolCall.started_at))).scalars().all()
    assert [s.replace(tzinfo=UTC) for s in starts] == [datetime.fromtimestamp(NOW - 1 * DAY, UTC)]


async def test_the_sweep_runs_once_an_interval_not_on_every_watchdog_tick(
    sqlite_engine: AsyncEngine,
) -> None:
    records, repository = SqlExperimentStore(sqlite_engine), Repository(sqlite_engine)
    now = [NOW]
    retention = Retention(
        repository, records, egress_at(sqlite_engine), keep_s=7 * DAY, clock=lambda: now[0]
    )
    await retention.sweep()  # the first tick sweeps (nothing to forget yet)
    await make(records, "old", destroyed_at=NOW - 8 * DAY)
    await retention.sweep()  # a tick later: not due yet
    assert {e.experiment_id for e in await records.of_sandbox("k")} == {"old"}
    now[0] += retention.every_s
    await retention.sweep()  # due again
    assert await records.of_sandbox("k") == []


async def test_egress_usage_goes_with_its_experiment_and_old_notices_go(
    sqlite_engine: AsyncEngine,
) -> None:
    """Egress rows have no foreign key (bytes are counted by container): retention
    deletes those of experiments no longer recorded, and notices nobody took."""
    records, repository = SqlExperimentStore(sqlite_engine), Repository(sqlite_engine)
    await make(records, "old", destroyed_at=NOW - 8 * DAY)
    await make(records, "live", destroyed_at=None)
    then = egress_at(sqlite_engine, NOW - 8 * DAY)
    await then.record(
        {"old": 10, "live": 20, "gone-helper": 30},
        notices=[Notice("c-old", "old", "refused", "x"), Notice("c-live", "live", "cap")],
    )
    await egress_at(sqlite_engine, NOW - 1 * DAY).record({"recent-helper": 5})
    egress = egress_at(sqlite_engine)
    await Retention(repository, records, egress, keep_s=7 * DAY, clock=lambda: NOW).sweep()
    kept = await egress.load(["old", "live", "gone-helper", "recent-helper"])
    assert set(kept) == {"live", "recent-helper"}  # a live experiment keeps its count
    assert await egress.take_notices("c-old") == []
    assert await egress.take_notices("c-live") == []
