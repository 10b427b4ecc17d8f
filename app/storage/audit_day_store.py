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
from app.storage.db import AuditDay, describe_db_error, upsert_insert

# A reservation is one upsert on SQLite and PostgreSQL alike (_reserve_all): the first
# block of the day makes the row; a later one adds to it unless the day is spent (then
# no row comes back). The counter may pass ``cap`` by less than a block: what came back
# over it was not granted.


def _waves(
    batch: list[dict[str, int | str]],
) -> list[tuple[int, list[tuple[int, dict[str, int | str]]]]]:
    """``batch``'s items (with their index) in statements of one cap and distinct owners
    and days, an owner's later items in later waves: each as if alone, in order."""
    wave_of: dict[tuple[object, object], int] = {}
    waves: dict[tuple[int, int], list[tuple[int, dict[str, int | str]]]] = {}
    for index, item in enumerate(batch):
        key = (item["owner"], item["day"])
        wave_of[key] = wave_of.get(key, -1) + 1
        waves.setdefault((wave_of[key], int(item["cap"])), []).append((index, item))
    return [(cap, items) for (_, cap), items in sorted(waves.items())]


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
        """Each reservation of ``batch`` in order, as if alone, in one transaction: a
        statement for each wave of distinct owners (a statement may change a row once)."""
        granted = [0] * len(batch)
        try:
            async with self._engine.begin() as connection:
                insert = upsert_insert(connection.dialect.name)
                for cap, wave in _waves(batch):
                    # The wave's owners at once (a statement each was a round trip
                    # each, a burst's hundred of them before their answers).
                    values = [
                        {"owner": item["owner"], "day": item["day"], "granted": item["want"]}
                        for _, item in wave
                    ]
                    statement = insert(AuditDay).values(values)
                    statement = statement.on_conflict_do_update(
                        index_elements=[AuditDay.owner, AuditDay.day],
                        set_={"granted": AuditDay.granted + statement.excluded.granted},
                        where=AuditDay.granted < cap,
                    ).returning(AuditDay.owner, AuditDay.day, AuditDay.granted)
                    rows = (await connection.execute(statement)).all()
                    after = {(row.owner, int(row.day)): int(row.granted) for row in rows}
                    for index, item in wave:
                        got, want = after.get((item["owner"], int(item["day"]))), int(item["want"])
                        granted[index] = 0 if got is None else max(0, want - max(0, got - cap))
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
