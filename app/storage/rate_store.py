"""Rate budgets every server process shares: a sliding-window log of events.

Each budget is a bucket name (``register``, ``register:<prefix>``, ``mail``, ...);
an event is one row with its time. ``take`` counts and adds under one lock that
every process takes (a transaction-level advisory lock on PostgreSQL; SQLite
serves one process, where an asyncio lock does), so N processes together grant
what one would. Only the limits that guard rare, costly steps use it
(registrations, client-document fetches, e-mails): the bearer check never does.

The takes that queue while the lock is held are decided together, in one
transaction, in the order they came (``MAX_BATCH`` at most a transaction;
``app.storage.batches``): a flood of registrations, granted or refused, must not
make an honest one wait for each of the flood's transactions in turn.
"""

from __future__ import annotations

import bisect
from collections.abc import Sequence
from dataclasses import dataclass

import sqlalchemy as sa
from sqlalchemy.ext.asyncio import AsyncEngine, AsyncSession, async_sessionmaker
from sqlalchemy.orm import Mapped, mapped_column

from app.storage.batches import Batches
from app.storage.db import Base, transaction

_LEDGER_LOCK = 0x736D_6370_7261_7465  # "smcprate", pg_advisory_xact_lock key
# The most takes one transaction decides: its reads name at most three buckets a take,
# well under any database's limit of bound parameters.
MAX_BATCH = 100


class RateEventRow(Base):
    __tablename__ = "rate_events"
    __table_args__ = (sa.Index("ix_rate_events_bucket_at", "bucket", "at"),)

    id: Mapped[int] = mapped_column(primary_key=True, autoincrement=True)
    bucket: Mapped[str] = mapped_column(sa.String(128))
    at: Mapped[float] = mapped_column(sa.Float)


@dataclass(frozen=True, eq=False)
class _Take:
    """One caller's take: granted (0) if every budget has room in the window at ``now``."""

    budgets: Sequence[tuple[str, int]]
    window_s: float
    now: float


class SqlEventLedger:
    def __init__(self, engine: AsyncEngine) -> None:
        self._sessions = async_sessionmaker(engine, expire_on_commit=False)
        self._batches: Batches[_Take, int] = Batches(self._decide_all, max_batch=MAX_BATCH)

    async def take(self, budgets: Sequence[tuple[str, int]], window_s: float, now: float) -> int:
        return await self._batches.decide(_Take(budgets, window_s, now))

    async def _decide_all(self, batch: list[_Take]) -> list[int]:
        """Decide ``batch`` in one transaction, each take in turn as if alone."""
        async with transaction(self._sessions) as session:
            if session.get_bind().dialect.name == "postgresql":
                await session.execute(
                    sa.text("SELECT pg_advisory_xact_lock(:key)"), {"key": _LEDGER_LOCK}
                )
            times = await _recent_times(session, batch)
            waits = []
            for take in batch:
                wait = _decide(take, times)
                if not wait:
                    session.add_all(
                        RateEventRow(bucket=bucket, at=take.now) for bucket, _ in take.budgets
                    )
                waits.append(wait)
            return waits

    async def forget_before(self, cutoff: float) -> int:
        """Drop events no window reaches any more; returns how many."""
        async with transaction(self._sessions) as session:
            result = await session.execute(sa.delete(RateEventRow).where(RateEventRow.at < cutoff))
            return int(getattr(result, "rowcount", 0) or 0)


async def _recent_times(session: AsyncSession, batch: list[_Take]) -> dict[str, list[float]]:
    """The times of each bucket the batch names, oldest first, as far back as the takes
    naming it look (in one read: the batch's e-mails look back an hour, its
    registrations a minute)."""
    looks: dict[float, tuple[set[str], float]] = {}  # window: its buckets, from when
    for take in batch:
        buckets, since = looks.get(take.window_s, (set(), take.now))
        buckets.update(bucket for bucket, _ in take.budgets)
        looks[take.window_s] = (buckets, min(since, take.now - take.window_s))
    rows = await session.execute(
        sa.select(RateEventRow.bucket, RateEventRow.at)
        .where(
            sa.or_(
                *(
                    sa.and_(RateEventRow.bucket.in_(buckets), RateEventRow.at > since)
                    for buckets, since in looks.values()
                )
            )
        )
        .order_by(RateEventRow.at)
    )
    times: dict[str, list[float]] = {
        bucket: [] for buckets, _ in looks.values() for bucket in buckets
    }
    for bucket, at in rows:
        times[bucket].append(at)
    return times


def _decide(take: _Take, times: dict[str, list[float]]) -> int:
    """0 if every bucket of ``take`` holds fewer than its limit in its window (then the
    take is counted in ``times``), else the seconds until it would."""
    wait = 0
    for bucket, limit in take.budgets:
        seen = times[bucket]
        recent = seen[bisect.bisect_right(seen, take.now - take.window_s) :]
        if len(recent) >= limit:
            wait = max(wait, max(1, int(recent[-limit] + take.window_s - take.now) + 1))
    if not wait:
        for bucket, _ in take.budgets:
            bisect.insort(times[bucket], take.now)
    return wait
