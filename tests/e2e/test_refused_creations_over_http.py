"""A refused create_experiment leaves nothing that counts against the caller's limits.

Seen: after IMAGE_NOT_ALLOWED, EGRESS_DISABLED, GIT_EGRESS_DISABLED or
PROJECT_PATH_REFUSED a FAILED record stayed and counted toward MAX_EXPERIMENTS: with
the default limit, a few typos and TOO_MANY_EXPERIMENTS hid the real error.
"""

from __future__ import annotations

from typing import Any

import httpx2
import pytest
from e2e_server import RunningServer, Servers
from mcp_http import run_command, tool

from app.settings import ExperimentSettings

pytestmark = pytest.mark.e2e

# Allowed by the operator, never built: create_experiment answers IMAGE_MISSING.
ABSENT_IMAGE = "sandbox-mcp/never-built:1"


@pytest.fixture(scope="module")
def server(serve_module: Servers) -> RunningServer:
    # Local mode (project_path is only refused there for a reason of its own), with the
    # default MAX_EXPERIMENTS.
    return serve_module(
        SANDBOX_MCP_POOL_SIZE="1",
        SANDBOX_MCP_MAX_CONTAINERS="10",  # room for MAX_EXPERIMENTS containers in one sandbox
        SANDBOX_MCP_IMAGES=f"sandbox-mcp/python:3,{ABSENT_IMAGE}",
    )


REFUSED: list[tuple[dict[str, Any], str]] = [
    ({"image": "evil/miner:latest"}, "IMAGE_NOT_ALLOWED"),
    ({"network": "egress"}, "EGRESS_DISABLED"),
    ({"git": {"url": "https://example.test/p.git", "ref": "main"}}, "GIT_EGRESS_DISABLED"),
    ({"project_path": "/"}, "PROJECT_PATH_REFUSED"),
    ({"image": ABSENT_IMAGE}, "IMAGE_MISSING"),
]


async def test_refused_creations_leave_the_limit_whole(
    http: httpx2.AsyncClient, server: RunningServer
) -> None:
    limit = ExperimentSettings.model_fields["max_experiments"].default
    assert len(REFUSED) > limit, "more refusals than the limit, or the test proves nothing"
    for arguments, code in REFUSED:
        refused = await tool(http, server, "", "create_experiment", arguments)
        assert refused["is_error"], refused
        assert refused["error"]["code"] == code, refused
    runtime = await tool(http, server, "", "check_sandbox_runtime")
    assert runtime["max_experiments"] == limit
    # Every place is still free: `limit` good creations succeed and run a command.
    created = []
    for _ in range(limit):
        good = await tool(http, server, "", "create_experiment", {})
        assert not good["is_error"], good
        created.append(good["experiment_id"])
    ran = await run_command(http, server, "", created[0], "echo alive")
    assert ran["stdout"] == "alive\n"
    # ... and the limit still holds: the next one is refused for the limit, not lost.
    over = await tool(http, server, "", "create_experiment", {})
    assert over["error"]["code"] == "TOO_MANY_EXPERIMENTS"
    listed = await tool(http, server, "", "list_experiments", {"limit": 50})
    live = [e for e in listed["experiments"] if e["state"] != "DESTROYED"]
    assert sorted(e["experiment_id"] for e in live) == sorted(created)
    for experiment in created:
        await tool(http, server, "", "destroy_experiment", {"experiment_id": experiment})
