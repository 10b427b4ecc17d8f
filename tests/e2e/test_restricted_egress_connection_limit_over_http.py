"""One restricted experiment cannot take the shared Squid's descriptors from the others.

Squid is one process for every tenant. The firewall chain on the restricted bridge
resets a new connection from a container that already holds ``MAX_CONNECTIONS`` (64)
to the proxy (``connlimit``), and Squid closes a connection that sends no request
within 30 s. Here one tenant's process tries to open 4,200 connections and send
nothing: it holds 64 at most, another tenant's fetch of an allowed name is answered
meanwhile, and the first tenant's next command result says the per-experiment
connection limit was reached.
"""

from __future__ import annotations

import re
from pathlib import Path

import httpx2
import pytest
from e2e_server import start_server, stop_server
from egress_testkit import OutsideWorld, hold, remove_restricted_network
from mcp_http import read_when_written, run_command, tool
from oauth_browser import new_users

from app.egress.connlimit import MAX_CONNECTIONS

pytestmark = pytest.mark.e2e

CONNECTIONS = 4_200
HOLD_S = 60  # the hostile job ends by itself
HOLD = hold(CONNECTIONS, HOLD_S)
FETCH = """python3 - <<'EOF'
import urllib.request
try:
    urllib.request.urlopen("https://pypi.org/simple/tinypkg/", timeout=10).read()
    print("reached")
except Exception as exc:
    print("failed", exc)
EOF"""


async def test_one_experiment_holds_at_most_its_connection_limit_and_others_still_fetch(
    tmp_path: Path, world: OutsideWorld
) -> None:
    server = start_server(
        tmp_path / "state",
        SANDBOX_MCP_AUTH="oauth",
        **world.server_env(),
        SANDBOX_MCP_POOL_SIZE="2",
        SANDBOX_MCP_QUEUE_WAIT_S="0",
    )
    network = None
    try:
        found = re.search(r'"network": "(sandbox-mcp-restricted-[^"]+)"', server.log())
        assert found is not None, server.log()[-2000:]
        network = found[1]
        async with httpx2.AsyncClient(timeout=120) as http:
            mallory, alice = await new_users(http, server.base_url, 2)
            restricted = {"network": "restricted", "egress_allowlist": ["pypi.org"]}
            theirs = await tool(http, server, mallory, "create_experiment", restricted)
            ours = await tool(http, server, alice, "create_experiment", restricted)
            assert not theirs["is_error"], theirs
            assert not ours["is_error"], ours
            before = await run_command(http, server, alice, ours["experiment_id"], FETCH)
            assert before["stdout"].strip() == "reached", before

            job = await run_command(
                http, server, mallory, theirs["experiment_id"], HOLD, background=True
            )
            held = await read_when_written(http, server, mallory, theirs["experiment_id"], "held")
            assert not held["is_error"], held
            print(f"\nmallory holds {held['content']} connections to the proxy")

            during = await run_command(http, server, alice, ours["experiment_id"], FETCH)
            await tool(http, server, mallory, "cancel_job", {"job_id": job["job_id"]})
            assert during["stdout"].strip() == "reached", (
                f"alice's fetch while mallory holds {held['content']} proxy connections: "
                f"{during['stdout']}"
            )
            assert int(held["content"]) <= MAX_CONNECTIONS, held
            # The job's result is the experiment's next one: it says why.
            ended = await tool(
                http, server, mallory, "get_job_result", {"job_id": job["job_id"], "wait_s": 45}
            )
            assert "per-experiment connection limit was reached" in ended["stderr"], ended
            assert "connection limit" not in during["stderr"], during
    finally:
        stop_server(server)
        if network is not None:
            remove_restricted_network(network)
