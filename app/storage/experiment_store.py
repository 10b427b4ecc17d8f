"""The experiment store in the database: experiments, their transitions, jobs and
artifacts, one class (``SqlExperimentStore``, the ``ExperimentStore`` Protocol of
:mod:`app.experiments.core.store`).

Every query is scoped to a sandbox key: another key's id is indistinguishable
from an id that never existed. The tables and their records are
:mod:`app.storage.experiment_rows`. A job is written when it starts and again when it
ends (``finish_job``); in between, the pids of its process tree (so any process can
kill it) and, from another process, a cancel request (:mod:`app.storage.cancel_requests`,
shared with the MCP task store). Recovery marks lost the running jobs of a process that
died. An artifact (a file copied out of a workspace onto the shelf,
:mod:`app.experiments.evidence.shelf`) is its sandbox's; it outlives an emptied sandbox
until its clock (``start_artifact_clock``) runs out.
"""

from __future__ import annotations

import contextlib
import json
from dataclasses import asdict, replace
from typing import Any

import sqlalchemy as sa
from sqlalchemy.ext.asyncio import AsyncSession
from sqlalchemy.orm import InstrumentedAttribute

from app.experiments.core.errors import ExperimentNotFound, InvalidTransition
from app.experiments.core.records import (
    ArtifactRecord,
    DiskHoldings,
    Experiment,
    JobControl,
    JobEnds,
    JobOutcome,
    JobRecord,
    JobSummary,
    JobTally,
    LostJob,
    Move,
    OutputEnds,
)
from app.experiments.core.states import State, check_transition
from app.experiments.output_budget import cut, day_of, stored_bytes
from app.storage.cancel_requests import CancelRequests
from app.storage.db import upsert_insert
from app.storage.experiment_rows import (
    JOB_SUMMARY_COLUMNS,
    ArtifactRow,
    ExperimentRow,
    JobOutputDayRow,
    JobRow,
    TransitionRow,
    artifact_of,
    dumps_or_none,
    experiment_of,
    experiment_row,
    job_of,
    job_summary_of,
    loads_or_none,
    pids_of,
)


class SqlExperimentStore(CancelRequests):
    """Experiments, their transitions, jobs and artifacts (one store, one engine)."""

    # A job's cancel asked through another process (the shared ``CancelRequests``).
    cancel_row = JobRow
    cancel_id = "job_id"
    cancel_running = "running"

    async def add(self, experiment: Experiment, reason: str) -> None:
        async with self._transaction() as session:
            session.add(experiment_row(experiment))
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
            return experiment_of(row)

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
            return [experiment_of(row) for row in rows]

    async def live(self) -> list[Experiment]:
        """Every experiment not yet destroyed, across all sandboxes (start-up sweep)."""
        async with self._transaction() as session:
            rows = await session.scalars(
                sa.select(ExperimentRow).where(ExperimentRow.state != State.DESTROYED.value)
            )
            return [experiment_of(row) for row in rows]

    async def transition(
        self, experiment_id: str, target: State, reason: str, at: float, **changes: Any
    ) -> State:
        """Move an experiment to ``target`` if the machine allows it; returns the old state.

        Raises:
            InvalidTransition: the machine forbids it (nothing is written).
        """
        async with self._transaction() as session:
            return await _move(session, experiment_id, target, reason, at, **changes)

    async def complete_findings(self, experiment_id: str, findings: dict[str, Any]) -> bool:
        """Replace a destroyed experiment's findings (what its destroy measured after the
        answer); whether it was there."""
        async with self._transaction() as session:
            result = await session.execute(
                sa.update(ExperimentRow)
                .where(
                    ExperimentRow.experiment_id == experiment_id,
                    ExperimentRow.state == State.DESTROYED.value,
                )
                .values(findings=json.dumps(findings))
            )
            return bool(getattr(result, "rowcount", 0))

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

    async def refused_creations(
        self, stale_before: float, live_processes: set[str]
    ) -> list[Experiment]:
        """Experiments whose creation failed before they got a container (for example
        while the Docker engine was down), or still CREATING with their creating process
        not in ``live_processes`` (killed mid-way) or since before ``stale_before`` (no
        creation takes that long; a record from before processes were named): nothing
        of them is left but the record and a folder (the sweep removes a container not
        recorded)."""
        creator = ExperimentRow.creator_process
        async with self._transaction() as session:
            rows = await session.scalars(
                sa.select(ExperimentRow).where(
                    ExperimentRow.container_id.is_(None),
                    sa.or_(
                        ExperimentRow.state == State.FAILED.value,
                        sa.and_(
                            ExperimentRow.state == State.CREATING.value,
                            sa.or_(
                                ExperimentRow.updated_at < stale_before,
                                sa.and_(creator.is_not(None), creator.not_in(live_processes)),
                            ),
                        ),
                    ),
                )
            )
            return [experiment_of(row) for row in rows]

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

    # -- jobs ----------------------------------------------------------------------------

    async def add_job(self, job: JobRecord, *, then: Move | None = None) -> None:
        """Record ``job``; with ``then``, move its experiment in the same transaction
        (one already there stays as it is: a job starting beside others).

        Raises:
            InvalidTransition: the machine forbids ``then``; nothing is written.
        """
        values = asdict(job)
        summary = values.pop("test_summary")
        async with self._transaction() as session:
            session.add(JobRow(**values, test_summary=dumps_or_none(summary)))
            if then is not None:
                await _move(
                    session, then.experiment_id, then.target, then.reason, job.started_at, stay=True
                )

    async def finish_job(
        self, job_id: str, outcome: JobOutcome, *, then: Move | None = None
    ) -> None:
        """Record how the job ended; with ``then``, move its experiment in the same
        transaction if the machine allows it (one destroyed meanwhile stays as it is)."""
        values = asdict(storable(outcome))
        values["test_summary"] = dumps_or_none(values["test_summary"])
        async with self._transaction() as session:
            await session.execute(sa.update(JobRow).where(JobRow.job_id == job_id).values(values))
            await _move_if_last(session, job_id, then, outcome.finished_at)

    async def finish_job_within(
        self,
        job_id: str,
        outcome: JobOutcome,
        *,
        sandbox_key: str,
        command: str,
        day_budget: int,
        then: Move | None = None,
    ) -> bool:
        """``finish_job``, charging the job's command and output to its sandbox's stored
        bytes of the day (UTC, by ``outcome.finished_at``): whole if they fit in
        ``day_budget``, else cut (:func:`app.experiments.output_budget.cut`) and the cut
        charged; True if kept whole.

        One transaction, and one upsert on the day's row decides: whole only if the
        total stays within the budget (``bytes + n <= budget`` in the statement
        itself, on the row it locked), so processes finishing jobs of one sandbox at
        once never pass it between them (SQLite writes one at a time)."""
        outcome = storable(outcome)  # before it is measured: what is stored is charged
        day = day_of(outcome.finished_at)
        whole = stored_bytes(command, outcome.stdout, outcome.stderr)
        cut_outcome, cut_command = cut(outcome, command)
        if_cut = stored_bytes(cut_command, cut_outcome.stdout, cut_outcome.stderr)
        fits = JobOutputDayRow.bytes + whole <= day_budget
        async with self._transaction() as session:
            dialect = session.bind.dialect.name if session.bind is not None else "sqlite"
            insert = upsert_insert(dialect)(JobOutputDayRow).values(
                sandbox_key=sandbox_key,
                day=day,
                bytes=whole if whole <= day_budget else if_cut,
                kept=whole <= day_budget,
                updated_at=outcome.finished_at,
            )
            # One statement decides and charges; both databases evaluate every SET
            # expression on the row as it was, so ``kept`` and ``bytes`` agree.
            kept = bool(
                await session.scalar(
                    insert.on_conflict_do_update(
                        index_elements=[JobOutputDayRow.sandbox_key, JobOutputDayRow.day],
                        set_={
                            "kept": fits,
                            "bytes": sa.case(
                                (fits, JobOutputDayRow.bytes + whole),
                                else_=JobOutputDayRow.bytes + if_cut,
                            ),
                            "updated_at": insert.excluded.updated_at,
                        },
                    ).returning(JobOutputDayRow.kept)
                )
            )
            values = asdict(outcome if kept else cut_outcome)
            if not kept:
                values.update(command=cut_command, output_not_kept=True)
            values["test_summary"] = dumps_or_none(values["test_summary"])
            await session.execute(sa.update(JobRow).where(JobRow.job_id == job_id).values(values))
            await _move_if_last(session, job_id, then, outcome.finished_at)
        return kept

    async def stored_output_of_day(self, sandbox_key: str, day: int) -> int:
        """The job bytes charged to ``sandbox_key`` on ``day`` (days since 1970, UTC)."""
        async with self._transaction() as session:
            stored = await session.scalar(
                sa.select(JobOutputDayRow.bytes).where(
                    JobOutputDayRow.sandbox_key == sandbox_key, JobOutputDayRow.day == day
                )
            )
            return int(stored or 0)

    async def forget_output_days_before(self, cutoff: float) -> int:
        """Retention: the days' counts last touched before ``cutoff`` (a day's budget
        matters on that day only); how many rows went."""
        async with self._transaction() as session:
            gone = await session.execute(
                sa.delete(JobOutputDayRow).where(JobOutputDayRow.updated_at < cutoff)
            )
            return int(getattr(gone, "rowcount", 0) or 0)

    async def load_job(self, sandbox_key: str, job_id: str) -> JobRecord | None:
        async with self._transaction() as session:
            row = await session.get(JobRow, job_id)
            if row is None or row.sandbox_key != sandbox_key:
                return None
            return job_of(row)

    async def load_job_summary(self, sandbox_key: str, job_id: str) -> JobSummary | None:
        """The job without its output (its status, exit code, test summary)."""
        async with self._transaction() as session:
            row = (
                await session.execute(
                    sa.select(*JOB_SUMMARY_COLUMNS).where(
                        JobRow.job_id == job_id, JobRow.sandbox_key == sandbox_key
                    )
                )
            ).first()
            return job_summary_of(row) if row is not None else None

    async def jobs_of(self, experiment_id: str) -> list[JobSummary]:
        """The experiment's jobs in the order they started, without their output: the
        listings show statuses and exit codes, and a job's output is up to 2 MB."""
        async with self._transaction() as session:
            rows = await session.execute(
                sa.select(*JOB_SUMMARY_COLUMNS)
                .where(JobRow.experiment_id == experiment_id)
                .order_by(JobRow.started_at)
            )
            return [job_summary_of(row) for row in rows]

    async def load_job_ends(
        self, sandbox_key: str, job_id: str, *, head: int, tail: int, command_chars: int
    ) -> JobEnds | None:
        """The job with its command cut to ``command_chars`` and only the ends of each
        output stream, ``head`` and ``tail`` characters, cut by the database: what the
        logs resource shows of a job reads that much, not the whole of its output (up
        to 1 MB a stream) to throw most of it away."""
        async with self._transaction() as session:
            sqlite = session.bind is not None and session.bind.dialect.name == "sqlite"
            row = (
                await session.execute(
                    sa.select(
                        sa.func.substr(JobRow.command, 1, command_chars).label("command"),
                        sa.func.length(JobRow.command).label("command_length"),
                        JobRow.status,
                        JobRow.exit_code,
                        *_ends(JobRow.stdout, "stdout", head, tail, sqlite),
                        *_ends(JobRow.stderr, "stderr", head, tail, sqlite),
                    ).where(JobRow.job_id == job_id, JobRow.sandbox_key == sandbox_key)
                )
            ).first()
            if row is None:
                return None
            streams: dict[str, OutputEnds] = {}
            for name in ("stdout", "stderr"):
                if getattr(row, f"{name}_nul", False):
                    # SQLite counts and cuts text only up to a NUL character, which a
                    # command may print: such a stream is read whole and cut here.
                    whole = await session.scalar(
                        sa.select(getattr(JobRow, name)).where(JobRow.job_id == job_id)
                    )
                    streams[name] = OutputEnds.of(whole or "", head, tail)
                else:
                    streams[name] = OutputEnds(
                        getattr(row, f"{name}_head"),
                        getattr(row, f"{name}_tail"),
                        int(getattr(row, f"{name}_length")),
                    )
            return JobEnds(
                job_id=job_id,
                command=row.command,
                command_length=int(row.command_length),
                status=row.status,
                exit_code=row.exit_code,
                stdout=streams["stdout"],
                stderr=streams["stderr"],
            )

    async def newest_jobs(
        self, experiment_id: str, count: int, skip: int, command_chars: int
    ) -> tuple[list[tuple[JobSummary, int]], int]:
        """``count`` of the experiment's jobs, oldest first, after skipping the ``skip``
        newest, each command cut to ``command_chars`` by the database and with its whole
        length; and how many jobs the experiment has in all. A view reads this, never
        every job: an experiment runs any number of jobs over its life, each with a
        command of up to 100,000 characters."""
        command = sa.func.substr(JobRow.command, 1, command_chars).label("command")
        columns = [command if c is JobRow.command else c for c in JOB_SUMMARY_COLUMNS]
        length = sa.func.length(JobRow.command).label("command_length")
        async with self._transaction() as session:
            total = await session.scalar(
                sa.select(sa.func.count()).where(JobRow.experiment_id == experiment_id)
            )
            rows = await session.execute(
                sa.select(*columns, length)
                .where(JobRow.experiment_id == experiment_id)
                .order_by(JobRow.started_at.desc(), JobRow.job_id.desc())
                .offset(skip)
                .limit(count)
            )
            page = [(job_summary_of(row), row.command_length) for row in reversed(rows.all())]
            return page, int(total or 0)

    async def tally(self, experiment_id: str) -> JobTally:
        """The experiment's jobs added up by the database, and its newest test summary:
        the evidence reads this and ``newest_jobs``, never every job."""
        of_experiment = JobRow.experiment_id == experiment_id
        failed = sa.case((JobRow.status != "completed", 1), else_=0)
        async with self._transaction() as session:
            jobs, failures, duration = (
                await session.execute(
                    sa.select(
                        sa.func.count(),
                        sa.func.coalesce(sa.func.sum(failed), 0),
                        sa.func.coalesce(sa.func.sum(JobRow.duration_s), 0.0),
                    ).where(of_experiment)
                )
            ).one()
            summary = await session.scalar(
                sa.select(JobRow.test_summary)
                .where(of_experiment, JobRow.test_summary.is_not(None))
                .order_by(JobRow.started_at.desc(), JobRow.job_id.desc())
                .limit(1)
            )
        return JobTally(int(jobs), int(failures), float(duration), loads_or_none(summary))

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
                LostJob(row.job_id, row.experiment_id, container_id, pids_of(row))
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
            return JobControl(row.owner_process, pids_of(row), bool(row.cancel_requested))

    async def running_jobs(self, experiment_id: str) -> list[JobRecord]:
        """The experiment's jobs recorded as running, whichever process runs them."""
        async with self._transaction() as session:
            rows = await session.scalars(
                sa.select(JobRow).where(
                    JobRow.experiment_id == experiment_id, JobRow.status == "running"
                )
            )
            return [job_of(row) for row in rows]

    async def busy_sandboxes(self) -> set[str]:
        """Sandbox keys with a job recorded as running (in any process)."""
        async with self._transaction() as session:
            keys = await session.scalars(
                sa.select(JobRow.sandbox_key).where(JobRow.status == "running").distinct()
            )
            return set(keys)

    # -- artifacts -----------------------------------------------------------------------

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

    async def disk_holdings(self, sandbox_key: str) -> DiskHoldings:
        """The containers of the sandbox's live experiments and its artifacts' bytes, in
        one statement: the disk budget reads both before every writing call and after
        it, and a burst of first calls waits on every round trip to the database."""
        containers = sa.select(
            ExperimentRow.container_id.label("container_id"), sa.literal(0).label("size")
        ).where(
            ExperimentRow.sandbox_key == sandbox_key,
            ExperimentRow.state != State.DESTROYED.value,
            ExperimentRow.container_id.is_not(None),
        )
        artifacts = sa.select(
            sa.literal(None, sa.String).label("container_id"),
            sa.func.coalesce(sa.func.sum(ArtifactRow.size), 0).label("size"),
        ).where(ArtifactRow.sandbox_key == sandbox_key)
        async with self._transaction() as session:
            rows: list[Any] = list(await session.execute(sa.union_all(containers, artifacts)))
        return DiskHoldings(
            containers=tuple(row.container_id for row in rows if row.container_id is not None),
            artifact_bytes=sum(int(row.size or 0) for row in rows),
        )

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
            return [artifact_of(row) for row in rows]

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
            return [artifact_of(row) for row in rows]

    async def delete_artifacts(self, artifact_ids: list[str]) -> None:
        async with self._transaction() as session:
            await session.execute(
                sa.delete(ArtifactRow).where(ArtifactRow.artifact_id.in_(artifact_ids))
            )


def storable(outcome: JobOutcome) -> JobOutcome:
    """``outcome`` with each NUL character of its output as U+FFFD (what the decoder makes
    of bytes that are not text). A command may print NUL; PostgreSQL's text cannot hold
    it, and refused the whole update, which left the job running for ever (its sandbox
    busy, never emptied); SQLite stored it, but its text functions stop at it. Both
    databases now keep the same output."""
    if "\x00" not in outcome.stdout and "\x00" not in outcome.stderr:
        return outcome
    return replace(
        outcome,
        stdout=outcome.stdout.replace("\x00", "\ufffd"),
        stderr=outcome.stderr.replace("\x00", "\ufffd"),
    )


def _ends(
    column: InstrumentedAttribute[str | None], name: str, head: int, tail: int, sqlite: bool
) -> list[sa.ColumnElement[Any]]:
    """The columns of one output stream's ends (``load_job_ends``): its length in
    characters, then its whole text if it holds at most ``head + tail`` of them, else its
    first ``head``; its last ``tail`` (empty when whole); and, on SQLite, whether it holds
    a NUL (which both databases' ``length`` and ``substr`` count in characters, but
    SQLite's stop at)."""
    text = sa.func.coalesce(column, "")
    length = sa.func.length(text)
    short = length <= head + tail
    columns: list[sa.ColumnElement[Any]] = [
        length.label(f"{name}_length"),
        sa.case((short, text), else_=sa.func.substr(text, 1, head)).label(f"{name}_head"),
        # Past the head: its start is above head + 1, never the negative positions that
        # count from the end in SQLite and not in PostgreSQL.
        sa.case((short, ""), else_=sa.func.substr(text, length - tail + 1)).label(f"{name}_tail"),
    ]
    if sqlite:
        nul = sa.func.instr(sa.cast(text, sa.LargeBinary), sa.literal(b"\x00", sa.LargeBinary))
        columns.append((nul > 0).label(f"{name}_nul"))
    return columns


async def _move(
    session: AsyncSession,
    experiment_id: str,
    target: State,
    reason: str,
    at: float,
    stay: bool = False,
    **changes: Any,
) -> State:
    """Move the experiment to ``target`` within ``session``'s transaction, recording the
    transition; its old state. ``stay``: one already at ``target`` is left as it is.

    Raises:
        InvalidTransition: the machine forbids it (nothing of it is written).
    """
    row = await session.get(ExperimentRow, experiment_id, with_for_update=True)
    assert row is not None
    current = State(row.state)
    if stay and current is target:
        return current
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


async def _move_if_last(session: AsyncSession, job_id: str, then: Move | None, at: float) -> None:
    """``then`` within ``session``'s transaction, unless the machine forbids it or another
    job of the experiment is recorded running: one that started while this one's end was
    being written (it saw this one still running, so it did not move the experiment)."""
    if then is None:
        return
    # The experiment's row first (locked on PostgreSQL; SQLite writes one at a time): a
    # job whose start is written after this sees the state this leaves, and moves it back.
    await session.get(ExperimentRow, then.experiment_id, with_for_update=True)
    others = await session.scalar(
        sa.select(
            sa.exists().where(
                JobRow.experiment_id == then.experiment_id,
                JobRow.status == "running",
                JobRow.job_id != job_id,
            )
        )
    )
    if others:
        return
    with contextlib.suppress(InvalidTransition):
        await _move(session, then.experiment_id, then.target, then.reason, at)
