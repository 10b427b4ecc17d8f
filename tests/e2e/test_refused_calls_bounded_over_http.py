"""One sandbox repeating a refused call thousands of times writes a bounded number of
log lines and audit rows, and the counts say how many there were (issue 23).

Each refused call used to write a ``tool.call`` line, uvicorn's access line and an
audit row: 121 refusals a second made about 5 GiB of log a day. Here mallory sends
REFUSED calls to ``get_experiment`` for an experiment that does not exist (refused
with NOT_FOUND), 16 at a time; alice, an honest tenant, makes a few calls of each
kind. The server is then stopped the ordinary way (SIGTERM) and its stderr and
SQLite audit trail are read: mallory's refusals took at most PER_MINUTE lines and
rows per minute the flood lasted (plus one count a minute), the counts add up to
REFUSED exactly, and every one of alice's calls has its line and its row.
"""

from __future__ import annotations

import asyncio
import json
import math
import sqlite3
import time
from pathlib import Path
from typing import Any

import httpx2
import pytest
from e2e_server import start_server, stop_server
from mcp_http import tool
from oauth_browser import new_users

pytestmark = pytest.mark.e2e

REFUSED = 3000
CONNECTIONS = 16
PER_MINUTE = 10  # SANDBOX_MCP_AUDIT_REFUSALS_PER_MINUTE, set below
ALICE_OK = 5
ALICE_REFUSED = 3  # under PER_MINUTE: all written


def _events(log: str) -> list[dict[str, Any]]:
    return [json.loads(line) for line in log.splitlines() if line.startswith("{")]


async def test_a_flood_of_refusals_is_counted_not_written(tmp_path: Path) -> None:
    state = tmp_path / "state"
    server = start_server(
        state,
        SANDBOX_MCP_AUTH="oauth",
        SANDBOX_MCP_POOL_SIZE="2",
        SANDBOX_MCP_AUDIT_REFUSALS_PER_MINUTE=str(PER_MINUTE),
    )
    try:
        limits = httpx2.Limits(max_connections=CONNECTIONS)
        async with httpx2.AsyncClient(timeout=60, limits=limits) as http:
            mallory, alice = await new_users(http, server.base_url, 2)
            lines_before = len(server.log().splitlines())
            remaining = REFUSED
            started = time.monotonic()

            async def flood() -> None:
                nonlocal remaining
                while remaining > 0:
                    remaining -= 1
                    result = await tool(
                        http, server, mallory, "get_experiment", {"experiment_id": "nope"}
                    )
                    assert result["error"]["code"] == "NOT_FOUND", result

            await asyncio.gather(*(flood() for _ in range(CONNECTIONS)))
            flood_s = time.monotonic() - started
            lines_during = len(server.log().splitlines()) - lines_before
            for _ in range(ALICE_OK):
                assert not (await tool(http, server, alice, "sandbox_status"))["is_error"]
            for _ in range(ALICE_REFUSED):
                result = await tool(http, server, alice, "get_job_status", {"job_id": "nope"})
                assert result["is_error"], result
    finally:
        stop_server(server)
    # The counts of the last window are written as the server stops.
    assert "Application shutdown complete." in server.log(), server.log()[-2000:]

    # Windows open at mallory's first refusal and last a minute: the flood spans at most
    # this many (measured, so a slow machine only widens the bound).
    windows = math.ceil(flood_s / 60) + 1
    bound = (PER_MINUTE + 1) * windows
    print(f"{REFUSED} refusals in {flood_s:.1f} s: {lines_during} log lines (bound {bound})")
    assert lines_during <= bound, server.log()[-3000:]

    events = _events(server.log())
    written = [e for e in events if e["event"] == "tool.call" and e.get("tool") == "get_experiment"]
    counted = [
        e
        for e in events
        if e["event"] == "tool.calls_not_recorded" and e.get("tool") == "get_experiment"
    ]
    assert len(written) <= PER_MINUTE * windows, len(written)
    assert len(written) + sum(e["calls"] for e in counted) == REFUSED, (len(written), counted)
    assert {e["outcome"] for e in written + counted} == {"NOT_FOUND"}

    alice_lines = [
        e
        for e in events
        if e["event"] == "tool.call" and e.get("tool") in ("sandbox_status", "get_job_status")
    ]
    assert len(alice_lines) == ALICE_OK + ALICE_REFUSED, alice_lines

    database = sqlite3.connect(state / "sandbox-mcp.db")
    try:
        by_key = database.execute(
            "SELECT sandbox_key, count(*), sum(calls) FROM tool_calls GROUP BY sandbox_key"
        ).fetchall()
        alice_rows = database.execute(
            "SELECT tool, outcome, calls FROM tool_calls WHERE sandbox_key = ("
            "SELECT sandbox_key FROM tool_calls WHERE tool = 'sandbox_status' LIMIT 1)"
        ).fetchall()
    finally:
        database.close()
    assert len(by_key) == 2, by_key
    (_, mallory_rows, mallory_calls) = next(row for row in by_key if row[2] >= REFUSED)
    print(f"audit rows for {mallory_calls} refused calls: {mallory_rows} (bound {bound})")
    assert mallory_calls == REFUSED
    assert mallory_rows <= bound
    assert sorted(alice_rows) == sorted(
        [("get_job_status", "NOT_FOUND", 1)] * ALICE_REFUSED
        + [("sandbox_status", "ok", 1)] * ALICE_OK
    )
