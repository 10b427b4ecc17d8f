"""The audit trail's writers on both databases: SQLite's own connections, PostgreSQL's
one statement per batch. Rows read back as the ORM writes them; a refused batch
writes none of its rows, and the next one goes in."""

from __future__ import annotations

import asyncio
import time

import sqlalchemy as sa
from sqlalchemy.ext.asyncio import AsyncEngine

from app.errors import DatabaseUnavailable
from app.storage import audit as audit_module
from app.storage.audit import AuditTrail
from app.storage.db import Repository

REFUSE = {
    "sqlite": [
        "CREATE TRIGGER refuse BEFORE INSERT ON tool_calls WHEN NEW.request_id = 'poison' "
        "BEGIN SELECT RAISE(ABORT, 'refused'); END"
    ],
    "postgresql": [
        "CREATE FUNCTION refuse() RETURNS trigger AS $$ BEGIN IF NEW.request_id = 'poison' "
        "THEN RAISE EXCEPTION 'refused'; END IF; RETURN NEW; END $$ LANGUAGE plpgsql",
        "CREATE TRIGGER refuse BEFORE INSERT ON tool_calls FOR EACH ROW EXECUTE FUNCTION refuse()",
    ],
}
SINKS = {"sqlite": audit_module._SqliteSink, "postgresql": audit_module._PostgresSink}


async def record_all(trail: AuditTrail, ids: list[str], started: float) -> list[object]:
    """One row per id, recorded in one turn of the loop (so they share one batch)."""
    return await asyncio.gather(
        *(
            trail.record(request_id=i, sandbox_key="k", tool="t", started=started, outcome="ok")
            for i in ids
        ),
        return_exceptions=True,
    )


async def test_batches_go_in_whole_or_not_at_all(engine: AsyncEngine) -> None:
    trail = AuditTrail(engine)
    assert type(trail._sink) is SINKS[engine.dialect.name]
    repository = Repository(engine)
    try:
        started = time.time()
        ids = [f"r{n}" for n in range(30)]
        assert await record_all(trail, ids, started) == [None] * 30
        rows = await repository.tool_calls("k")
        assert sorted(r.request_id for r in rows) == sorted(ids)
        for row in rows:
            assert (row.tool, row.outcome) == ("t", "ok")
            assert row.duration_ms >= 0
            assert abs(row.started_at.timestamp() - started) < 0.001

        async with engine.begin() as connection:
            for statement in REFUSE[engine.dialect.name]:
                await connection.execute(sa.text(statement))
        refused = await record_all(trail, ["a1", "poison", "a2"], time.time())
        assert all(isinstance(outcome, DatabaseUnavailable) for outcome in refused), refused
        assert len(await repository.tool_calls("k")) == 30
        assert await record_all(trail, ["b1"], time.time()) == [None]
        assert "b1" in {r.request_id for r in await repository.tool_calls("k")}
    finally:
        await trail.close()


async def test_a_row_says_how_many_calls_it_stands_for(engine: AsyncEngine) -> None:
    """A count of calls not written one by one is one row whose ``calls`` holds it; an
    ordinary call's row says 1."""
    trail = AuditTrail(engine)
    repository = Repository(engine)
    try:
        started = time.time()
        await asyncio.gather(
            trail.record(
                request_id="one", sandbox_key="k", tool="t", started=started, outcome="ok"
            ),
            trail.record(
                request_id="many",
                sandbox_key="k",
                tool="t",
                started=started,
                outcome="NOT_FOUND",
                calls=2990,
            ),
        )
        rows = {r.request_id: r for r in await repository.tool_calls("k")}
        assert (rows["one"].calls, rows["one"].outcome) == (1, "ok")
        assert (rows["many"].calls, rows["many"].outcome) == (2990, "NOT_FOUND")
    finally:
        await trail.close()
