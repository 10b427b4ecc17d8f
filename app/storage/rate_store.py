"""Rate budgets every server process shares: a sliding-window log of events.

Each budget is a bucket name (``register``, ``register:<prefix>``, ``mail``, ...);
an event is one row with its time. ``take`` counts and adds under one lock that
every process takes (a transaction-level advisory lock on PostgreSQL; SQLite
serves one process, where an asyncio lock does), so N processes together grant
what one would. Only the limits that guard rare, costly steps use it
(registrations, client-document fetches, e-mails): the bearer check never does.
"""

from __future__ import annotations

import asyncio
from collections.abc import Sequence

import sqlalchemy as sa
from sqlalchemy.ext.asyncio import AsyncEngine, async_sessionmaker
from sqlalchemy.orm import Mapped, mapped_column

from app.storage.db import Base, transaction

_LEDGER_LOCK = 0x736D_6370_7261_7465  # "smcprate", pg_advisory_xact_lock key


class RateEventRow(Base):
    __tablename__ = "rate_events"
    __table_args__ = (sa.Index("ix_rate_events_bucket_at", "bucket", "at"),)

    id: Mapped[int] = mapped_column(primary_key=True, autoincrement=True)
    bucket: Mapped[str] = mapped_column(sa.String(128))
    at: Mapped[float] = mapped_column(sa.Float)


class SqlEventLedger:
    def __init__(self, engine: AsyncEngine) -> None:
        self._sessions = async_sessionmaker(engine, expire_on_commit=False)
        self._lock = asyncio.Lock()

    async def take(self, budgets: Sequence[tuple[str, int]], window_s: float, now: float) -> int:
        async with self._lock, transaction(self._sessions) as session:
            if session.get_bind().dialect.name == "postgresql":
                await session.execute(
                    sa.text("SELECT pg_advisory_xact_lock(:key)"), {"key": _LEDGER_LOCK}
                )
            wait = 0
            for bucket, limit in budgets:
                times = list(
                    (
                        await session.execute(
                            sa.select(RateEventRow.at)
                            .where(RateEventRow.bucket == bucket, RateEventRow.at > now - window_s)
                            .order_by(RateEventRow.at)
                        )
                    ).scalars()
                )
                if len(times) >= limit:
                    wait = max(wait, max(1, int(times[-limit] + window_s - now) + 1))
            if wait:
                return wait
            session.add_all(RateEventRow(bucket=bucket, at=now) for bucket, _ in budgets)
            return 0

    async def forget_before(self, cutoff: float) -> int:
        """Drop events no window reaches any more; returns how many."""
        async with transaction(self._sessions) as session:
            result = await session.execute(sa.delete(RateEventRow).where(RateEventRow.at < cutoff))
            return int(getattr(result, "rowcount", 0) or 0)
