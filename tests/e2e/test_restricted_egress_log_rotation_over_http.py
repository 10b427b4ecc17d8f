"""Squid's access log (in /run: memory on most hosts) does not keep the lines once counted.

Every request through the shared proxy is a line, refused ones too, and refusals cost
the tenant nothing of its byte cap. Once the counted part of the log is past
``SANDBOX_MCP_EGRESS_LOG_ROTATE_BYTES``, the meter moves it aside under the folder's
lock, Squid reopens a new one, and the rest of the old one is counted before it is
removed. Here one restricted experiment makes 10,000 refused requests (about 800 KB
of log) with the threshold at 64 KiB: the log folder ends small, and the experiment's
recorded refusals are exactly 10,000 (no line lost or counted twice across the
rotations).
"""

from __future__ import annotations

import asyncio
import re
import time
from pathlib import Path

import httpx2
import pytest
from e2e_server import start_server, stop_server
from egress_testkit import (
    OutsideWorld,
    remove_restricted_network,
    restricted_network_of,
    restricted_server,
    usage_lines_of,
)
from mcp_http import run_command, tool
from oauth_browser import new_user
from stated_limits import stated

from app.egress.squid import SquidFolder, folder_root

pytestmark = pytest.mark.e2e

REQUESTS = 10_000
ROTATE_BYTES = 64 * 1024


# Refused requests (a name on no allow-list) as fast as Squid answers them, reusing a
# connection while Squid keeps it open.
def flood(requests: int) -> str:
    """A command making ``requests`` refused requests; it prints how many it sent."""
    return f"""python3 - <<'EOF'
import os, socket
from urllib.parse import urlsplit
proxy = urlsplit(os.environ["http_proxy"])
request = b"GET http://refused.test/ HTTP/1.1\\r\\nHost: refused.test\\r\\n\\r\\n"
sent, s = 0, None
while sent < {requests}:
    if s is None:
        s = socket.create_connection((proxy.hostname, proxy.port), timeout=5)
        f = s.makefile("rb")
    try:
        s.sendall(request)
        status = f.readline()
        length, close = 0, False
        while (line := f.readline()) not in (b"\\r\\n", b""):
            name, _, value = line.partition(b":")
            if name.lower() == b"content-length":
                length = int(value)
            if name.lower() == b"connection" and b"close" in value.lower():
                close = True
        f.read(length)
        sent += 1
        if close or not status:
            s.close(); s = None
    except OSError:
        s.close(); s = None
print("sent", sent)
EOF"""


FLOOD = flood(REQUESTS)


def log_folder_bytes(folder: SquidFolder) -> int:
    """The access log and the one moved aside, if any."""
    return sum(
        path.stat().st_size for path in (folder.access_log, folder.rotated_log) if path.exists()
    )


async def test_counted_proxy_log_is_rotated_without_losing_a_line(
    tmp_path: Path, world: OutsideWorld
) -> None:
    server = start_server(
        tmp_path / "state",
        **world.server_env(),
        SANDBOX_MCP_POOL_SIZE="1",
        SANDBOX_MCP_EGRESS_LOG_ROTATE_BYTES=str(ROTATE_BYTES),
    )
    network = None
    try:
        found = re.search(r'"network": "sandbox-mcp-restricted-([^"]+)"', server.log())
        assert found is not None, server.log()[-2000:]
        network = f"sandbox-mcp-restricted-{found[1]}"
        folder = SquidFolder(folder_root(found[1]))
        async with httpx2.AsyncClient(timeout=300) as http:
            created = await tool(http, server, "", "create_experiment", {"network": "restricted"})
            assert not created["is_error"], created
            experiment = str(created["experiment_id"])
            ran = await run_command(http, server, "", experiment, FLOOD, timeout_s=240)
            assert ran["stdout"].strip() == f"sent {REQUESTS}", ran
            assert "refused" in ran["stderr"], ran  # counted: the notice came back
            # Every line is counted by now (the result read the log to its end); the
            # part moved aside goes at the meter's next poll (every second).
            deadline = time.monotonic() + 20
            while (size := log_folder_bytes(folder)) >= ROTATE_BYTES * 2:
                if time.monotonic() > deadline:
                    break
                await asyncio.sleep(0.2)
            print(f"\n{size:,} bytes of log after {REQUESTS} refusals in {ran['duration_s']} s")
            assert size < ROTATE_BYTES * 2, (
                f"the proxy's log holds {size:,} bytes after {REQUESTS} refused requests "
                f"of one experiment, all counted already ({folder.access_log}); "
                f"{sorted((p.name, p.stat().st_size) for p in folder.access_log.parent.iterdir())}"
                f", meter {folder.read_json(folder.meter).get('offset')}"
                f"/{folder.read_json(folder.meter).get('aside')}"
            )
            await tool(http, server, "", "destroy_experiment", {"experiment_id": experiment})
        recorded = await usage_lines_of(server, experiment)
        assert recorded, server.log()[-3000:]
        refused = re.search(r'"refused": (\d+)', recorded[0])
        assert refused is not None, recorded[0]
        assert int(refused[1]) == REQUESTS, recorded[0]
        assert "egress.log_rotated" in server.log()
    finally:
        stop_server(server)
        if network is not None:
            remove_restricted_network(network)


async def test_the_log_is_rotated_at_the_documented_default(
    tmp_path: Path, world: OutsideWorld
) -> None:
    """EGRESS_LOG_ROTATE_BYTES as shipped (docs/limits.md: 4 MiB): a log of counted lines
    just under it stays where it is; past it, it is moved aside."""
    threshold = stated("EGRESS_LOG_ROTATE_BYTES")
    with restricted_server(tmp_path / "state", world, SANDBOX_MCP_POOL_SIZE="1") as server:
        tag = restricted_network_of(server).rsplit("-", 1)[-1]
        folder = SquidFolder(folder_root(tag))
        async with httpx2.AsyncClient(timeout=300) as http:
            token = await new_user(http, server.base_url)
            restricted = {"network": "restricted"}
            created = await tool(http, server, token, "create_experiment", restricted)
            assert not created["is_error"], created
            experiment = str(created["experiment_id"])

            async def send(requests: int) -> None:
                # In batches the size of the test above, each within one synchronous call.
                for batch in [REQUESTS] * (requests // REQUESTS) + [requests % REQUESTS]:
                    ran = await run_command(http, server, token, experiment, flood(batch))
                    assert ran["stdout"].strip() == f"sent {batch}", ran

            await send(1_000)  # how long one line is, in this log
            line = folder.access_log.stat().st_size / 1_000
            await send(int(threshold * 0.9 / line) - 1_000)
            under = folder.access_log.stat().st_size
            await asyncio.sleep(3)  # three of the meter's polls: every line is counted
            assert "egress.log_rotated" not in server.log(), f"rotated at {under:,} bytes"
            assert threshold * 0.85 < under < threshold, (under, threshold)
            await send(int(threshold * 0.2 / line))
            for _ in range(300):  # the meter's next polls, every second (60 s at most)
                if "egress.log_rotated" in server.log():
                    break
                await asyncio.sleep(0.2)
            print(f"\nnot rotated at {under:,} bytes; rotated past {threshold:,}")
            assert "egress.log_rotated" in server.log()
