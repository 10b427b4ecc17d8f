"""`sandbox-mcp provision` reads the leases from the database and never repairs a
leased slot, on SQLite and on PostgreSQL.

The unit tests hand provision the leased set; this runs the real command, whose
leases come from the pool's table (what the server wrote).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import AsyncIterator
from pathlib import Path

import pytest
from db_testkit import fresh_postgres

from app.storage.db import create_engine, upgrade_schema
from app.storage.slots.pool_store import SqlPoolState
from pool.state import PoolChanges, SlotRecord

pytestmark = pytest.mark.integration


@pytest.fixture(params=["sqlite", "postgresql"])
async def database_url(request: pytest.FixtureRequest, tmp_path: Path) -> AsyncIterator[str]:
    if request.param == "sqlite":
        yield f"sqlite+aiosqlite:///{tmp_path / 'state' / 'sandbox-mcp.db'}"
    else:
        async with fresh_postgres() as url:
            yield url


def provision(state: Path, database_url: str) -> dict[str, object]:
    done = subprocess.run(
        [sys.executable, "-m", "app", "provision", "--slots", "2"],
        env={
            **os.environ,
            "SANDBOX_MCP_STATE_DIR": str(state),
            "SANDBOX_MCP_DATABASE_URL": database_url,
        },
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 0, done.stderr
    return dict(json.loads(done.stdout))


async def lease(database_url: str, index: int) -> None:
    engine = create_engine(database_url)
    try:
        await upgrade_schema(engine)
        record = SlotRecord(index, "leased", "alice", 1.0, 1.0, None)
        await SqlPoolState(engine).apply(PoolChanges(put_slots=[record]))
    finally:
        await engine.dispose()


async def test_provision_repairs_free_slots_and_leaves_the_leased_one(
    tmp_path: Path, database_url: str
) -> None:
    state = tmp_path / "state"
    assert provision(state, database_url)["created"] == 2
    await lease(database_url, 0)
    slots = state / "slots"
    (slots / "slot-000" / "work.txt").write_text("alice's work")
    for name in ("slot-000", "slot-001"):
        (slots / name).chmod(0o777)  # wrong: a slot is private to the server
    report = provision(state, database_url)
    assert report["skipped_leased"] == ["slot-000"]
    assert report["repaired"] == 1
    assert (slots / "slot-001").stat().st_mode & 0o777 != 0o777
    assert (slots / "slot-000").stat().st_mode & 0o777 == 0o777, "a leased slot is not touched"
    assert (slots / "slot-000" / "work.txt").read_text() == "alice's work"
