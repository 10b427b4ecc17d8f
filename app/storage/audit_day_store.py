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


class SqlDayLedger:
    def __init__(self, engine: AsyncEngine) -> None:
        self._engine = engine

    async def reserve(self, owner: str, day: int, want: int, cap: int) -> int:
        """Up to ``want`` of ``owner``'s ``cap`` rows of ``day``: how many were granted
        (0: the day is spent, by every process together).

        Raises:
            DatabaseUnavailable: the database did not answer.
        """
        params = {"owner": owner, "day": day, "want": want, "cap": cap}
        try:
            async with self._engine.begin() as connection:
                granted = (await connection.execute(_RESERVE, params)).scalar()
        except (SQLAlchemyError, OSError) as exc:
            raise DatabaseUnavailable(describe_db_error(exc)) from exc
        if granted is None:
            return 0
        return max(0, want - max(0, int(granted) - cap))

    async def give_back(self, owner: str, day: int, count: int, cap: int) -> None:
        """Return ``count`` rows reserved and not written (a process stopping)."""
        params = {"owner": owner, "day": day, "count": count, "cap": cap}
        try:
            async with self._engine.begin() as connection:
                await connection.execute(_GIVE_BACK, params)
        except (SQLAlchemyError, OSError) as exc:
            raise DatabaseUnavailable(describe_db_error(exc)) from exc
