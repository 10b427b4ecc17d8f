"""What several server processes on one database share besides the tables: the rate
budgets of rare, costly steps, the "sandbox ready" hand-over and the news of
revocations. Built once by the composition root."""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from sqlalchemy.ext.asyncio import AsyncEngine

from app.storage.rate_store import SqlEventLedger
from auth.ratelimit import SharedPrefixedBudget, Shares

if TYPE_CHECKING:
    from app.storage.slots.ready_relay import PgChannel

# The longest window any shared budget uses (the e-mails' hour).
LONGEST_WINDOW_S = 3600


@dataclass
class SharedLimits:
    ledger: SqlEventLedger
    relay: PgChannel | None  # None on SQLite: one process, nothing to relay
    mails_per_hour: int
    revocations: PgChannel | None = None  # None on SQLite, as ``relay``
    _swept_at: float = field(default=0.0, init=False)

    @classmethod
    def build(cls, engine: AsyncEngine, database_url: str, mails_per_hour: int) -> SharedLimits:
        if engine.dialect.name != "postgresql":
            return cls(SqlEventLedger(engine), None, mails_per_hour)
        # asyncpg only where there is PostgreSQL: a SQLite server starts without it.
        from app.storage.signin.auth_store import REVOKED_CHANNEL
        from app.storage.slots.ready_relay import PgChannel, asyncpg_dsn, ready_relay

        dsn = asyncpg_dsn(database_url)
        revocations = PgChannel(dsn, REVOKED_CHANNEL, name="oauth.revocations")
        return cls(SqlEventLedger(engine), ready_relay(dsn), mails_per_hour, revocations)

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
