"""Which server processes are live: heartbeats against a controllable clock."""

from __future__ import annotations

from pathlib import Path

from db_testkit import migrated_sqlite

from app.experiments.recovery.process_registry import ProcessRegistry
from app.storage.process_store import SqlProcessRecords


async def test_a_process_is_dead_once_its_heartbeat_is_stale_and_comes_back_if_alive(
    tmp_path: Path,
) -> None:
    engine = await migrated_sqlite(tmp_path)
    now = [1000.0]
    records = SqlProcessRecords(engine)
    a = ProcessRegistry(records, stale_s=30, process_id="proc_a", clock=lambda: now[0])
    b = ProcessRegistry(records, stale_s=30, process_id="proc_b", clock=lambda: now[0])
    try:
        await a.register()
        await b.register()
        assert a.beat_s == 5
        assert await a.live() == {"proc_a", "proc_b"}
        now[0] += 29
        await a.beat()
        assert await a.live() == {"proc_a", "proc_b"}, "29 s of silence is not death"
        now[0] += 2
        assert await a.live() == {"proc_a"}
        assert await a.is_live("proc_b") is False
        assert "proc_b" in await b.live()  # a process always counts itself
        assert await a.forget_dead() == 1
        # b was only stalled: its next beat finds its row gone and registers again.
        await b.beat()
        assert await a.live() == {"proc_a", "proc_b"}
        await b.deregister()
        assert await a.live() == {"proc_a"}
    finally:
        await engine.dispose()
