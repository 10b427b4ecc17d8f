"""Waiting that clients survive: progress while a long call runs, and a command that
outlives the client that started it.

Claude Code resets its idle timer on each progress notification and gives up on a
call that stays silent; a client whose connection drops must not lose its command.
"""

from __future__ import annotations

import asyncio
import json
import time
from typing import Any

import httpx2
import pytest
from e2e_server import RunningServer, Servers
from mcp_http import (
    LEGACY,
    MODERN,
    legacy_request,
    legacy_rpc,
    post_rpc,
    read_jsonrpc,
    run_command,
    tool,
)

pytestmark = pytest.mark.e2e


@pytest.fixture(scope="module")
def server(serve_module: Servers) -> RunningServer:
    return serve_module(
        SANDBOX_MCP_AUTH="oauth",
        SANDBOX_MCP_POOL_SIZE="8",
        SANDBOX_MCP_QUEUE_WAIT_S="0",
        SANDBOX_MCP_SIGNINS_PER_MINUTE="100",
        SANDBOX_MCP_PROGRESS_INTERVAL_S="1",
    )


async def call_with_progress(
    http: httpx2.AsyncClient,
    server: RunningServer,
    token: str,
    era: str,
    name: str,
    arguments: dict[str, Any],
) -> tuple[list[dict[str, Any]], dict[str, Any]]:
    """A tools/call asking for progress (no session, either era): the notifications that
    came, and the result."""
    params = {"name": name, "arguments": arguments, "_meta": {"progressToken": f"{name}-1"}}
    if era == MODERN:
        response = await post_rpc(
            http, server.mcp_url, "tools/call", params, token=token, name=name
        )
    else:
        response = await legacy_rpc(http, server, token, "tools/call", params)
    assert response.status_code == 200, response.text
    progress = [
        json.loads(line[5:])["params"]
        for line in response.text.splitlines()
        if line.startswith("data:") and "notifications/progress" in line
    ]
    return progress, read_jsonrpc(response)["result"]


@pytest.mark.parametrize("era", [LEGACY, MODERN])
async def test_a_synchronous_command_sends_progress_while_it_runs(
    http: httpx2.AsyncClient, server: RunningServer, signed_in: tuple[str, str], era: str
) -> None:
    token, experiment = signed_in
    progress, result = await call_with_progress(
        http,
        server,
        token,
        era,
        "execute_experiment",
        {"experiment_id": experiment, "command": "sleep 4; echo done"},
    )
    assert result["structuredContent"]["stdout"] == "done\n"
    alive = [p for p in progress if "Still working on execute_experiment" in p["message"]]
    assert len(alive) >= 2, progress  # every second, for a four-second command
    assert all(p["progressToken"] == "execute_experiment-1" for p in alive)


async def test_waiting_for_a_job_sends_progress(
    http: httpx2.AsyncClient, server: RunningServer, signed_in: tuple[str, str]
) -> None:
    token, experiment = signed_in
    job = await run_command(http, server, token, experiment, "sleep 4; echo late", background=True)
    # The longest wait there is (it ends with the job): a busy machine's slow start
    # must not make the 4 s job outlast it.
    progress, result = await call_with_progress(
        http, server, token, LEGACY, "get_job_result", {"job_id": job["job_id"], "wait_s": 45}
    )
    assert result["structuredContent"]["stdout"] == "late\n"
    assert any("Still working on get_job_result" in p["message"] for p in progress), progress


async def test_a_command_outlives_the_client_that_gave_up_on_it(
    http: httpx2.AsyncClient, server: RunningServer, signed_in: tuple[str, str]
) -> None:
    token, experiment = signed_in
    with pytest.raises(httpx2.TimeoutException):
        await http.post(
            server.mcp_url,
            **legacy_request(
                token,
                "tools/call",
                {
                    "name": "execute_experiment",
                    "arguments": {
                        "experiment_id": experiment,
                        "command": "sleep 3; echo survived > kept.txt; echo survived",
                    },
                },
            ),
            timeout=1,  # the client hangs up a second in
        )
    deadline = time.monotonic() + 20
    while True:
        jobs = (await tool(http, server, token, "get_experiment", {"experiment_id": experiment}))[
            "jobs"
        ]
        finished = [j for j in jobs if j["status"] != "running"]
        if finished or time.monotonic() > deadline:
            break
        await asyncio.sleep(0.5)
    (job,) = finished
    assert job["status"] == "completed", job
    found = await tool(
        http, server, token, "get_job_result", {"job_id": job["job_id"], "wait_s": 0}
    )
    assert found["stdout"] == "survived\n"
    read = await tool(
        http, server, token, "read_sandbox_file", {"experiment_id": experiment, "path": "kept.txt"}
    )
    assert read["content"] == "survived\n"
