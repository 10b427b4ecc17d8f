"""The experiment audit trail in the database: experiments, transitions, jobs, artifacts.

Every query is scoped to a sandbox key: another key's id is indistinguishable
from an id that never existed. The tables and their records are
:mod:`app.storage.experiment_rows`; the job queries :mod:`app.storage.job_records`,
the artifact queries :mod:`app.storage.artifact_records`; this module holds the
experiments' own (and their state transitions).
"""

from __future__ import annotations

import json
from typing import Any

import sqlalchemy as sa

from app.experiments.errors import ExperimentNotFound
from app.experiments.records import Experiment
from app.experiments.states import State, check_transition
from app.storage.artifact_records import ArtifactRecords
from app.storage.experiment_rows import (
    ArtifactRow,
    ExperimentRow,
    TransitionRow,
    experiment_of,
    experiment_row,
)
from app.storage.job_records import JobRecords


class ExperimentRecords(JobRecords, ArtifactRecords):
    """Experiments, their transitions, jobs and artifacts (one store, one engine)."""

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

    async def refused_creations(self, stale_before: float) -> list[Experiment]:
        """Experiments whose creation failed before they got a container (for example
        while the Docker engine was down), or still CREATING since before
        ``stale_before`` (a server process killed mid-way): nothing of them is left but
        the record (the sweep removes a container not recorded)."""
        async with self._transaction() as session:
            rows = await session.scalars(
                sa.select(ExperimentRow).where(
                    ExperimentRow.container_id.is_(None),
                    sa.or_(
                        ExperimentRow.state == State.FAILED.value,
                        sa.and_(
                            ExperimentRow.state == State.CREATING.value,
                            ExperimentRow.updated_at < stale_before,
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
