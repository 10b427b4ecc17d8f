"""Which slot holds a warm container, and whose it is (``app.runtime.warm.pool``).

Every server process keeps warm containers of its own, in free slots all of them
share. One row per slot is that slot's claim: inserted before a process makes
the folder and the container (the primary key refuses a second process), and
deleted by whoever hands the container over or removes it; a delete that finds
no row means someone else did, and the caller leaves the container alone
(``app.runtime.warm.claims`` says the same for one process, in memory).
"""

from __future__ import annotations

from contextlib import AbstractAsyncContextManager

import sqlalchemy as sa
from sqlalchemy.exc import IntegrityError
from sqlalchemy.ext.asyncio import AsyncEngine, AsyncSession, async_sessionmaker
from sqlalchemy.orm import Mapped, mapped_column

from app.errors import DatabaseUnavailable
from app.runtime.warm.claims import WarmClaim
from app.storage.db import Base, transaction


class WarmClaimRow(Base):
    __tablename__ = "warm_claims"

    slot: Mapped[str] = mapped_column(sa.String(64), primary_key=True)
    process_id: Mapped[str] = mapped_column(sa.String(40))
    root: Mapped[str] = mapped_column(sa.String(1024))  # <slot root>/.warm-<token>
    container_id: Mapped[str | None] = mapped_column(sa.String(80), nullable=True)
    claimed_at: Mapped[float] = mapped_column(sa.Float)


def _claim(row: WarmClaimRow) -> WarmClaim:
    return WarmClaim(row.slot, row.process_id, row.root, row.container_id)


class SqlWarmClaimLedger:
    def __init__(self, engine: AsyncEngine) -> None:
        self._sessions = async_sessionmaker(engine, expire_on_commit=False)

    def _transaction(self) -> AbstractAsyncContextManager[AsyncSession]:
        return transaction(self._sessions)

    async def place(self, slot: str, process_id: str, root: str, at: float) -> bool:
        """Claim ``slot`` for a warm container at ``root``; False if it is claimed."""
        try:
            async with self._transaction() as session:
                session.add(
                    WarmClaimRow(slot=slot, process_id=process_id, root=root, claimed_at=at)
                )
        except DatabaseUnavailable as exc:
            if isinstance(exc.__cause__, IntegrityError):
                return False  # the primary key: another process holds the slot's claim
            raise
        return True

    async def started(self, claim: WarmClaim, container_id: str) -> bool:
        """Record its container; False if the claim is gone meanwhile."""
        async with self._transaction() as session:
            result = await session.execute(
                sa.update(WarmClaimRow)
                .where(WarmClaimRow.slot == claim.slot, WarmClaimRow.root == claim.root)
                .values(container_id=container_id)
            )
            return bool(getattr(result, "rowcount", 0))

    async def release(self, claim: WarmClaim) -> bool:
        """Delete exactly this claim; False if another process already did (it took the
        container, or removed it): then the caller must leave the container alone."""
        async with self._transaction() as session:
            result = await session.execute(
                sa.delete(WarmClaimRow).where(
                    WarmClaimRow.slot == claim.slot, WarmClaimRow.root == claim.root
                )
            )
            return bool(getattr(result, "rowcount", 0))

    async def of_slot(self, slot: str) -> WarmClaim | None:
        async with self._transaction() as session:
            row = await session.get(WarmClaimRow, slot)
            return None if row is None else _claim(row)

    async def all(self) -> list[WarmClaim]:
        async with self._transaction() as session:
            return [_claim(row) for row in await session.scalars(sa.select(WarmClaimRow))]
