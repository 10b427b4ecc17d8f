"""Review 6, finding 9: one signed-in tenant holds every HTTP connection the server
accepts, and nobody else gets in.

The connection guard (app/http/connection_guard.py) caps open connections at
MAX_CONNECTIONS and, past it, evicts only connections still sending their request;
"a connection past that ... is closed itself only when every open connection has
sent its whole request". Nothing bounds one sandbox's requests in flight: a tenant
whose calls legitimately wait (``get_job_result`` with ``wait_s`` 45 on its own
running job, a command's synchronous wait) fills the cap with complete requests,
and every other client's connection is then closed unanswered. MAX_CONNECTIONS is 64
here for speed; at the default 4096 the attack is the same number of sockets more.
"""

from __future__ import annotations

import asyncio
import contextlib
from pathlib import Path

import httpx2
import pytest
from e2e_server import start_server, stop_server
from mcp_http import run_command, tool
from oauth_browser import new_users

pytestmark = pytest.mark.e2e

CAP = 64
HOGS = CAP + 16


async def test_one_tenant_s_waiting_calls_do_not_lock_everyone_out(tmp_path: Path) -> None:
    server = start_server(
        tmp_path / "state",
        SANDBOX_MCP_AUTH="oauth",
        SANDBOX_MCP_POOL_SIZE="2",
        SANDBOX_MCP_QUEUE_WAIT_S="0",
        SANDBOX_MCP_MAX_CONNECTIONS=str(CAP),
    )
    try:
        async with httpx2.AsyncClient(timeout=120) as http:
            mallory, alice = await new_users(http, server.base_url, 2)
            created = await tool(http, server, mallory, "create_experiment", {"name": "hog"})
            assert not created["is_error"], created
            job = await run_command(
                http, server, mallory, created["experiment_id"], "sleep 90", background=True
            )
            assert job["status"] == "running", job

        limits = httpx2.Limits(max_connections=HOGS, max_keepalive_connections=0)
        async with httpx2.AsyncClient(timeout=120, limits=limits) as hog:
            waits = [
                asyncio.create_task(
                    tool(
                        hog,
                        server,
                        mallory,
                        "get_job_result",
                        {"job_id": job["job_id"], "wait_s": 40},
                    )
                )
                for _ in range(HOGS)
            ]
            try:
                await asyncio.sleep(3)  # the waits are in flight (a lower bound, not a window)
                async with httpx2.AsyncClient(timeout=20) as other:
                    try:
                        status = await tool(other, server, alice, "sandbox_status")
                        outcome = "answered" if not status["is_error"] else str(status)
                    except (httpx2.HTTPError, AssertionError) as exc:
                        outcome = f"{type(exc).__name__}: {exc}"
                assert outcome == "answered", (
                    f"alice's call while mallory holds {HOGS} waiting calls: {outcome}"
                )
            finally:
                async with httpx2.AsyncClient(timeout=60) as http:
                    with contextlib.suppress(Exception):
                        await tool(http, server, mallory, "cancel_job", {"job_id": job["job_id"]})
                for wait in waits:
                    wait.cancel()
                await asyncio.gather(*waits, return_exceptions=True)
    finally:
        stop_server(server)
