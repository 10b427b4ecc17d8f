"""One signed-in tenant's waiting calls do not hold every HTTP connection the server
accepts.

The connection guard (app/http/connection_guard.py) caps open connections at
MAX_CONNECTIONS and, past it, evicts only connections still sending their request;
when every open connection has sent its whole request, the new one is closed
unanswered. A tenant whose calls legitimately wait (``get_job_result`` with ``wait_s``
on its own running job, a command's synchronous wait) would fill the cap with
complete requests; the runner bounds one sandbox's calls in flight
(MAX_CALLS_PER_SANDBOX, 32) and refuses the one past it at once with TOO_MANY_CALLS,
which frees its connection. Here mallory sends 80 waiting calls against a cap of 64
connections; alice is still answered, and mallory's refused calls say why.
MAX_CONNECTIONS is 64 here for speed; at the default 4096 the same holds per 32
connections of each sandbox.
"""

from __future__ import annotations

import asyncio
import contextlib
from pathlib import Path
from typing import Any

import httpx2
import pytest
from e2e_server import start_server, stop_server
from mcp_http import run_command, tool
from oauth_browser import new_users

pytestmark = pytest.mark.e2e

CAP = 64
HOGS = CAP + 16
PER_SANDBOX = 32  # MAX_CALLS_PER_SANDBOX's default


async def _first_answered(
    calls: list[asyncio.Task[dict[str, Any]]], count: int, *, within_s: float
) -> list[dict[str, Any]]:
    """Once ``count`` calls have ended (they must within ``within_s``), the results of
    those answered (the others' connections were closed)."""
    async with asyncio.timeout(within_s):
        while sum(call.done() for call in calls) < count:
            await asyncio.wait(
                [call for call in calls if not call.done()], return_when=asyncio.FIRST_COMPLETED
            )
    return [
        call.result()
        for call in calls
        if call.done() and not isinstance(call.exception(), httpx2.TransportError)
    ]


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
                # Each refusal happens while PER_SANDBOX waits are in flight, and those run
                # 40 s: once the others are refused, the cap's worth of waits is held.
                # The burst's own connections past CAP may be closed while still sending
                # (the guard's eviction, at most HOGS - CAP of them); the rest are answered.
                refused = await _first_answered(waits, HOGS - PER_SANDBOX, within_s=35)
                assert len(refused) >= HOGS - PER_SANDBOX - (HOGS - CAP), len(refused)
                codes = {result.get("error", {}).get("code") for result in refused}
                assert codes == {"TOO_MANY_CALLS"}, refused[:3]
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
