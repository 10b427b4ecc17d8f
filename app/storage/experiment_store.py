"""The experiment audit trail in the database: experiments, transitions, jobs, artifacts.

Every query is scoped to a sandbox key: another key's id is indistinguishable
from an id that never existed.
"""

from __future__ import annotations

import json
from contextlib import AbstractAsyncContextManager
from dataclasses import asdict
from typing import Any

import sqlalchemy as sa
from sqlalchemy.ext.asyncio import AsyncEngine, AsyncSession, async_sessionmaker
from sqlalchemy.orm import Mapped, mapped_column

from app.experiments.errors import ExperimentNotFound
from app.experiments.records import (
    ArtifactRecord,
    Experiment,
    JobControl,
    JobOutcome,
    JobRecord,
    LostJob,
)
from app.experiments.states import State, check_transition
from app.storage.db import Base, transaction


class ExperimentRow(Base):
    __tablename__ = "experiments"

    experiment_id: Mapped[str] = mapped_column(sa.String(40), primary_key=True)
    sandbox_key: Mapped[str] = mapped_column(sa.String(128), index=True)
    name: Mapped[str] = mapped_column(sa.String(200))
    goal: Mapped[str] = mapped_column(sa.Text)
    state: Mapped[str] = mapped_column(sa.String(16))
    image: Mapped[str] = mapped_column(sa.String(200))
    container_id: Mapped[str | None] = mapped_column(sa.String(80))
    isolation: Mapped[str] = mapped_column(sa.Text)
    warnings: Mapped[str] = mapped_column(sa.Text)
    source: Mapped[str] = mapped_column(sa.String(32))
    created_at: Mapped[float] = mapped_column(sa.Float)
    updated_at: Mapped[float] = mapped_column(sa.Float)
    findings: Mapped[str | None] = mapped_column(sa.Text)


class TransitionRow(Base):
    __tablename__ = "experiment_transitions"

    id: Mapped[int] = mapped_column(primary_key=True, autoincrement=True)
    experiment_id: Mapped[str] = mapped_column(
        sa.String(40), sa.ForeignKey("experiments.experiment_id", ondelete="CASCADE"), index=True
    )
    from_state: Mapped[str | None] = mapped_column(sa.String(16))
    to_state: Mapped[str] = mapped_column(sa.String(16))
    at: Mapped[float] = mapped_column(sa.Float)
    reason: Mapped[str] = mapped_column(sa.Text)


class JobRow(Base):
    __tablename__ = "jobs"

    job_id: Mapped[str] = mapped_column(sa.String(40), primary_key=True)
    experiment_id: Mapped[str] = mapped_column(
        sa.String(40), sa.ForeignKey("experiments.experiment_id", ondelete="CASCADE"), index=True
    )
    sandbox_key: Mapped[str] = mapped_column(sa.String(128), index=True)
    kind: Mapped[str] = mapped_column(sa.String(16))
    command: Mapped[str] = mapped_column(sa.Text)
    status: Mapped[str] = mapped_column(sa.String(16))
    background: Mapped[bool] = mapped_column(sa.Boolean)
    timeout_s: Mapped[float] = mapped_column(sa.Float)
    exit_code: Mapped[int | None] = mapped_column(sa.Integer)
    stdout: Mapped[str | None] = mapped_column(sa.Text)
    stderr: Mapped[str | None] = mapped_column(sa.Text)
    stdout_truncated: Mapped[bool] = mapped_column(sa.Boolean)
    stderr_truncated: Mapped[bool] = mapped_column(sa.Boolean)
    started_at: Mapped[float] = mapped_column(sa.Float)
    finished_at: Mapped[float | None] = mapped_column(sa.Float)
    duration_s: Mapped[float | None] = mapped_column(sa.Float)
    reason: Mapped[str | None] = mapped_column(sa.Text)
    test_summary: Mapped[str | None] = mapped_column(sa.Text)  # JSON, for run_tests jobs
    # Which server process runs it (app.experiments.process_registry), the pids of its
    # process tree's root and supervisor in the container (the killer's arguments), and
    # whether another process asked for it to be cancelled.
    owner_process: Mapped[str | None] = mapped_column(sa.String(40))
    root_pid: Mapped[int | None] = mapped_column(sa.Integer)
    supervisor_pid: Mapped[int | None] = mapped_column(sa.Integer)
    cancel_requested: Mapped[bool] = mapped_column(sa.Boolean, default=False)


class ArtifactRow(Base):
    __tablename__ = "artifacts"

    artifact_id: Mapped[str] = mapped_column(sa.String(40), primary_key=True)
    experiment_id: Mapped[str] = mapped_column(
        sa.String(40), sa.ForeignKey("experiments.experiment_id", ondelete="CASCADE"), index=True
    )
    sandbox_key: Mapped[str] = mapped_column(sa.String(128), index=True)
    path: Mapped[str] = mapped_column(sa.String(4096))
    size: Mapped[int] = mapped_column(sa.BigInteger)
    sha256: Mapped[str] = mapped_column(sa.String(64))
    stored_as: Mapped[str] = mapped_column(sa.String(200))
    created_at: Mapped[float] = mapped_column(sa.Float)
    # Set when the sandbox is emptied: the artifact outlives it by ARTIFACT_TTL_S.
    expires_at: Mapped[float | None] = mapped_column(sa.Float)


def _experiment(row: ExperimentRow) -> Experiment:
    return Experiment(
        experiment_id=row.experiment_id,
        sandbox_key=row.sandbox_key,
        name=row.name,
        goal=row.goal,
        state=State(row.state),
        image=row.image,
        container_id=row.container_id,
        isolation=json.loads(row.isolation),
        warnings=json.loads(row.warnings),
        source=row.source,
        created_at=row.created_at,
        updated_at=row.updated_at,
        findings=json.loads(row.findings) if row.findings else None,
    )


def _job(row: JobRow) -> JobRecord:
    return JobRecord(
        job_id=row.job_id,
        experiment_id=row.experiment_id,
        sandbox_key=row.sandbox_key,
        kind=row.kind,
        command=row.command,
        status=row.status,
        background=row.background,
        timeout_s=row.timeout_s,
        started_at=row.started_at,
        exit_code=row.exit_code,
        stdout=row.stdout,
        stderr=row.stderr,
        stdout_truncated=row.stdout_truncated,
        stderr_truncated=row.stderr_truncated,
        finished_at=row.finished_at,
        duration_s=row.duration_s,
        reason=row.reason,
        test_summary=json.loads(row.test_summary) if row.test_summary else None,
        owner_process=row.owner_process,
    )


def _artifact(row: ArtifactRow) -> ArtifactRecord:
    return ArtifactRecord(
        artifact_id=row.artifact_id,
        experiment_id=row.experiment_id,
        sandbox_key=row.sandbox_key,
        path=row.path,
        size=row.size,
        sha256=row.sha256,
        stored_as=row.stored_as,
        created_at=row.created_at,
        expires_at=row.expires_at,
    )


class ExperimentRecords:
    def __init__(self, engine: AsyncEngine) -> None:
        self._sessions = async_sessionmaker(engine, expire_on_commit=False)

    def _transaction(self) -> AbstractAsyncContextManager[AsyncSession]:
        return transaction(self._sessions)

    async def add(self, experiment: Experiment, reason: str) -> None:
        async with self._transaction() as session:
            session.add(
                ExperimentRow(
                    experiment_id=experiment.experiment_id,
                    sandbox_key=experiment.sandbox_key,
                    name=experiment.name,
                    goal=experiment.goal,
                    state=experiment.state.value,
                    image=experiment.image,
                    container_id=experiment.container_id,
                    isolation=json.dumps(experiment.isolation),
                    warnings=json.dumps(experiment.warnings),
                    source=experiment.source,
                    created_at=experiment.created_at,
                    updated_at=experiment.updated_at,
                    findings=None,
                )
            )
            await session.flush()
            session.add(
                TransitionRow(
                    experiment_id=experiment.experiment_id,
                    from_state=None,
                    to_state=experiment.state.value,
                    at=experiment.created_at,
                    reason=reason,
                )
            )

    async def load(self, sandbox_key: str, experiment_id: str) -> Experiment | None:
        async with self._transaction() as session:
            row = await session.get(ExperimentRow, experiment_id)
            if row is None or row.sandbox_key != sandbox_key:
                return None
            return _experiment(row)

    async def get(self, sandbox_key: str, experiment_id: str) -> Experiment:
        """The sandbox's experiment ``experiment_id``: the one ownership check.

        Raises:
            ExperimentNotFound: there is none in this sandbox (another sandbox's id reads
                exactly like one that never existed).
        """
        experiment = await self.load(sandbox_key, experiment_id)
        if experiment is None:
            raise ExperimentNotFound("experiment", experiment_id)
        return experiment

    async def of_sandbox(
        self, sandbox_key: str, *, include_destroyed: bool = True
    ) -> list[Experiment]:
        async with self._transaction() as session:
            query = sa.select(ExperimentRow).where(ExperimentRow.sandbox_key == sandbox_key)
            if not include_destroyed:
                query = query.where(ExperimentRow.state != State.DESTROYED.value)
            rows = await session.scalars(query.order_by(ExperimentRow.created_at))
            return [_experiment(row) for row in rows]

    async def live(self) -> list[Experiment]:
        """Every experiment not yet destroyed, across all sandboxes (start-up sweep)."""
        async with self._transaction() as session:
            rows = await session.scalars(
                sa.select(ExperimentRow).where(ExperimentRow.state != State.DESTROYED.value)
            )
            return [_experiment(row) for row in rows]

    async def transition(
        self, experiment_id: str, target: State, reason: str, at: float, **changes: Any
    ) -> State:
        """Move an experiment to ``target`` if the machine allows it; returns the old state.

        Raises:
            InvalidTransition: the machine forbids it (nothing is written).
        """
        async with self._transaction() as session:
            row = await session.get(ExperimentRow, experiment_id, with_for_update=True)
            assert row is not None
            current = State(row.state)
            check_transition(current, target)
            row.state = target.value
            row.updated_at = at
            for name, value in changes.items():
                encoded = name in ("findings", "isolation", "warnings")
                setattr(row, name, json.dumps(value) if encoded else value)
            session.add(
                TransitionRow(
                    experiment_id=experiment_id,
                    from_state=current.value,
                    to_state=target.value,
                    at=at,
                    reason=reason,
                )
            )
            return current

    async def replace_container(
        self, experiment_id: str, old: str, new: str, warnings: list[str]
    ) -> bool:
        """Point a live experiment at a new container, if it still has ``old``."""
        async with self._transaction() as session:
            result = await session.execute(
                sa.update(ExperimentRow)
                .where(
                    ExperimentRow.experiment_id == experiment_id,
                    ExperimentRow.container_id == old,
                    ExperimentRow.state != State.DESTROYED.value,
                )
                .values(container_id=new, warnings=json.dumps(warnings))
            )
            return bool(getattr(result, "rowcount", 0))

    async def transitions(self, experiment_id: str) -> list[tuple[str | None, str, str]]:
        async with self._transaction() as session:
            rows = await session.scalars(
                sa.select(TransitionRow)
                .where(TransitionRow.experiment_id == experiment_id)
                .order_by(TransitionRow.id)
            )
            return [(r.from_state, r.to_state, r.reason) for r in rows]

    async def add_job(self, job: JobRecord) -> None:
        values = asdict(job)
        summary = values.pop("test_summary")
        async with self._transaction() as session:
            session.add(JobRow(**values, test_summary=_json_or_none(summary)))

    async def finish_job(self, job_id: str, outcome: JobOutcome) -> None:
        values = asdict(outcome)
        values["test_summary"] = _json_or_none(values["test_summary"])
        async with self._transaction() as session:
            await session.execute(sa.update(JobRow).where(JobRow.job_id == job_id).values(values))

    async def load_job(self, sandbox_key: str, job_id: str) -> JobRecord | None:
        async with self._transaction() as session:
            row = await session.get(JobRow, job_id)
            if row is None or row.sandbox_key != sandbox_key:
                return None
            return _job(row)

    async def jobs_of(self, experiment_id: str) -> list[JobRecord]:
        async with self._transaction() as session:
            rows = await session.scalars(
                sa.select(JobRow)
                .where(JobRow.experiment_id == experiment_id)
                .order_by(JobRow.started_at)
            )
            return [_job(row) for row in rows]

    async def mark_lost_jobs(
        self, at: float, live_processes: set[str], reason: str
    ) -> list[LostJob]:
        """Running jobs whose process is not in ``live_processes`` (or that have no owner)
        can never report: record them lost with ``reason``; the jobs so marked."""
        async with self._transaction() as session:
            dead = sa.and_(
                JobRow.status == "running",
                sa.or_(JobRow.owner_process.is_(None), JobRow.owner_process.not_in(live_processes)),
            )
            rows = (
                await session.execute(
                    sa.select(JobRow, ExperimentRow.container_id)
                    .join(ExperimentRow, ExperimentRow.experiment_id == JobRow.experiment_id)
                    .where(dead)
                    .with_for_update(of=JobRow)
                )
            ).all()
            if not rows:
                return []
            ids = [row.job_id for row, _ in rows]
            await session.execute(
                sa.update(JobRow)
                .where(JobRow.job_id.in_(ids), JobRow.status == "running")
                .values(status="lost", finished_at=at, reason=reason)
            )
            return [
                LostJob(row.job_id, row.experiment_id, container_id, _pids(row))
                for row, container_id in rows
            ]

    async def record_job_pids(self, job_id: str, pids: tuple[int, int]) -> None:
        async with self._transaction() as session:
            await session.execute(
                sa.update(JobRow)
                .where(JobRow.job_id == job_id)
                .values(root_pid=pids[0], supervisor_pid=pids[1])
            )

    async def job_control(self, job_id: str) -> JobControl | None:
        """Who runs the job, its process tree's pids and whether a cancel was asked for."""
        async with self._transaction() as session:
            row = await session.get(JobRow, job_id)
            if row is None:
                return None
            return JobControl(row.owner_process, _pids(row), bool(row.cancel_requested))

    async def request_cancel(self, job_id: str) -> None:
        async with self._transaction() as session:
            await session.execute(
                sa.update(JobRow).where(JobRow.job_id == job_id).values(cancel_requested=True)
            )

    async def cancel_requests(self, owner_process: str) -> list[str]:
        """Running jobs of ``owner_process`` that another process asked to cancel."""
        async with self._transaction() as session:
            ids = await session.scalars(
                sa.select(JobRow.job_id).where(
                    JobRow.owner_process == owner_process,
                    JobRow.status == "running",
                    JobRow.cancel_requested.is_(True),
                )
            )
            return list(ids)

    async def running_jobs(self, experiment_id: str) -> list[JobRecord]:
        """The experiment's jobs recorded as running, whichever process runs them."""
        async with self._transaction() as session:
            rows = await session.scalars(
                sa.select(JobRow).where(
                    JobRow.experiment_id == experiment_id, JobRow.status == "running"
                )
            )
            return [_job(row) for row in rows]

    async def busy_sandboxes(self) -> set[str]:
        """Sandbox keys with a job recorded as running (in any process)."""
        async with self._transaction() as session:
            keys = await session.scalars(
                sa.select(JobRow.sandbox_key).where(JobRow.status == "running").distinct()
            )
            return set(keys)

    async def refused_creations(self) -> list[Experiment]:
        """Experiments whose creation failed before they got a container (for example
        while the Docker engine was down): nothing of them is left but the record."""
        async with self._transaction() as session:
            rows = await session.scalars(
                sa.select(ExperimentRow).where(
                    ExperimentRow.state == State.FAILED.value,
                    ExperimentRow.container_id.is_(None),
                )
            )
            return [_experiment(row) for row in rows]

    async def forget_destroyed_before(self, cutoff: float) -> int:
        """Delete experiments destroyed before ``cutoff`` (their transitions and jobs go
        with them) that keep no artifact; how many went."""
        kept = sa.select(ArtifactRow.experiment_id).where(
            ArtifactRow.experiment_id == ExperimentRow.experiment_id
        )
        async with self._transaction() as session:
            result = await session.execute(
                sa.delete(ExperimentRow).where(
                    ExperimentRow.state == State.DESTROYED.value,
                    ExperimentRow.updated_at < cutoff,
                    ~sa.exists(kept),
                )
            )
            return int(getattr(result, "rowcount", 0) or 0)

    async def add_artifacts(self, artifacts: list[ArtifactRecord]) -> None:
        async with self._transaction() as session:
            session.add_all([ArtifactRow(**asdict(artifact)) for artifact in artifacts])

    async def artifact_bytes_of(self, sandbox_key: str) -> int:
        """What the sandbox's artifacts on the shelf weigh, in bytes."""
        async with self._transaction() as session:
            total = await session.scalar(
                sa.select(sa.func.coalesce(sa.func.sum(ArtifactRow.size), 0)).where(
                    ArtifactRow.sandbox_key == sandbox_key
                )
            )
            return int(total or 0)

    async def artifacts_of(self, sandbox_key: str, experiment_id: str) -> list[ArtifactRecord]:
        async with self._transaction() as session:
            rows = await session.scalars(
                sa.select(ArtifactRow)
                .where(
                    ArtifactRow.sandbox_key == sandbox_key,
                    ArtifactRow.experiment_id == experiment_id,
                )
                .order_by(ArtifactRow.created_at, ArtifactRow.path)
            )
            return [_artifact(row) for row in rows]

    async def start_artifact_clock(self, sandbox_key: str, expires_at: float) -> None:
        async with self._transaction() as session:
            await session.execute(
                sa.update(ArtifactRow)
                .where(ArtifactRow.sandbox_key == sandbox_key, ArtifactRow.expires_at.is_(None))
                .values(expires_at=expires_at)
            )

    async def expired_artifacts(self, now: float) -> list[ArtifactRecord]:
        async with self._transaction() as session:
            rows = await session.scalars(sa.select(ArtifactRow).where(ArtifactRow.expires_at < now))
            return [_artifact(row) for row in rows]

    async def delete_artifacts(self, artifact_ids: list[str]) -> None:
        async with self._transaction() as session:
            await session.execute(
                sa.delete(ArtifactRow).where(ArtifactRow.artifact_id.in_(artifact_ids))
            )


def _pids(row: JobRow) -> tuple[int, int] | None:
    if row.root_pid is None or row.supervisor_pid is None:
        return None
    return (row.root_pid, row.supervisor_pid)


def _json_or_none(value: dict[str, Any] | None) -> str | None:
    return json.dumps(value) if value is not None else None
