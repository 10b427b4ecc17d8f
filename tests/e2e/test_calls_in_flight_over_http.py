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
import json
from pathlib import Path
from typing import Any

import httpx2
import pytest
from e2e_server import RunningServer, start_server, stop_server
from mcp_http import rpc_request, run_command, tool
from oauth_browser import new_users
from stated_limits import stated

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


async def _admitted_wait(
    http: httpx2.AsyncClient,
    server: RunningServer,
    token: str,
    job_id: str,
    stack: contextlib.AsyncExitStack,
    kept: list[object],
) -> str:
    """A get_job_result wait left in flight: returns once the server reports progress on
    it (it is then past admission, counted), or with the refusal's code."""
    params = {
        "name": "get_job_result",
        "arguments": {"job_id": job_id, "wait_s": 45},
        "_meta": {"progressToken": f"wait-{job_id}"},
    }
    request = rpc_request("tools/call", params, token=token, name="get_job_result")
    response = await stack.enter_async_context(http.stream("POST", server.mcp_url, **request))
    assert response.status_code == 200
    lines = response.aiter_lines()
    kept.append(lines)  # a collected line iterator closes its response, and the call
    async for line in lines:
        if not line.startswith("data:"):
            continue
        message = json.loads(line[5:])
        if message.get("method") == "notifications/progress":
            return "in flight"
        return str(message["result"]["structuredContent"]["error"]["code"])
    raise AssertionError("the wait's stream ended without a message")


async def test_the_sandboxes_of_one_address_share_the_documented_bound(tmp_path: Path) -> None:
    """MAX_CALLS_PER_ADDRESS (128) as shipped, over HTTP: four sandboxes signed in from
    one address hold 32 waiting calls each (each under its own bound, 32), all admitted;
    a fifth sandbox of that address is then refused, naming the address's bound, and is
    served again once one of those calls ends. Progress every second is how a wait
    shows it was admitted; no calls bound is set."""
    per_sandbox = stated("MAX_CALLS_PER_SANDBOX")
    per_address = stated("MAX_CALLS_PER_ADDRESS")
    holders = per_address // per_sandbox
    server = start_server(
        tmp_path / "state",
        SANDBOX_MCP_AUTH="oauth",
        SANDBOX_MCP_POOL_SIZE=str(holders + 1),
        SANDBOX_MCP_PROGRESS_INTERVAL_S="1",
    )
    limits = httpx2.Limits(max_connections=per_address + 16, max_keepalive_connections=8)
    try:
        async with httpx2.AsyncClient(timeout=120, limits=limits) as http:
            *tokens, fifth = await new_users(http, server.base_url, holders + 1)
            jobs = []
            for token in tokens:
                made = await tool(http, server, token, "create_experiment", {})
                assert not made["is_error"], made
                job = await run_command(
                    http, server, token, made["experiment_id"], "sleep 300", background=True
                )
                jobs.append((token, job["job_id"]))
            try:
                async with contextlib.AsyncExitStack() as stack:
                    kept: list[object] = []
                    waits = await asyncio.wait_for(
                        asyncio.gather(
                            *(
                                _admitted_wait(http, server, token, job_id, stack, kept)
                                for token, job_id in jobs
                                for _ in range(per_sandbox)
                            )
                        ),
                        timeout=40,  # progress comes after 1 s; each wait lasts 45
                    )
                    assert waits == ["in flight"] * per_address, sorted(set(waits))
                    refused = await tool(http, server, fifth, "sandbox_status")
                    assert refused["is_error"], refused
                    assert refused["error"]["code"] == "TOO_MANY_CALLS", refused
                    assert refused["error"]["limit"] == "calls_per_address", refused
                    assert refused["error"]["value"] == per_address, refused
                # The waits' streams are closed: their calls end, and the address's count
                # with them (bounded: the server notices each client going away).
                status = refused
                for _ in range(450):  # 90 s at most: slower on a busy machine
                    status = await tool(http, server, fifth, "sandbox_status")
                    if not status["is_error"]:
                        break
                    await asyncio.sleep(0.2)
                assert not status["is_error"], status
            finally:
                for token, job_id in jobs:
                    with contextlib.suppress(Exception):
                        await tool(http, server, token, "cancel_job", {"job_id": job_id})
    finally:
        stop_server(server)
