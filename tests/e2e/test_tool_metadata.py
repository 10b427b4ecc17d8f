"""tools/list over HTTP on the real server: every tool has a title, all four hints and a
description an agent can act on; the hints say the truth about each tool.

Claude's connector directory requires title, readOnlyHint and destructiveHint, and
Claude runs read-only tools without asking: a wrong hint is a wrong permission.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import httpx2
import pytest
from e2e_server import RunningServer, Servers, start_server, stop_server
from mcp_http import post_rpc, read_jsonrpc

pytestmark = pytest.mark.e2e

HINTS = ("readOnlyHint", "destructiveHint", "idempotentHint", "openWorldHint")
SEED_TOOLS = {
    "create_experiment", "execute_experiment", "run_tests", "read_sandbox_file",
    "write_sandbox_file", "inspect_changes", "collect_artifacts", "get_experiment",
    "list_experiments", "get_job_status", "get_job_result", "cancel_job",
    "destroy_experiment", "compare_experiments", "check_sandbox_runtime",
}  # fmt: skip
READ_ONLY = {
    "sandbox_status", "check_sandbox_runtime", "get_experiment", "list_experiments",
    "get_job_status", "get_job_result", "read_sandbox_file", "list_sandbox_files",
    "search_sandbox", "inspect_changes", "compare_experiments", "map_project",
}  # fmt: skip
DESTRUCTIVE = {"destroy_experiment", "cancel_job", "execute_experiment"}
# Tools that can reach the network when the operator allows egress (git egress for create).
NETWORK = {"create_experiment", "execute_experiment", "run_tests"}


async def listed_tools(server: RunningServer) -> dict[str, dict[str, Any]]:
    async with httpx2.AsyncClient(timeout=30) as http:
        response = await post_rpc(http, server.mcp_url, "tools/list", {})
    assert response.status_code == 200, response.text
    return {t["name"]: t for t in read_jsonrpc(response)["result"]["tools"]}


@pytest.fixture(scope="module")
def closed(serve_module: Servers) -> RunningServer:
    return serve_module(SANDBOX_MCP_POOL_SIZE="1")


async def test_every_tool_has_a_title_all_hints_and_a_usable_description(
    closed: RunningServer,
) -> None:
    tools = await listed_tools(closed)
    assert tools.keys() >= SEED_TOOLS
    assert len(tools) == 20
    for name, spec in tools.items():
        assert spec.get("title"), name
        assert spec["title"] != name, f"{name}: a title is for people, not the name again"
        annotations = spec.get("annotations") or {}
        missing = [hint for hint in HINTS if not isinstance(annotations.get(hint), bool)]
        assert not missing, (name, missing)
        description = spec["description"]
        assert 300 <= len(description) <= 900, (name, len(description))
        assert "USE THIS" in description, name  # when to use it
        assert "RETURNS" in description, name  # what it gives back
        assert "NEVER" in description, name  # what it will never do


async def test_the_hints_tell_the_truth(closed: RunningServer) -> None:
    tools = await listed_tools(closed)
    for name, spec in tools.items():
        hints = spec["annotations"]
        assert hints["readOnlyHint"] is (name in READ_ONLY), name
        assert hints["destructiveHint"] is (name in DESTRUCTIVE), name
        # No egress on this server: nothing reaches the network.
        assert hints["openWorldHint"] is False, name
        if name in READ_ONLY:
            assert hints["idempotentHint"] is True, name
    # A second destroy or cancel changes nothing more; a second create makes another.
    assert tools["destroy_experiment"]["annotations"]["idempotentHint"] is True
    assert tools["cancel_job"]["annotations"]["idempotentHint"] is True
    assert tools["create_experiment"]["annotations"]["idempotentHint"] is False
    assert tools["execute_experiment"]["annotations"]["idempotentHint"] is False
    assert tools["write_sandbox_file"]["annotations"]["idempotentHint"] is True
    assert tools["edit_sandbox_file"]["annotations"]["idempotentHint"] is False


async def test_with_egress_the_network_tools_say_they_reach_it(tmp_path: Path) -> None:
    server = start_server(
        tmp_path / "state",
        SANDBOX_MCP_POOL_SIZE="1",
        SANDBOX_MCP_ALLOW_EGRESS="true",
        SANDBOX_MCP_ALLOW_GIT_EGRESS="true",
    )
    try:
        tools = await listed_tools(server)
    finally:
        stop_server(server)
    for name, spec in tools.items():
        assert spec["annotations"]["openWorldHint"] is (name in NETWORK), name


async def test_git_egress_alone_opens_only_create(tmp_path: Path) -> None:
    server = start_server(
        tmp_path / "state", SANDBOX_MCP_POOL_SIZE="1", SANDBOX_MCP_ALLOW_GIT_EGRESS="true"
    )
    try:
        tools = await listed_tools(server)
    finally:
        stop_server(server)
    opened = {name for name, spec in tools.items() if spec["annotations"]["openWorldHint"]}
    assert opened == {"create_experiment"}
