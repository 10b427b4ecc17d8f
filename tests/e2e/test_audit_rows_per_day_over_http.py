"""A sandbox's audit rows of a day are bounded by the real server, however many server
processes serve it, and the sandboxes of one sign-in address share a bound of their
own (issue 23, finding 9).

Each test sets a small ``SANDBOX_MCP_AUDIT_ROWS_PER_SANDBOX_PER_DAY`` (PER_DAY). A
sandbox makes more calls than that: every one is answered as before, the first PER_DAY
get a row each, and the rest are written as counts (rows whose ``calls`` column says
how many they stand for; their ``tool.calls_not_recorded`` line carries the same
request id). The audit table is read after the servers stop the ordinary way (the
counts of the open windows are written then).

Across processes: two servers on one PostgreSQL, the sandbox's calls alternating
between them. Counted per process (before), each wrote PER_DAY rows: twice the bound.

The day is a UTC day: a test that spans midnight allows one bound per day it spans.
"""

from __future__ import annotations

import json
import time
from collections import defaultdict
from pathlib import Path
from typing import Any

import httpx2
import pytest
import sqlalchemy as sa
from db_testkit import fresh_postgres
from e2e_server import RunningServer, free_port, start_server, stop_server
from mcp_http import tool
from oauth_browser import new_users
from sqlalchemy.ext.asyncio import create_async_engine

pytestmark = pytest.mark.e2e

PER_DAY = 50
PER_ADDRESS = 80
CALLS = 120  # each hostile sandbox's, past PER_DAY
REFUSED = 10  # refused calls past the bound: answered with their code, counted too
HONEST = 7


def _today() -> int:
    return int(time.time() // 86_400)


def _count_ids(servers: list[RunningServer]) -> set[str]:
    """The request ids of the count rows, from their ``tool.calls_not_recorded`` lines."""
    ids = set()
    for server in servers:
        for line in server.log().splitlines():
            if line.startswith("{"):
                event = json.loads(line)
                if event["event"] == "tool.calls_not_recorded":
                    ids.add(event["request_id"])
    return ids


def _by_sandbox(rows: list[Any], count_ids: set[str]) -> dict[int, tuple[int, int]]:
    """Per sandbox, keyed by how many calls it made: (rows written one per call, count
    rows). Each sandbox of a test makes a different number of calls."""
    made: dict[str, int] = defaultdict(int)
    written: dict[str, int] = defaultdict(int)
    counts: dict[str, int] = defaultdict(int)
    for sandbox_key, request_id, calls in rows:
        made[sandbox_key] += calls
        if request_id in count_ids:
            counts[sandbox_key] += 1
        else:
            assert calls == 1, (sandbox_key, request_id, calls)
            written[sandbox_key] += 1
    assert len(set(made.values())) == len(made), made
    return {made[key]: (written[key], counts[key]) for key in made}


async def _status_calls(
    http: httpx2.AsyncClient, servers: list[RunningServer], token: str, calls: int
) -> None:
    """``calls`` ordinary calls, alternating between ``servers``: each answered."""
    for number in range(calls):
        result = await tool(http, servers[number % len(servers)], token, "sandbox_status")
        assert not result["is_error"], result


async def test_past_the_day_s_rows_calls_are_answered_and_counted_not_written(
    tmp_path: Path,
) -> None:
    state = tmp_path / "state"
    day = _today()
    server = start_server(
        state,
        SANDBOX_MCP_AUTH="oauth",
        SANDBOX_MCP_POOL_SIZE="2",
        SANDBOX_MCP_AUDIT_ROWS_PER_SANDBOX_PER_DAY=str(PER_DAY),
    )
    try:
        async with httpx2.AsyncClient(timeout=60) as http:
            mallory, alice = await new_users(http, server.base_url, 2)
            await _status_calls(http, [server], mallory, CALLS)
            for _ in range(REFUSED):
                result = await tool(http, server, mallory, "get_experiment", {"experiment_id": "x"})
                assert result["error"]["code"] == "NOT_FOUND", result
            await _status_calls(http, [server], alice, HONEST)
    finally:
        stop_server(server)
    assert "Application shutdown complete." in server.log(), server.log()[-2000:]
    days = _today() - day + 1

    database = sa.create_engine(f"sqlite:///{state / 'sandbox-mcp.db'}")
    try:
        with database.connect() as connection:
            rows = list(
                connection.execute(sa.text("SELECT sandbox_key, request_id, calls FROM tool_calls"))
            )
    finally:
        database.dispose()
    sandboxes = _by_sandbox(rows, _count_ids([server]))
    written, counts = sandboxes[CALLS + REFUSED]
    print(f"mallory: {CALLS + REFUSED} calls, {written} rows one per call, {counts} count rows")
    if days == 1:
        assert written == PER_DAY
    assert written <= PER_DAY * days
    # One count a window (an hour) per tool and outcome: sandbox_status ok, NOT_FOUND.
    assert 1 <= counts <= 2 * days * 2
    assert sandboxes[HONEST] == (HONEST, 0)  # an honest tenant's calls all written


async def test_two_processes_write_one_day_s_rows_and_an_address_shares_its_own(
    tmp_path: Path,
) -> None:
    """mallory's two sandboxes (one address) alternate their calls between two
    processes on one PostgreSQL: the first writes PER_DAY rows in all, the second
    what is left of the address's PER_ADDRESS; alice, from another address, all hers."""
    port = free_port()
    day = _today()
    async with fresh_postgres() as database_url:
        env = {
            "SANDBOX_MCP_AUTH": "oauth",
            "SANDBOX_MCP_DATABASE_URL": database_url,
            "SANDBOX_MCP_PUBLIC_URL": f"http://127.0.0.1:{port}",
            "SANDBOX_MCP_TRUSTED_PROXIES": "127.0.0.1",
            "SANDBOX_MCP_POOL_SIZE": "2",
            "SANDBOX_MCP_AUDIT_ROWS_PER_SANDBOX_PER_DAY": str(PER_DAY),
            "SANDBOX_MCP_AUDIT_ROWS_PER_ADDRESS_PER_DAY": str(PER_ADDRESS),
        }
        servers: list[RunningServer] = []
        try:
            servers.append(start_server(tmp_path / "state", port=port, **env))
            servers.append(start_server(tmp_path / "state", **env))
            hostile = {"x-forwarded-for": "198.18.40.1"}
            honest = {"x-forwarded-for": "198.18.41.1"}
            async with httpx2.AsyncClient(timeout=60, headers=hostile) as http:
                first, second = await new_users(http, servers[0].base_url, 2)
                await _status_calls(http, servers, first, CALLS)
                await _status_calls(http, servers, second, CALLS + 1)
            async with httpx2.AsyncClient(timeout=60, headers=honest) as http:
                (alice,) = await new_users(http, servers[1].base_url, 1)
                await _status_calls(http, servers, alice, HONEST)
        finally:
            for server in servers:
                stop_server(server)
        for server in servers:
            assert "Application shutdown complete." in server.log(), server.log()[-2000:]
        count_ids = _count_ids(servers)
        days = _today() - day + 1

        engine = create_async_engine(database_url)
        try:
            async with engine.connect() as connection:
                result = await connection.execute(
                    sa.text("SELECT sandbox_key, request_id, calls FROM tool_calls")
                )
                rows = list(result)
        finally:
            await engine.dispose()
    sandboxes = _by_sandbox(rows, count_ids)
    (first_written, first_counts), (second_written, second_counts) = (
        sandboxes[CALLS],
        sandboxes[CALLS + 1],
    )
    print(
        f"two processes: {first_written} and {second_written} rows one per call "
        f"(bounds {PER_DAY} per sandbox, {PER_ADDRESS} per address), "
        f"{first_counts} and {second_counts} count rows"
    )
    if days == 1:
        assert first_written == PER_DAY
        assert second_written == PER_ADDRESS - PER_DAY
    assert first_written <= PER_DAY * days
    assert first_written + second_written <= PER_ADDRESS * days
    # At most one count an hour per process for each sandbox's (tool, outcome).
    assert 1 <= first_counts <= 2 * days
    assert 1 <= second_counts <= 2 * days
    assert sandboxes[HONEST] == (HONEST, 0)
