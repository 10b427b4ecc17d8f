"""Over HTTP: a tenant's command writing to its container's executor's stderr gets
a bounded number of lines into the server's log (it was one line per write).

The executor (app/runtime/exec/agent.py) runs as the tenant's uid, so a command
can open ``/proc/<executor>/fd/2`` (the docker exec's stderr pipe) and write to it;
every docker stream frame of it became a ``fast_exec.stderr`` line in the server's
log (app/runtime/exec/protocol.py Session._read), rendered on the event loop, with no
bound: the tenant filled the host's log disk and held the loop.
"""

from __future__ import annotations

from pathlib import Path

import httpx2
import pytest
from e2e_server import start_server, stop_server
from mcp_http import run_command, tool
from oauth_browser import new_user

pytestmark = pytest.mark.e2e

WRITES = 5_000
FLOOD = f"""
import os
me, parent = os.getpid(), os.getppid()
executor = None
for p in os.listdir("/proc"):
    if not p.isdigit() or int(p) in (me, parent):
        continue
    try:
        argv = open(f"/proc/{{p}}/cmdline", "rb").read()
    except OSError:
        continue
    if b"smcp-executor" in argv:
        executor = p
assert executor, "no executor found"
fd = os.open(f"/proc/{{executor}}/fd/2", os.O_WRONLY)
for _ in range({WRITES}):
    os.write(fd, b"x")
print("wrote", executor)
"""


async def test_a_tenant_cannot_flood_the_server_log_through_its_executor(tmp_path: Path) -> None:
    server = start_server(
        tmp_path / "state",
        SANDBOX_MCP_AUTH="oauth",
        SANDBOX_MCP_POOL_SIZE="1",
        SANDBOX_MCP_QUEUE_WAIT_S="0",
    )
    try:
        async with httpx2.AsyncClient(timeout=120) as http:
            mallory = await new_user(http, server.base_url)
            created = await tool(
                http, server, mallory, "create_experiment", {"files": {"flood.py": FLOOD}}
            )
            assert not created["is_error"], created
            experiment = str(created["experiment_id"])
            warm = await run_command(http, server, mallory, experiment, "true")
            assert warm["status"] == "completed", warm
            done = await run_command(http, server, mallory, experiment, "python3 flood.py")
            assert (done["status"], done["exit_code"]) == ("completed", 0), done
            health = await http.get(f"{server.base_url}/health")
            assert health.status_code == 200
        logged = server.log().count("fast_exec.stderr")
        # 5,000 bytes of the tenant's should cost the server's log a bounded number of
        # lines (a rate limit or a summary), not one per write.
        assert logged <= 100, f"{logged} server log lines for {WRITES} one-byte writes"
    finally:
        stop_server(server)
