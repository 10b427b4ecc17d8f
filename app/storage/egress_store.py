"""Each restricted experiment's egress bytes, in the database: its byte cap holds
across a restart of the server and across the processes of ``serve --workers``.

Bytes are added with one upsert per experiment (``bytes = bytes + n``), so two
processes adding at once never lose each other's count; the total after the
addition comes back, to compare with the cap. ``capped`` records that the cap
stopped the experiment (it stays stopped, even if the last cut transfer was
logged a little under the cap).
"""

from __future__ import annotations

import time
from collections.abc import Iterable, Mapping
from contextlib import AbstractAsyncContextManager
from dataclasses import dataclass
from typing import Any

import sqlalchemy as sa
from sqlalchemy.ext.asyncio import AsyncEngine, AsyncSession, async_sessionmaker
from sqlalchemy.orm import Mapped, mapped_column

from app.storage.db import Base, transaction, upsert_insert


class EgressUsageRow(Base):
    __tablename__ = "egress_usage"

    experiment_id: Mapped[str] = mapped_column(sa.String(40), primary_key=True)
    bytes: Mapped[int] = mapped_column(sa.BigInteger)
    capped: Mapped[bool] = mapped_column(sa.Boolean, default=False)
    updated_at: Mapped[float] = mapped_column(sa.Float)


@dataclass(frozen=True)
class Usage:
    bytes: int
    capped: bool


class EgressUsageStore:
    def __init__(self, engine: AsyncEngine) -> None:
        self._sessions = async_sessionmaker(engine, expire_on_commit=False)
        self._dialect = engine.dialect.name

    def _transaction(self) -> AbstractAsyncContextManager[AsyncSession]:
        return transaction(self._sessions)

    def _insert(self) -> Any:
        return upsert_insert(self._dialect)(EgressUsageRow)

    async def add(self, moved: Mapping[str, int]) -> dict[str, Usage]:
        """Add ``moved`` bytes to each experiment; every one's usage afterwards."""
        now = time.time()
        totals: dict[str, Usage] = {}
        async with self._transaction() as session:
            for experiment_id, size in sorted(moved.items()):  # one lock order for all
                insert = self._insert().values(
                    experiment_id=experiment_id, bytes=size, capped=False, updated_at=now
                )
                statement = insert.on_conflict_do_update(
                    index_elements=[EgressUsageRow.experiment_id],
                    set_={
                        "bytes": EgressUsageRow.bytes + insert.excluded.bytes,
                        "updated_at": insert.excluded.updated_at,
                    },
                ).returning(EgressUsageRow.bytes, EgressUsageRow.capped)
                row = (await session.execute(statement)).one()
                totals[experiment_id] = Usage(int(row.bytes), bool(row.capped))
        return totals

    async def mark_capped(self, experiment_id: str) -> None:
        """Record that the cap stopped this experiment (a row is made if it has none)."""
        insert = self._insert().values(
            experiment_id=experiment_id, bytes=0, capped=True, updated_at=time.time()
        )
        async with self._transaction() as session:
            await session.execute(
                insert.on_conflict_do_update(
                    index_elements=[EgressUsageRow.experiment_id],
                    set_={"capped": True, "updated_at": insert.excluded.updated_at},
                )
            )

    async def load(self, experiment_ids: Iterable[str]) -> dict[str, Usage]:
        """The usage recorded for these experiments (those with none are left out)."""
        ids = sorted(set(experiment_ids))
        if not ids:
            return {}
        async with self._transaction() as session:
            rows = await session.execute(
                sa.select(
                    EgressUsageRow.experiment_id, EgressUsageRow.bytes, EgressUsageRow.capped
                ).where(EgressUsageRow.experiment_id.in_(ids))
            )
            return {r.experiment_id: Usage(int(r.bytes), bool(r.capped)) for r in rows}
