"""The audit trail's SQLite writer: group commits, one transaction per batch, failures."""

from __future__ import annotations

import asyncio
import sqlite3
import time
from collections.abc import AsyncIterator
from pathlib import Path

import pytest
from sqlalchemy.ext.asyncio import AsyncEngine

from app.errors import DatabaseUnavailable
from app.storage import audit as audit_module
from app.storage.audit import AuditTrail
from app.storage.db import Repository, create_engine, upgrade_schema

POISON = "poison"  # a request id the test's trigger refuses


@pytest.fixture
async def engine(tmp_path: Path) -> AsyncIterator[AsyncEngine]:
    engine = create_engine(f"sqlite+aiosqlite:///{tmp_path / 'db.sqlite'}")
    await upgrade_schema(engine)
    yield engine
    await engine.dispose()


@pytest.fixture
async def trail(engine: AsyncEngine) -> AsyncIterator[AuditTrail]:
    trail = AuditTrail(engine)
    assert isinstance(trail._sink, audit_module._SqliteSink)  # the writer under test
    yield trail
    await trail.close()


def refuse_poison(engine: AsyncEngine) -> None:
    """A trigger that fails any insert of the poison row, as a full disk would."""
    database = sqlite3.connect(str(engine.url.database))
    database.execute(
        "CREATE TRIGGER refuse BEFORE INSERT ON tool_calls WHEN NEW.request_id = 'poison' "
        "BEGIN SELECT RAISE(ABORT, 'refused'); END"
    )
    database.close()


async def record_all(trail: AuditTrail, ids: list[str]) -> list[BaseException | None]:
    """Record one row per id at once (they share commits); each caller's outcome."""
    started = time.time()
    return await asyncio.gather(
        *(
            trail.record(request_id=i, sandbox_key="k", tool="t", started=started, outcome="ok")
            for i in ids
        ),
        return_exceptions=True,
    )


async def test_rows_recorded_at_once_read_back_as_the_orm_writes_them(
    engine: AsyncEngine, trail: AuditTrail
) -> None:
    started = time.time()
    assert await record_all(trail, [f"r{n}" for n in range(40)]) == [None] * 40
    rows = await Repository(engine).tool_calls("k")
    assert sorted(r.request_id for r in rows) == sorted(f"r{n}" for n in range(40))
    for row in rows:
        assert (row.tool, row.outcome) == ("t", "ok")
        assert row.duration_ms >= 0
        assert abs(row.started_at.timestamp() - started) < 0.001


async def test_a_refused_batch_writes_none_of_its_rows_and_the_next_one_goes_in(
    engine: AsyncEngine, trail: AuditTrail
) -> None:
    refuse_poison(engine)
    # Recorded in one turn of the loop, the four share one batch (the writer task
    # starts after them): one refused row fails them all, and none is written.
    outcomes = await record_all(trail, ["a1", "a2", POISON, "a3"])
    assert all(isinstance(o, DatabaseUnavailable) for o in outcomes), outcomes
    assert await Repository(engine).tool_calls("k") == []
    assert await record_all(trail, ["b1"]) == [None]  # a new connection after the failure
    assert "b1" in {r.request_id for r in await Repository(engine).tool_calls("k")}


async def test_a_batch_over_one_statements_parameters_is_still_one_transaction(
    engine: AsyncEngine, trail: AuditTrail
) -> None:
    assert await record_all(trail, ["first"]) == [None]  # opens the writer's connection
    connection = trail._sink._connection  # type: ignore[attr-defined]
    assert connection is not None
    # Room for two rows per statement: a batch of seven is four statements.
    connection.setlimit(sqlite3.SQLITE_LIMIT_VARIABLE_NUMBER, 2 * len(audit_module.COLUMNS))
    ids = [f"c{n}" for n in range(7)]
    assert await record_all(trail, ids) == [None] * 7
    assert {r.request_id for r in await Repository(engine).tool_calls("k")} == {"first", *ids}

    refuse_poison(engine)
    connection = trail._sink._connection  # type: ignore[attr-defined]
    connection.setlimit(sqlite3.SQLITE_LIMIT_VARIABLE_NUMBER, 2 * len(audit_module.COLUMNS))
    late = [f"d{n}" for n in range(5)] + [POISON]  # the poison goes in the last statement
    outcomes = await record_all(trail, late)
    assert all(isinstance(o, DatabaseUnavailable) for o in outcomes), outcomes
    assert {r.request_id for r in await Repository(engine).tool_calls("k")} == {"first", *ids}


async def test_close_waits_for_the_rows_handed_over(engine: AsyncEngine) -> None:
    trail = AuditTrail(engine)
    pending = asyncio.ensure_future(record_all(trail, [f"e{n}" for n in range(20)]))
    await asyncio.sleep(0)  # handed over, not yet committed
    await trail.close()
    assert await pending == [None] * 20
    assert len(await Repository(engine).tool_calls("k")) == 20
