"""Benchmark: what one audit row costs the process at a light call's pace, per writer.

Prints figures, asserts nothing. 16 tasks each do ~1 ms of CPU work (a light call's
share of the loop) then record a row and wait for its commit, so commits carry one
or two rows as they do in the server. Both writers of ``app.storage.audit`` run on
the same SQLite file in alternating rounds of the same run: the engine's pooled
aiosqlite connections (what PostgreSQL still uses) and the writer's own connection
and thread. The figure is process CPU (every thread) per row beyond the work.

    uv run python tests/bench/bench_audit_writer.py
"""

from __future__ import annotations

import asyncio
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parents[2]))

from app.storage import audit as audit_module
from app.storage.audit import AuditTrail, _EngineSink
from app.storage.db import create_engine, upgrade_schema

TASKS = 16
ROWS_PER_TASK = 150
WORK_S = 0.001
ROUNDS = 3


async def one_round(trail: AuditTrail) -> float:
    """CPU seconds per row beyond the simulated work."""

    async def caller(index: int) -> None:
        for row in range(ROWS_PER_TASK):
            until = time.thread_time() + WORK_S
            while time.thread_time() < until:
                pass
            await trail.record(
                request_id=f"{index}-{row}",
                sandbox_key="bench",
                tool="sandbox_status",
                started=time.time(),
                outcome="ok",
            )

    cpu = time.process_time()
    await asyncio.gather(*(caller(index) for index in range(TASKS)))
    rows = TASKS * ROWS_PER_TASK
    return (time.process_time() - cpu) / rows - WORK_S


async def main() -> None:
    with tempfile.TemporaryDirectory() as tmp:
        engine = create_engine(f"sqlite+aiosqlite:///{tmp}/audit.db")
        await upgrade_schema(engine)
        own = AuditTrail(engine)
        through_engine = AuditTrail(engine)
        through_engine._sink = _EngineSink(engine)
        assert type(own._sink) is audit_module._SqliteSink
        figures: dict[str, list[float]] = {"engine": [], "own": []}
        for _ in range(ROUNDS):
            figures["engine"].append(await one_round(through_engine))
            figures["own"].append(await one_round(own))
        for name, label in (
            ("engine", "engine pool (aiosqlite, Core executemany)"),
            ("own", "own connection and thread (one trip)"),
        ):
            rounds = " ".join(f"{value * 1e6:5.1f}" for value in figures[name])
            median = statistics.median(figures[name]) * 1e6
            print(f"{label:44s} median {median:5.1f} us/row  rounds {rounds}")
        await own.close()
        await through_engine.close()
        await engine.dispose()


if __name__ == "__main__":
    asyncio.run(main())
