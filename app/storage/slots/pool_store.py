"""``pool.state.PoolState`` on the service's database (SQLAlchemy)."""

from __future__ import annotations

from typing import Any, cast

import sqlalchemy as sa
from sqlalchemy.exc import IntegrityError, SQLAlchemyError
from sqlalchemy.ext.asyncio import AsyncEngine, AsyncSession, async_sessionmaker
from sqlalchemy.orm import Mapped, mapped_column

from app.errors import DatabaseUnavailable
from app.storage.db import Base, describe_db_error, transaction
from pool.errors import StaleSlot
from pool.state import (
    NoteKind,
    NoteRecord,
    PoolChanges,
    PoolSnapshot,
    PoolSurvey,
    QueueRecord,
    SlotRecord,
    SlotState,
)


class PoolSlotRow(Base):
    """A slot that is leased, reserved or being emptied (a free slot has no row)."""

    __tablename__ = "pool_slots"

    slot_index: Mapped[int] = mapped_column(primary_key=True, autoincrement=False)
    state: Mapped[str] = mapped_column(sa.String(16))
    sandbox_key: Mapped[str | None] = mapped_column(sa.String(128), unique=True)
    since: Mapped[float] = mapped_column(sa.Float)
    last_activity: Mapped[float] = mapped_column(sa.Float)
    reserved_until: Mapped[float | None] = mapped_column(sa.Float)


class PoolQueueRow(Base):
    __tablename__ = "pool_queue"

    sandbox_key: Mapped[str] = mapped_column(sa.String(128), primary_key=True)
    seq: Mapped[int] = mapped_column(sa.BigInteger, unique=True)
    enqueued_at: Mapped[float] = mapped_column(sa.Float)
    last_seen: Mapped[float] = mapped_column(sa.Float)


class PoolNoteRow(Base):
    __tablename__ = "pool_notes"

    id: Mapped[int] = mapped_column(primary_key=True, autoincrement=True)
    sandbox_key: Mapped[str] = mapped_column(sa.String(128), index=True)
    kind: Mapped[str] = mapped_column(sa.String(16))
    created_at: Mapped[float] = mapped_column(sa.Float)


# Built once: a statement's SQL and its cache key then cost nothing per call. The
# queue counted is the callers who hold no slot below the size, by arrival (seq).
_SURVEY = sa.text(
    """
    WITH waiting AS (
        SELECT sandbox_key, seq, enqueued_at FROM pool_queue
        WHERE sandbox_key NOT IN (
            SELECT sandbox_key FROM pool_slots
            WHERE slot_index < :size AND sandbox_key IS NOT NULL
        )
    )
    SELECT
        (SELECT slot_index FROM pool_slots
         WHERE slot_index < :size AND sandbox_key = :key AND state = 'leased'),
        (SELECT count(*) FROM waiting
         WHERE seq <= (SELECT seq FROM waiting WHERE sandbox_key = :key)),
        (SELECT count(*) FROM pool_slots WHERE slot_index < :size),
        (SELECT count(*) FROM pool_slots WHERE slot_index < :size AND state = 'reserved'),
        (SELECT count(*) FROM waiting),
        (SELECT enqueued_at FROM waiting ORDER BY seq LIMIT 1)
    """
)


class SqlPoolState:
    """Every change is one transaction, so a crash leaves all of it or none of it.

    A slot is written only from the record the pool last saw there: a free slot is
    inserted (its primary key and the unique key column refuse a second holder) and
    a held one is updated only while it still holds that record, so a write from a
    stale view fails (``StaleSlot``) instead of overwriting another holder.
    """

    def __init__(self, engine: AsyncEngine) -> None:
        self._engine = engine
        self._sessions = async_sessionmaker(engine, expire_on_commit=False)
        # A single statement needs no transaction around it: no BEGIN and COMMIT round
        # trips on PostgreSQL (it reads one snapshot all the same).
        self._single_reads = engine.execution_options(isolation_level="AUTOCOMMIT")

    async def load(self) -> PoolSnapshot:
        async with transaction(self._sessions) as session:
            return await self._read(session)

    async def leased_index(self, sandbox_key: str) -> int | None:
        async with transaction(self._sessions) as session:
            index = await session.scalar(
                sa.select(PoolSlotRow.slot_index).where(
                    PoolSlotRow.sandbox_key == sandbox_key, PoolSlotRow.state == "leased"
                )
            )
        return None if index is None else int(index)

    async def survey(self, sandbox_key: str, size: int) -> PoolSurvey:
        # One statement of counts (one snapshot of the data on PostgreSQL): reading the
        # whole pool for each sandbox_status was what held light calls back (issue 13).
        params = {"key": sandbox_key, "size": size}
        try:
            async with self._single_reads.connect() as connection:
                row = (await connection.execute(_SURVEY, params)).one()
        except (SQLAlchemyError, OSError) as exc:
            raise DatabaseUnavailable(describe_db_error(exc)) from exc
        leased, position, held, reserved, queued, oldest = row
        return PoolSurvey(
            leased_index=None if leased is None else int(leased),
            queue_position=int(position) or None,
            held=int(held),
            reserved=int(reserved),
            queued=int(queued),
            oldest_enqueued_at=None if oldest is None else float(oldest),
        )

    async def _read(self, session: AsyncSession) -> PoolSnapshot:
        slots = (await session.scalars(sa.select(PoolSlotRow))).all()
        queue = (await session.scalars(sa.select(PoolQueueRow).order_by(PoolQueueRow.seq))).all()
        notes = (await session.scalars(sa.select(PoolNoteRow).order_by(PoolNoteRow.id))).all()
        return PoolSnapshot(
            slots=[
                SlotRecord(
                    r.slot_index,
                    cast(SlotState, r.state),
                    r.sandbox_key,
                    r.since,
                    r.last_activity,
                    r.reserved_until,
                )
                for r in slots
            ],
            queue=[QueueRecord(r.sandbox_key, r.seq, r.enqueued_at, r.last_seen) for r in queue],
            notes=[NoteRecord(r.sandbox_key, cast(NoteKind, r.kind), r.created_at) for r in notes],
        )

    async def apply(self, changes: PoolChanges) -> None:
        async with transaction(self._sessions) as session:
            await self._apply(session, changes)

    async def _apply(self, session: AsyncSession, changes: PoolChanges) -> None:
        # Core statements, one per kind of change: taking a slot must stay cheap.
        if changes.free_slots:
            await session.execute(
                sa.delete(PoolSlotRow).where(PoolSlotRow.slot_index.in_(changes.free_slots))
            )
        dropped = changes.drop_queue + [q.sandbox_key for q in changes.put_queue]
        if dropped:
            await session.execute(
                sa.delete(PoolQueueRow).where(PoolQueueRow.sandbox_key.in_(dropped))
            )
        if changes.drop_notes:
            await session.execute(
                sa.delete(PoolNoteRow).where(PoolNoteRow.sandbox_key.in_(changes.drop_notes))
            )
        await self._put_slots(session, changes)
        if changes.put_queue:
            await session.execute(
                sa.insert(PoolQueueRow),
                [
                    {
                        "sandbox_key": q.sandbox_key,
                        "seq": q.seq,
                        "enqueued_at": q.enqueued_at,
                        "last_seen": q.last_seen,
                    }
                    for q in changes.put_queue
                ],
            )
        if changes.add_notes:
            await session.execute(
                sa.insert(PoolNoteRow),
                [
                    {"sandbox_key": n.sandbox_key, "kind": n.kind, "created_at": n.created_at}
                    for n in changes.add_notes
                ],
            )

    async def _put_slots(self, session: AsyncSession, changes: PoolChanges) -> None:
        seen: dict[int, SlotRecord | None] = dict(changes.replaces)
        for record in changes.put_slots:
            values = {
                "state": record.state,
                "sandbox_key": record.sandbox_key,
                "since": record.since,
                "last_activity": record.last_activity,
                "reserved_until": record.reserved_until,
            }
            previous = seen.get(record.index)
            seen[record.index] = record  # a later write in this batch replaces this one
            if previous is None:
                try:
                    await session.execute(
                        sa.insert(PoolSlotRow).values(slot_index=record.index, **values)
                    )
                except IntegrityError as exc:  # the slot (or the key) is already held
                    raise StaleSlot(record.index) from exc
                continue
            result = await session.execute(
                sa.update(PoolSlotRow)
                .where(
                    PoolSlotRow.slot_index == record.index,
                    PoolSlotRow.state == previous.state,
                    PoolSlotRow.sandbox_key.is_(None)
                    if previous.sandbox_key is None
                    else PoolSlotRow.sandbox_key == previous.sandbox_key,
                )
                .values(**values)
            )
            if getattr(result, "rowcount", 0) != 1:
                raise StaleSlot(record.index)

    async def record_activity(
        self, last_activity: dict[str, float], seen: dict[str, float]
    ) -> None:
        slots = cast(sa.Table, PoolSlotRow.__table__)
        queue = cast(sa.Table, PoolQueueRow.__table__)
        async with transaction(self._sessions) as session:
            await _advance_times(
                session, slots.c.last_activity, last_activity, slots.c.state == "leased"
            )
            await _advance_times(session, queue.c.last_seen, seen)


async def _advance_times(
    session: AsyncSession, column: sa.Column[float], at: dict[str, float], *where: Any
) -> None:
    """Set ``column`` to each sandbox key's time in ``at``, never back in time.

    Core executemany: one statement, many parameter sets; a lease or a queue place
    gone meanwhile simply matches nothing."""
    if not at:
        return
    table = column.table
    await session.execute(
        sa.update(table)
        .where(table.c.sandbox_key == sa.bindparam("key"), column < sa.bindparam("at"), *where)
        .values({column.name: sa.bindparam("at")}),
        [{"key": key, "at": when} for key, when in at.items()],
    )
