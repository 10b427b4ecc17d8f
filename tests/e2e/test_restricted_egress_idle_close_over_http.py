"""Squid closes a connection that sends no request, or idles after one, at the time the
docs state (docs/egress.md, docs/limits.md: 30 seconds, `request_start_timeout` and
`client_idle_pconn_timeout`), measured from inside a restricted experiment through the
real proxy.

Each such connection holds one of the descriptors every tenant shares; the firewall
bounds how many one container opens (test_restricted_egress_connection_limit_over_http),
and this bound is how long each one may sit unused.
"""

from __future__ import annotations

from pathlib import Path

import httpx2
import pytest
from egress_testkit import OutsideWorld, restricted_server
from mcp_http import run_command, tool
from oauth_browser import new_user
from stated_limits import stated

pytestmark = pytest.mark.e2e

EGRESS_PAGE = Path(__file__).parents[2] / "docs" / "egress.md"

# Two connections at once: one that never sends, one idle after a refused request
# (Squid answers it and keeps the connection). Each prints how long Squid kept it.
IDLE = """python3 - <<'EOF'
import os, socket, threading, time
from urllib.parse import urlsplit
proxy = urlsplit(os.environ["http_proxy"])
def kept(send):
    s = socket.create_connection((proxy.hostname, proxy.port), timeout=120)
    f = s.makefile("rb")
    if send:
        s.sendall(b"GET http://refused.test/ HTTP/1.1\\r\\nHost: refused.test\\r\\n\\r\\n")
        length = 0
        while (line := f.readline()) not in (b"\\r\\n", b""):
            if line.lower().startswith(b"content-length:"):
                length = int(line.split(b":")[1])
        f.read(length)
    started = time.monotonic()
    rest = f.read()  # until Squid closes it
    took = round(time.monotonic() - started, 2)
    print("after-request" if send else "no-request", took, len(rest))
threads = [threading.Thread(target=kept, args=(send,)) for send in (False, True)]
[t.start() for t in threads]
[t.join() for t in threads]
EOF"""


async def test_an_unused_connection_is_closed_at_the_documented_time(
    tmp_path: Path, world: OutsideWorld
) -> None:
    no_request = stated("request_start_timeout", EGRESS_PAGE)
    idle = stated("client_idle_pconn_timeout", EGRESS_PAGE)
    with restricted_server(tmp_path / "state", world, SANDBOX_MCP_POOL_SIZE="1") as server:
        async with httpx2.AsyncClient(timeout=120) as http:
            token = await new_user(http, server.base_url)
            made = await tool(http, server, token, "create_experiment", {"network": "restricted"})
            assert not made["is_error"], made
            job = await run_command(
                http, server, token, made["experiment_id"], IDLE, background=True
            )
            ended = job
            for _ in range(4):  # each wait returns within 45 s; the connections close in ~30
                ended = await tool(
                    http, server, token, "get_job_result", {"job_id": job["job_id"], "wait_s": 45}
                )
                if ended["status"] != "running":
                    break
            assert ended["exit_code"] == 0, ended
            kept = {
                line.split()[0]: float(line.split()[1]) for line in ended["stdout"].splitlines()
            }
            print(f"\nSquid kept {kept} (documented: {no_request} s, {idle} s)")
            # Squid checks its timeouts about once a second: never early, at most a
            # few seconds late on a loaded machine.
            assert no_request - 1 <= kept["no-request"] <= no_request + 10, kept
            assert idle - 1 <= kept["after-request"] <= idle + 10, kept
