"""Each restricted experiment's egress bytes, in the database: its byte cap holds
across a restart of the server and across the processes of ``serve --workers``.

Bytes are added with one upsert per experiment (``bytes = bytes + n``), so two
processes adding at once never lose each other's count; the total after the
addition comes back, to compare with the cap. ``capped`` records that the cap
stopped the experiment (it stays stopped, even if the last cut transfer was
logged a little under the cap).

What a command's next result must tell (the proxy's refusals, the cap reached) is
kept in ``egress_notices``, one row per line, by container: whichever process
counted the log, whichever process runs that experiment's next command takes them
(deleted as they are read, so each is told once). They are written in the same
transaction as the bytes of the lines they come from.

Each sandbox's bytes of the day (UTC) are added in that transaction too
(``egress_sandbox_days``, by the sandbox's label): the daily budget holds however
many experiments the sandbox makes and deletes. ``told`` records that the budget
stopped it that day (its containers were told once).
"""

from __future__ import annotations

import time
from collections import Counter
from collections.abc import Callable, Iterable, Mapping, Sequence
from contextlib import AbstractAsyncContextManager
from typing import Any

import sqlalchemy as sa
from sqlalchemy.ext.asyncio import AsyncEngine, AsyncSession, async_sessionmaker
from sqlalchemy.orm import Mapped, mapped_column

from app.egress.records import Notice, Usage
from app.storage.db import Base, transaction, upsert_insert
from app.storage.experiment_rows import ExperimentRow


class EgressUsageRow(Base):
    __tablename__ = "egress_usage"

    experiment_id: Mapped[str] = mapped_column(sa.String(40), primary_key=True)
    bytes: Mapped[int] = mapped_column(sa.BigInteger)
    capped: Mapped[bool] = mapped_column(sa.Boolean, default=False)
    updated_at: Mapped[float] = mapped_column(sa.Float)
    refused: Mapped[int] = mapped_column(sa.Integer, default=0)


class EgressNoticeRow(Base):
    __tablename__ = "egress_notices"

    id: Mapped[int] = mapped_column(sa.Integer, primary_key=True, autoincrement=True)
    container_id: Mapped[str] = mapped_column(sa.String(80), index=True)
    experiment_id: Mapped[str] = mapped_column(sa.String(40))
    kind: Mapped[str] = mapped_column(sa.String(16))  # "refused" or "cap"
    text: Mapped[str] = mapped_column(sa.String(600))
    created_at: Mapped[float] = mapped_column(sa.Float)


class EgressSandboxDayRow(Base):
    __tablename__ = "egress_sandbox_days"

    sandbox: Mapped[str] = mapped_column(sa.String(40), primary_key=True)
    day: Mapped[int] = mapped_column(sa.Integer, primary_key=True)  # days since 1970, UTC
    bytes: Mapped[int] = mapped_column(sa.BigInteger)
    told: Mapped[bool] = mapped_column(sa.Boolean, default=False)
    updated_at: Mapped[float] = mapped_column(sa.Float)


DAY_S = 86_400


class SqlUsageRecords:
    def __init__(self, engine: AsyncEngine, clock: Callable[[], float] = time.time) -> None:
        self._sessions = async_sessionmaker(engine, expire_on_commit=False)
        self._dialect = engine.dialect.name
        self._clock = clock

    def _transaction(self) -> AbstractAsyncContextManager[AsyncSession]:
        return transaction(self._sessions)

    def _insert(self) -> Any:
        return upsert_insert(self._dialect)(EgressUsageRow)

    async def record(
        self,
        moved: Mapping[str, int],
        refused: Mapping[str, int] | None = None,
        notices: Sequence[Notice] = (),
        *,
        max_pending: int = 20,
        sandboxes: Mapping[str, int] | None = None,
    ) -> dict[str, Usage]:
        """In one transaction: add bytes and refusals to each experiment, and bytes to
        each sandbox's day (``sandboxes``: by label), and keep the notices for their
        containers' next results (at most ``max_pending`` waiting per container).
        Every experiment's usage afterwards."""
        now = self._clock()
        refused = refused or {}
        totals: dict[str, Usage] = {}
        async with self._transaction() as session:
            await self._add_days(session, sandboxes or {}, now)
            for experiment_id in sorted(set(moved) | set(refused)):  # one lock order for all
                insert = self._insert().values(
                    experiment_id=experiment_id,
                    bytes=moved.get(experiment_id, 0),
                    refused=refused.get(experiment_id, 0),
                    capped=False,
                    updated_at=now,
                )
                statement = insert.on_conflict_do_update(
                    index_elements=[EgressUsageRow.experiment_id],
                    set_={
                        "bytes": EgressUsageRow.bytes + insert.excluded.bytes,
                        "refused": EgressUsageRow.refused + insert.excluded.refused,
                        "updated_at": insert.excluded.updated_at,
                    },
                ).returning(EgressUsageRow.bytes, EgressUsageRow.capped, EgressUsageRow.refused)
                row = (await session.execute(statement)).one()
                totals[experiment_id] = Usage(int(row.bytes), bool(row.capped), int(row.refused))
            if notices:
                room = await self._room(session, {n.container_id for n in notices}, max_pending)
                for notice in notices:
                    if room[notice.container_id] > 0:
                        room[notice.container_id] -= 1
                        session.add(_row(notice, now))
        return totals

    async def _add_days(self, session: AsyncSession, moved: Mapping[str, int], now: float) -> None:
        day = int(now // DAY_S)
        for sandbox in sorted(moved):  # one lock order for all
            insert = upsert_insert(self._dialect)(EgressSandboxDayRow).values(
                sandbox=sandbox, day=day, bytes=moved[sandbox], told=False, updated_at=now
            )
            await session.execute(
                insert.on_conflict_do_update(
                    index_elements=[EgressSandboxDayRow.sandbox, EgressSandboxDayRow.day],
                    set_={
                        "bytes": EgressSandboxDayRow.bytes + insert.excluded.bytes,
                        "updated_at": insert.excluded.updated_at,
                    },
                )
            )

    async def sandbox_days(self, sandboxes: Iterable[str]) -> dict[str, int]:
        """The bytes each of these sandboxes moved today (UTC; none: left out)."""
        labels = sorted(set(sandboxes))
        if not labels:
            return {}
        day = int(self._clock() // DAY_S)
        async with self._transaction() as session:
            rows = await session.execute(
                sa.select(EgressSandboxDayRow.sandbox, EgressSandboxDayRow.bytes).where(
                    EgressSandboxDayRow.sandbox.in_(labels), EgressSandboxDayRow.day == day
                )
            )
            return {r.sandbox: int(r.bytes) for r in rows}

    async def mark_budget_spent(self, sandbox: str, containers: Iterable[str] = ()) -> bool:
        """Record that the daily budget stopped this sandbox today; True for the one
        caller that stopped it, who also leaves each of its ``containers`` the notice."""
        now = self._clock()
        day = int(now // DAY_S)
        async with self._transaction() as session:
            insert = upsert_insert(self._dialect)(EgressSandboxDayRow).values(
                sandbox=sandbox, day=day, bytes=0, told=False, updated_at=now
            )
            await session.execute(insert.on_conflict_do_nothing())
            flipped = await session.execute(
                sa.update(EgressSandboxDayRow)
                .where(EgressSandboxDayRow.sandbox == sandbox, EgressSandboxDayRow.day == day)
                .where(EgressSandboxDayRow.told.is_(False))
                .values(told=True, updated_at=now)
            )
            newly = bool(getattr(flipped, "rowcount", 0))
            if newly:
                for container_id in sorted(set(containers)):
                    session.add(_row(Notice(container_id, "", "budget"), now))
            return newly

    async def _room(
        self, session: AsyncSession, containers: set[str], max_pending: int
    ) -> Counter[str]:
        waiting = await session.execute(
            sa.select(EgressNoticeRow.container_id, sa.func.count())
            .where(EgressNoticeRow.container_id.in_(sorted(containers)))
            .group_by(EgressNoticeRow.container_id)
        )
        room = Counter(dict.fromkeys(containers, max_pending))
        for container_id, count in waiting:
            room[container_id] -= int(count)
        return room

    async def mark_capped(self, experiment_id: str, containers: Iterable[str] = ()) -> bool:
        """Record that the cap stopped this experiment (a row is made if it has none);
        True for the one caller that stopped it, who also leaves each of its
        ``containers`` the notice (told once, whichever process asks)."""
        now = self._clock()
        async with self._transaction() as session:
            insert = self._insert().values(
                experiment_id=experiment_id, bytes=0, refused=0, capped=False, updated_at=now
            )
            await session.execute(insert.on_conflict_do_nothing())
            # Only one caller flips it: the row lock makes the second see it capped.
            flipped = await session.execute(
                sa.update(EgressUsageRow)
                .where(EgressUsageRow.experiment_id == experiment_id)
                .where(EgressUsageRow.capped.is_(False))
                .values(capped=True, updated_at=now)
            )
            newly = bool(getattr(flipped, "rowcount", 0))
            if newly:
                for container_id in sorted(set(containers)):
                    session.add(_row(Notice(container_id, experiment_id, "cap"), now))
            return newly

    async def take_notices(self, container_id: str) -> list[Notice]:
        """The notices waiting for this container's next result, gone once read."""
        async with self._transaction() as session:
            rows = (
                await session.execute(
                    sa.delete(EgressNoticeRow)
                    .where(EgressNoticeRow.container_id == container_id)
                    .returning(
                        EgressNoticeRow.id,
                        EgressNoticeRow.experiment_id,
                        EgressNoticeRow.kind,
                        EgressNoticeRow.text,
                    )
                )
            ).all()
        return [Notice(container_id, r.experiment_id, r.kind, r.text) for r in sorted(rows)]

    async def forget_before(self, cutoff: float) -> int:
        """Retention: the usage of experiments no longer recorded (retention deleted
        them, or a clone helper's, which has none) and notices nobody took, last
        touched before ``cutoff``; how many rows went. (No foreign key: bytes are
        counted by container, and may arrive for an experiment being deleted.)"""
        known = sa.select(ExperimentRow.experiment_id).where(
            ExperimentRow.experiment_id == EgressUsageRow.experiment_id
        )
        async with self._transaction() as session:
            usage = await session.execute(
                sa.delete(EgressUsageRow).where(
                    EgressUsageRow.updated_at < cutoff, ~sa.exists(known)
                )
            )
            notices = await session.execute(
                sa.delete(EgressNoticeRow).where(EgressNoticeRow.created_at < cutoff)
            )
            days = await session.execute(  # a day's budget matters on that day only
                sa.delete(EgressSandboxDayRow).where(EgressSandboxDayRow.updated_at < cutoff)
            )
        return sum(int(getattr(r, "rowcount", 0) or 0) for r in (usage, notices, days))

    async def load(self, experiment_ids: Iterable[str]) -> dict[str, Usage]:
        """The usage recorded for these experiments (those with none are left out)."""
        ids = sorted(set(experiment_ids))
        if not ids:
            return {}
        async with self._transaction() as session:
            rows = await session.execute(
                sa.select(
                    EgressUsageRow.experiment_id,
                    EgressUsageRow.bytes,
                    EgressUsageRow.capped,
                    EgressUsageRow.refused,
                ).where(EgressUsageRow.experiment_id.in_(ids))
            )
            return {
                r.experiment_id: Usage(int(r.bytes), bool(r.capped), int(r.refused or 0))
                for r in rows
            }


def _row(notice: Notice, at: float) -> EgressNoticeRow:
    return EgressNoticeRow(
        container_id=notice.container_id,
        experiment_id=notice.experiment_id,
        kind=notice.kind,
        text=notice.text[:600],
        created_at=at,
    )
