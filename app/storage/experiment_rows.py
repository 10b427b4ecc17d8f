"""The experiment tables as ORM rows, and the records (app.experiments.core.records) they
become at the store's boundary: experiments, their transitions, jobs and artifacts.

A record's fields are its row's columns of the same names; only the JSON columns
(and the state) are decoded on the way out.
"""

from __future__ import annotations

import dataclasses
import json
from typing import TYPE_CHECKING, Any, TypeVar

import sqlalchemy as sa
from sqlalchemy.orm import Mapped, mapped_column

from app.experiments.core.records import ArtifactRecord, Experiment, JobRecord, JobSummary
from app.experiments.core.states import State
from app.storage.db import Base

if TYPE_CHECKING:
    from _typeshed import DataclassInstance

R = TypeVar("R", bound="DataclassInstance")


class _OfExperiment:
    """The columns of a row that is an experiment's (and goes when it is deleted), and
    so its sandbox's (every query is scoped to a sandbox key)."""

    experiment_id: Mapped[str] = mapped_column(
        sa.String(40), sa.ForeignKey("experiments.experiment_id", ondelete="CASCADE"), index=True
    )
    sandbox_key: Mapped[str] = mapped_column(sa.String(128), index=True)


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
    files_copied: Mapped[int | None] = mapped_column(sa.Integer)
    secrets_skipped: Mapped[int | None] = mapped_column(sa.Integer)
    creator_process: Mapped[str | None] = mapped_column(sa.String(40))


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


class JobRow(_OfExperiment, Base):
    __tablename__ = "jobs"

    job_id: Mapped[str] = mapped_column(sa.String(40), primary_key=True)
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
    # Which server process runs it (app.experiments.recovery.process_registry), the pids of its
    # process tree's root and supervisor in the container (the killer's arguments), and
    # whether another process asked for it to be cancelled.
    owner_process: Mapped[str | None] = mapped_column(sa.String(40))
    root_pid: Mapped[int | None] = mapped_column(sa.Integer)
    supervisor_pid: Mapped[int | None] = mapped_column(sa.Integer)
    cancel_requested: Mapped[bool] = mapped_column(sa.Boolean, default=False)
    output_not_kept: Mapped[bool] = mapped_column(sa.Boolean, default=False)


class JobOutputDayRow(Base):
    """A sandbox's stored job bytes of a UTC day (app/experiments/output_budget.py)."""

    __tablename__ = "job_output_days"

    sandbox_key: Mapped[str] = mapped_column(sa.String(128), primary_key=True)
    day: Mapped[int] = mapped_column(sa.Integer, primary_key=True)  # days since 1970, UTC
    bytes: Mapped[int] = mapped_column(sa.BigInteger)
    # Whether the last job charged was kept whole: what the charging upsert returns.
    kept: Mapped[bool] = mapped_column(sa.Boolean)
    updated_at: Mapped[float] = mapped_column(sa.Float)


class ArtifactRow(_OfExperiment, Base):
    __tablename__ = "artifacts"

    artifact_id: Mapped[str] = mapped_column(sa.String(40), primary_key=True)
    path: Mapped[str] = mapped_column(sa.String(4096))
    size: Mapped[int] = mapped_column(sa.BigInteger)
    sha256: Mapped[str] = mapped_column(sa.String(64))
    stored_as: Mapped[str] = mapped_column(sa.String(200))
    created_at: Mapped[float] = mapped_column(sa.Float)
    # Set when the sandbox is emptied: the artifact outlives it by ARTIFACT_TTL_S.
    expires_at: Mapped[float | None] = mapped_column(sa.Float)


def record_of(record: type[R], row: object, **decoded: Any) -> R:
    """A ``record`` from ``row``'s columns of the same names; ``decoded`` gives the rest."""
    names = [f.name for f in dataclasses.fields(record) if f.name not in decoded]
    return record(**{name: getattr(row, name) for name in names}, **decoded)


def experiment_of(row: ExperimentRow) -> Experiment:
    return record_of(
        Experiment,
        row,
        state=State(row.state),
        isolation=json.loads(row.isolation),
        warnings=json.loads(row.warnings),
        findings=loads_or_none(row.findings),
    )


def experiment_row(experiment: Experiment) -> ExperimentRow:
    """A new experiment's row (no findings yet)."""
    values = {f.name: getattr(experiment, f.name) for f in dataclasses.fields(experiment)}
    values.update(
        state=experiment.state.value,
        isolation=json.dumps(experiment.isolation),
        warnings=json.dumps(experiment.warnings),
        findings=None,
    )
    return ExperimentRow(**values)


def job_of(row: JobRow) -> JobRecord:
    return record_of(JobRecord, row, test_summary=loads_or_none(row.test_summary))


# The job columns a JobSummary holds: every one but the output.
JOB_SUMMARY_COLUMNS = tuple(getattr(JobRow, f.name) for f in dataclasses.fields(JobSummary))


def job_summary_of(row: object) -> JobSummary:
    """A summary from a row of :data:`JOB_SUMMARY_COLUMNS` (or a whole job row)."""
    return record_of(
        JobSummary, row, test_summary=loads_or_none(getattr(row, "test_summary", None))
    )


def artifact_of(row: ArtifactRow) -> ArtifactRecord:
    return record_of(ArtifactRecord, row)


def pids_of(row: JobRow) -> tuple[int, int] | None:
    """A job's process tree's root and supervisor pids, once announced."""
    if row.root_pid is None or row.supervisor_pid is None:
        return None
    return (row.root_pid, row.supervisor_pid)


def loads_or_none(text: str | None) -> Any:
    return json.loads(text) if text else None


def dumps_or_none(value: dict[str, Any] | None) -> str | None:
    return json.dumps(value) if value is not None else None
