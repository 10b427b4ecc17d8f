"""``pool.state.PoolState`` on the service's database (SQLAlchemy)."""

from __future__ import annotations

from typing import cast

import sqlalchemy as sa
from sqlalchemy.ext.asyncio import AsyncEngine, AsyncSession, async_sessionmaker
from sqlalchemy.orm import Mapped, mapped_column

from app.storage.db import Base, transaction
from pool.state import (
    NoteKind,
    NoteRecord,
    PoolChanges,
    PoolSnapshot,
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


class SqlPoolState:
    """Every change is one transaction, so a crash leaves all of it or none of it."""

    def __init__(self, engine: AsyncEngine) -> None:
        self._sessions = async_sessionmaker(engine, expire_on_commit=False)

    async def load(self) -> PoolSnapshot:
        async with transaction(self._sessions) as session:
            slots = (await session.scalars(sa.select(PoolSlotRow))).all()
            queue = (
                await session.scalars(sa.select(PoolQueueRow).order_by(PoolQueueRow.seq))
            ).all()
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
        touched = [r.index for r in changes.put_slots] + changes.free_slots
        keys = [r.sandbox_key for r in changes.put_slots if r.sandbox_key is not None]
        if touched:
            # The key column is unique: a key moving between slots leaves its old row.
            await session.execute(
                sa.delete(PoolSlotRow).where(
                    sa.or_(PoolSlotRow.slot_index.in_(touched), PoolSlotRow.sandbox_key.in_(keys))
                )
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
        if changes.put_slots:
            await session.execute(
                sa.insert(PoolSlotRow),
                [
                    {
                        "slot_index": r.index,
                        "state": r.state,
                        "sandbox_key": r.sandbox_key,
                        "since": r.since,
                        "last_activity": r.last_activity,
                        "reserved_until": r.reserved_until,
                    }
                    for r in changes.put_slots
                ],
            )
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

    async def record_activity(
        self, last_activity: dict[int, float], seen: dict[str, float]
    ) -> None:
        async with transaction(self._sessions) as session:
            # Core executemany: one statement, many parameter sets, and a row
            # released meanwhile simply matches nothing.
            if last_activity:
                slots = cast(sa.Table, PoolSlotRow.__table__)
                await session.execute(
                    sa.update(slots)
                    .where(slots.c.slot_index == sa.bindparam("index"))
                    .values(last_activity=sa.bindparam("at")),
                    [{"index": i, "at": at} for i, at in last_activity.items()],
                )
            if seen:
                queue = cast(sa.Table, PoolQueueRow.__table__)
                await session.execute(
                    sa.update(queue)
                    .where(queue.c.sandbox_key == sa.bindparam("key"))
                    .values(last_seen=sa.bindparam("at")),
                    [{"key": k, "at": at} for k, at in seen.items()],
                )
