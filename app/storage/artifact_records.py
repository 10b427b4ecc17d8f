"""The artifacts table: files copied out of a workspace onto the shelf
(app.experiments.evidence.shelf).

An artifact is its sandbox's; it outlives an emptied sandbox until its clock
(``start_artifact_clock``) runs out.
"""

from __future__ import annotations

from dataclasses import asdict

import sqlalchemy as sa

from app.experiments.records import ArtifactRecord
from app.storage.db import Store
from app.storage.experiment_rows import ArtifactRow, artifact_of


class ArtifactRecords(Store):
    """The artifact queries of :class:`app.storage.experiment_store.ExperimentRecords`."""

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
