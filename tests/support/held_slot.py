"""A server whose only slot is held, and a second user who must queue for it.

The holder wrote a file and then goes quiet: after ``SANDBOX_MCP_IDLE_TIMEOUT_S`` (10 s)
the watchdog frees the slot, empties it and hands it to the first user queued.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path

import httpx2
from e2e_server import RunningServer, start_server, stop_server
from mcp_http import probe
from oauth_browser import new_users

# How long the waiting user's call may queue: the most the server allows, as the
# watchdog's tick and the slot's emptying come on top of the holder's 10 s and take
# far longer on a busy machine (30 s was close there).
QUEUE_WAIT_S = 50


@asynccontextmanager
async def a_held_slot(
    http: httpx2.AsyncClient, state: Path, env: dict[str, str]
) -> AsyncIterator[tuple[RunningServer, str]]:
    """The running server (``env`` plus one slot) and the waiting user's token."""
    server = start_server(
        state,
        probe=True,
        **{
            **env,
            "SANDBOX_MCP_POOL_SIZE": "1",
            "SANDBOX_MCP_IDLE_TIMEOUT_S": "10",
            "SANDBOX_MCP_QUEUE_WAIT_S": str(QUEUE_WAIT_S),
        },
    )
    try:
        holder, waiter = await new_users(http, server.base_url, 2)
        assert not (await probe(http, server, holder, write="x"))["is_error"]
        yield server, waiter
    finally:
        stop_server(server)
