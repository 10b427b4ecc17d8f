"""The day's audit rows of each sandbox and sign-in address, counted in the database
that every server process shares (``audit_days``), so the daily bound holds however
many processes (``serve --workers N``) serve the sandbox (issue 23).

A call must not cost a round trip for this: each process reserves a block of the
day's allowance at a time (one statement) and spends it in memory
(app/mcp/call_sampling.py), giving back what it has left as it stops.
"""

from __future__ import annotations

import sqlalchemy as sa
from sqlalchemy.exc import SQLAlchemyError
from sqlalchemy.ext.asyncio import AsyncEngine

from app.errors import DatabaseUnavailable
from app.storage.batches import Batches
from app.storage.db import describe_db_error

# One statement on SQLite and PostgreSQL alike: the first block of the day makes the
# row; a later one adds to it unless the day is spent (then no row comes back). The
# counter may pass ``cap`` by less than a block: what came back over it was not granted.
_RESERVE = sa.text(
    "INSERT INTO audit_days (owner, day, granted) VALUES (:owner, :day, :want) "
    "ON CONFLICT (owner, day) DO UPDATE SET granted = audit_days.granted + :want "
    "WHERE audit_days.granted < :cap RETURNING granted"
)
# A block given back: first the overshoot is dropped, so the rows given back can be
# granted again.
_GIVE_BACK = sa.text(
    "UPDATE audit_days SET granted = "
    "(CASE WHEN granted > :cap THEN :cap ELSE granted END) - :count "
    "WHERE owner = :owner AND day = :day"
)


# Reservations decided in one transaction at most (a burst of first calls: one each).
MAX_RESERVATIONS = 100


class SqlDayLedger:
    def __init__(self, engine: AsyncEngine) -> None:
        self._engine = engine
        # Each new sandbox's first call of the day reserves its first block: a burst of
        # a hundred first calls took a hundred write transactions, one after another on
        # SQLite, each awaited before its call's answer. Those that queue while one is
        # written are reserved together in the next (app/storage/batches.py).
        self._reservations: Batches[dict[str, int | str], int] = Batches(
            self._reserve_all, max_batch=MAX_RESERVATIONS
        )

    async def reserve(self, owner: str, day: int, want: int, cap: int) -> int:
        """Up to ``want`` of ``owner``'s ``cap`` rows of ``day``: how many were granted
        (0: the day is spent, by every process together).

        Raises:
            DatabaseUnavailable: the database did not answer.
        """
        return await self._reservations.decide(
            {"owner": owner, "day": day, "want": want, "cap": cap}
        )

    async def _reserve_all(self, batch: list[dict[str, int | str]]) -> list[int]:
        """Each reservation of ``batch`` in order, as if alone, in one transaction."""
        granted: list[int] = []
        try:
            async with self._engine.begin() as connection:
                for params in batch:
                    after = (await connection.execute(_RESERVE, params)).scalar()
                    want, cap = int(params["want"]), int(params["cap"])
                    granted.append(0 if after is None else max(0, want - max(0, int(after) - cap)))
        except (SQLAlchemyError, OSError) as exc:
            raise DatabaseUnavailable(describe_db_error(exc)) from exc
        return granted

    async def give_back(self, owner: str, day: int, count: int, cap: int) -> None:
        """Return ``count`` rows reserved and not written (a process stopping)."""
        params = {"owner": owner, "day": day, "count": count, "cap": cap}
        try:
            async with self._engine.begin() as connection:
                await connection.execute(_GIVE_BACK, params)
        except (SQLAlchemyError, OSError) as exc:
            raise DatabaseUnavailable(describe_db_error(exc)) from exc
