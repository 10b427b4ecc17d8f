"""The slot pool through the MCP tools over HTTP: leases, the queue, the watchdog, kill -9."""

from __future__ import annotations

import asyncio
import signal
import time
from pathlib import Path
from urllib.parse import urlsplit

import httpx2
import pytest
from e2e_server import start_server, stop_server
from held_slot import QUEUE_WAIT_S, a_held_slot
from mcp_http import call_tool, post_rpc, probe, read_jsonrpc
from oauth_browser import new_users

pytestmark = pytest.mark.e2e

# The idle timeout also bounds how long a queue place and a reservation last without a
# call: the kill -9 restart below must fit in it (about IDLE_S - 2 s, see there).
IDLE_S = 30
ENV = {
    "SANDBOX_MCP_AUTH": "oauth",
    "SANDBOX_MCP_POOL_SIZE": "2",
    "SANDBOX_MCP_IDLE_TIMEOUT_S": str(IDLE_S),
    "SANDBOX_MCP_QUEUE_WAIT_S": "0",
    "SANDBOX_MCP_SIGNINS_PER_MINUTE": "100",
}


async def test_leases_queue_watchdog_and_a_kill_9_restart(
    http: httpx2.AsyncClient, tmp_path: Path
) -> None:
    state = tmp_path / "state"
    server = start_server(state, probe=True, **ENV)
    port = urlsplit(server.base_url).port
    try:
        a, b, c, d = await new_users(http, server.base_url, 4)

        # Listing tools and sandbox_status take no slot.
        status = (await call_tool(http, server.base_url, a)).json()["result"]["structuredContent"]
        assert status["holds_slot"] is False
        assert status["pool_free"] == 2

        held_a = await probe(http, server, a, write="a.txt")
        held_b = await probe(http, server, b, write="b.txt")
        assert not held_a["is_error"]
        assert not held_b["is_error"]
        assert held_a["slot_root"] != held_b["slot_root"]
        assert held_a["files"] == ["a.txt"]
        assert held_a["idle_expiry_s"] == IDLE_S
        queued_c = await probe(http, server, c)
        queued_d = await probe(http, server, d)
        assert queued_c["is_error"]
        assert queued_c["error"]["code"] == "SANDBOX_QUEUED"
        assert (queued_c["error"]["position"], queued_d["error"]["position"]) == (1, 2)
        assert queued_c["error"]["estimated_wait_s"] > 0

        # A goes quiet. Halfway through its idle time C and D call once (keeping their
        # places); then only B works, until the watchdog empties A and reserves its slot
        # for C, who has not called since: a reservation waiting to be claimed.
        quiet_since = time.monotonic()
        while time.monotonic() - quiet_since < IDLE_S / 2:
            await probe(http, server, b)
            await asyncio.sleep(2)
        assert (await probe(http, server, c))["error"]["position"] == 1
        assert (await probe(http, server, d))["error"]["position"] == 2
        # Driven by the event (the reservation shows on /health), not a fixed wait.
        while time.monotonic() - quiet_since < 3 * IDLE_S:
            await probe(http, server, b)
            health = (await http.get(f"{server.base_url}/health")).json()["pool"]
            if health["reserved"] == 1:
                break
            await asyncio.sleep(1)
        counts = (health["busy"], health["reserved"], health["queued"], health["free"])
        assert counts == (1, 1, 1, 0)
        # D calls once more, as a waiting client does: its place (and B's lease, just
        # used) then lasts a whole idle timeout past the kill, and C's reservation
        # nearly as long; the restart has that long, not what was left of D's
        # half-spent one (about 10 s, too tight on a loaded machine).
        assert (await probe(http, server, d))["error"]["position"] == 1

        server.process.send_signal(signal.SIGKILL)
        server.process.wait(timeout=10)
        killed_at = time.monotonic()
        server = start_server(state, probe=True, port=port, **ENV)

        health = (await http.get(f"{server.base_url}/health")).json()["pool"]
        restart_s = time.monotonic() - killed_at
        assert restart_s < IDLE_S - 2, f"the restart took {restart_s:.0f} s: raise IDLE_S"
        assert (health["busy"], health["reserved"], health["queued"], health["free"]) == (
            1,
            1,
            1,
            0,
        )
        got_c = await probe(http, server, c)
        assert not got_c["is_error"]
        assert got_c["slot_root"] == held_a["slot_root"]
        assert got_c["files"] == [], "the slot was emptied before it was handed on"
        assert any("ready" in note for note in got_c["notes"])
        assert not (await probe(http, server, c))["notes"], "the note is shown once"
        still_b = await probe(http, server, b)
        assert still_b["files"] == ["b.txt"], "B's lease and files survived kill -9"
        assert (await probe(http, server, d))["error"]["position"] == 1
        back_a = await probe(http, server, a)
        assert back_a["error"]["code"] == "SANDBOX_QUEUED"
        assert back_a["error"]["position"] == 2
    finally:
        stop_server(server)


async def test_a_queued_call_waits_with_progress_and_gets_the_freed_slot(
    http: httpx2.AsyncClient, tmp_path: Path
) -> None:
    async with a_held_slot(http, tmp_path / "state", ENV) as (server, waiter):
        started = time.monotonic()
        response = await post_rpc(
            http,
            server.mcp_url,
            "tools/call",
            {"name": "probe_sandbox", "arguments": {}, "_meta": {"progressToken": "queue-1"}},
            token=waiter,
            name="probe_sandbox",
        )
        waited = time.monotonic() - started
        assert "number 1 in the queue" in response.text  # a progress notification
        result = read_jsonrpc(response)["result"]
        assert not result.get("isError"), result
        assert result["structuredContent"]["files"] == [], "the freed slot was emptied first"
        assert any("ready" in note for note in result["structuredContent"]["notes"])
        assert 5 < waited < QUEUE_WAIT_S  # it waited, and got the slot within its wait
