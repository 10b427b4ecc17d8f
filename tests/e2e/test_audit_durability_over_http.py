"""No answered call lacks its audit row, even when the server is killed with -9 at once.

The audit trail commits rows in groups and answers a call only after the commit that
carried its row (issue 13). The real server, signed-in calls over HTTP from 16
connections at a time, then SIGKILL the moment the last answer arrives: the database
file must hold one row per answered call.
"""

from __future__ import annotations

import asyncio
import sqlite3
from pathlib import Path

import httpx2
import pytest
from e2e_server import start_server
from mcp_http import call_tool, read_jsonrpc
from oauth_browser import ManualClient

pytestmark = pytest.mark.e2e

CONNECTIONS = 16
CALLS_PER_CONNECTION = 25


async def test_every_answered_call_has_its_row_after_kill_9(tmp_path: Path) -> None:
    state = tmp_path / "state"
    server = start_server(state, SANDBOX_MCP_AUTH="oauth", SANDBOX_MCP_POOL_SIZE="2")
    try:
        limits = httpx2.Limits(max_connections=CONNECTIONS)
        async with httpx2.AsyncClient(timeout=60, limits=limits) as http:
            client = await ManualClient.register(http, server.base_url)
            token = await client.access_token(http)

            async def caller() -> int:
                answered = 0
                for _ in range(CALLS_PER_CONNECTION):
                    response = await call_tool(http, server.base_url, token, "sandbox_status")
                    assert response.status_code == 200, response.text
                    assert not read_jsonrpc(response)["result"].get("isError"), response.text
                    answered += 1
                return answered

            answered = sum(await asyncio.gather(*(caller() for _ in range(CONNECTIONS))))
            server.process.kill()  # no shutdown: nothing gets a chance to flush
    finally:
        server.process.kill()
        server.process.wait()
    assert server.process.returncode == -9

    database = sqlite3.connect(state / "sandbox-mcp.db")
    try:
        rows = database.execute(
            "SELECT count(*), count(DISTINCT request_id) FROM tool_calls "
            "WHERE tool = 'sandbox_status' AND outcome = 'ok'"
        ).fetchone()
    finally:
        database.close()
    assert answered == CONNECTIONS * CALLS_PER_CONNECTION
    assert rows == (answered, answered)
