"""No tenant may hold the shared worker threads: a flood of slow file calls from one
tenant leaves another tenant's small read waiting behind nothing.

The file tools used to run on the event loop's default executor (6 threads on two
cores): a dozen concurrent searches from one tenant held every thread, and the
other tenant's ``read_sandbox_file`` queued behind them until searches finished.
Now a sandbox runs at most ``THREADS_PER_SANDBOX`` calls at once and the rest of
its calls wait their turn, so the honest read must come back while every hostile
call is still in flight (the order of events is checked, not a time).
"""

from __future__ import annotations

from pathlib import Path

import httpx2
import pytest
from e2e_server import RunningServer, start_server, stop_server
from mcp_http import tool
from thread_flood import SERVER_ENV, flood, mallory_and_alice, percentiles

pytestmark = pytest.mark.e2e

HOSTILE_CALLS = 12


async def test_a_flood_of_slow_searches_does_not_hold_another_tenant_s_read(
    tmp_path: Path,
) -> None:
    server = start_server(tmp_path / "state", **SERVER_ENV)
    try:
        async with httpx2.AsyncClient(timeout=120) as http:
            hostile, honest = await mallory_and_alice(http, server)

            found = await flood(http, server, hostile, honest, calls=HOSTILE_CALLS, reads=5)

            print(f"\nhonest reads during the flood: {percentiles(found.during)}")
            assert found.hostile_done_at_first_read == 0, (
                f"alice's read waited until {found.hostile_done_at_first_read} of mallory's "
                f"{HOSTILE_CALLS} searches had finished"
            )
            assert found.during, "no honest read came back while the flood was in flight"
            # The hostile calls that did finish were served, not refused: they waited
            # their turn.
            assert all(not r["is_error"] for r in found.hostile_results), found.hostile_results
            # Cancelled (the client went away), their places come back: alice's next
            # read and mallory's next call are served.
            assert await tool_ok(http, server, *hostile)
    finally:
        stop_server(server)


async def tool_ok(
    http: httpx2.AsyncClient, server: RunningServer, token: str, experiment: str
) -> bool:
    listed = await tool(http, server, token, "list_sandbox_files", {"experiment_id": experiment})
    return not listed["is_error"] and len(listed["entries"]) == 24
