"""The server processes sharing this database, each with a heartbeat row.

A process is live while its heartbeat is fresh; one whose heartbeat went stale (it
was killed, its host froze) is dead, and only then may another process take over
what it owned (its running jobs are reported lost, its containers judged by the
experiment records alone).
"""

from __future__ import annotations

from contextlib import AbstractAsyncContextManager

import sqlalchemy as sa
from sqlalchemy.ext.asyncio import AsyncEngine, AsyncSession, async_sessionmaker
from sqlalchemy.orm import Mapped, mapped_column

from app.storage.db import Base, transaction


class ProcessRow(Base):
    __tablename__ = "server_processes"

    process_id: Mapped[str] = mapped_column(sa.String(40), primary_key=True)
    host: Mapped[str] = mapped_column(sa.String(255))
    pid: Mapped[int] = mapped_column(sa.Integer)
    started_at: Mapped[float] = mapped_column(sa.Float)
    heartbeat_at: Mapped[float] = mapped_column(sa.Float)


class SqlProcessRecords:
    def __init__(self, engine: AsyncEngine) -> None:
        self._sessions = async_sessionmaker(engine, expire_on_commit=False)

    def _transaction(self) -> AbstractAsyncContextManager[AsyncSession]:
        return transaction(self._sessions)

    async def register(self, process_id: str, host: str, pid: int, at: float) -> None:
        async with self._transaction() as session:
            session.add(
                ProcessRow(
                    process_id=process_id, host=host, pid=pid, started_at=at, heartbeat_at=at
                )
            )

    async def beat(self, process_id: str, at: float) -> bool:
        """Refresh the heartbeat; False if the row is gone (another process took this
        one for dead and forgot it: the caller registers again)."""
        async with self._transaction() as session:
            result = await session.execute(
                sa.update(ProcessRow)
                .where(ProcessRow.process_id == process_id)
                .values(heartbeat_at=at)
            )
            return bool(getattr(result, "rowcount", 0))

    async def live(self, fresh_after: float) -> set[str]:
        """The processes whose heartbeat is newer than ``fresh_after``."""
        async with self._transaction() as session:
            ids = await session.scalars(
                sa.select(ProcessRow.process_id).where(ProcessRow.heartbeat_at > fresh_after)
            )
            return set(ids)

    async def forget_stale(self, fresh_after: float) -> int:
        """Delete the rows of dead processes (once what they owned was taken over)."""
        async with self._transaction() as session:
            result = await session.execute(
                sa.delete(ProcessRow).where(ProcessRow.heartbeat_at <= fresh_after)
            )
            return int(getattr(result, "rowcount", 0) or 0)

    async def deregister(self, process_id: str) -> None:
        async with self._transaction() as session:
            await session.execute(sa.delete(ProcessRow).where(ProcessRow.process_id == process_id))
