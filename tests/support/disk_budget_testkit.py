"""What the dir slots' byte budget e2e tests share: a server with a small budget and a
short check interval, and the slots' bytes as the budget counts them."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import httpx2
from e2e_server import RunningServer, start_server
from mcp_http import tool

from app.experiments.disk_budget import measure_tree

BUDGET_MB = 32
INTERVAL_S = 0.5
# The writers of these tests add about 20 MB/s; one check interval plus one walk and
# the kill leaves room for a few more seconds of writing on a loaded machine.
SLACK_MB = 64


def start_budget_server(state: Path, pool_size: int) -> RunningServer:
    """A signed-in server whose dir slots have BUDGET_MB, measured every INTERVAL_S."""
    return start_server(
        state,
        SANDBOX_MCP_AUTH="oauth",
        SANDBOX_MCP_POOL_SIZE=str(pool_size),
        SANDBOX_MCP_DIR_SLOT_BUDGET_MB=str(BUDGET_MB),
        SANDBOX_MCP_DISK_CHECK_INTERVAL_S=str(INTERVAL_S),
    )


async def new_experiment(http: httpx2.AsyncClient, server: RunningServer, token: str) -> str:
    created = await tool(http, server, token, "create_experiment", {"name": "disk"})
    assert not created["is_error"], created
    return str(created["experiment_id"])


def slots_mb(state: Path) -> float:
    return measure_tree(state / "slots", 1_000_000).bytes / 1_048_576


def code_of(result: dict[str, Any]) -> str | None:
    return result.get("error", {}).get("code") if result["is_error"] else None
