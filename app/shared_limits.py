"""What several server processes on one database share besides the tables: the rate
budgets of rare, costly steps and the "sandbox ready" hand-over. Built once by the
composition root."""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from sqlalchemy.ext.asyncio import AsyncEngine

from app.storage.rate_store import SqlRateLedger
from auth.ratelimit import SharedPrefixedBudget, Shares

if TYPE_CHECKING:
    from app.ready_relay import PgReadyRelay

# The longest window any shared budget uses (the e-mails' hour).
LONGEST_WINDOW_S = 3600


@dataclass
class SharedLimits:
    ledger: SqlRateLedger
    relay: PgReadyRelay | None  # None on SQLite: one process, nothing to relay
    mails_per_hour: int
    _swept_at: float = field(default=0.0, init=False)

    @classmethod
    def build(cls, engine: AsyncEngine, database_url: str, mails_per_hour: int) -> SharedLimits:
        relay = None
        if engine.dialect.name == "postgresql":
            # asyncpg only where there is PostgreSQL: a SQLite server starts without it.
            from app.ready_relay import PgReadyRelay, asyncpg_dsn

            relay = PgReadyRelay(asyncpg_dsn(database_url))
        return cls(SqlRateLedger(engine), relay, mails_per_hour)

    async def take_mail(self) -> bool:
        """One of the ``mails_per_hour`` every process together may send."""
        return await self.ledger.take([("mail", self.mails_per_hour)], 3600, time.time()) == 0

    def budget(self, name: str, per_minute: int, shares: Shares) -> SharedPrefixedBudget:
        return SharedPrefixedBudget(self.ledger, name, per_minute, 60, shares=shares)

    async def housekeeping(self) -> None:
        """Forget events no window reaches; once a minute, not on every watchdog tick."""
        now = time.time()
        if now - self._swept_at >= 60:
            self._swept_at = now
            await self.ledger.forget_before(now - LONGEST_WINDOW_S)
