"""Review 6, finding 5: Squid's access log keeps every line a tenant makes it write, for
as long as that Squid runs, in /run (a tmpfs on most hosts: memory).

The meter counts the log from an offset (app/runtime/egress_meter.py) but never drops
what it counted: the log is emptied only when a new Squid starts (``restart_log``),
and the configuration has ``logfile_rotate 0`` (app/runtime/egress_rules.py). Every
request through the proxy is a line, refused ones too, and refusals cost the tenant
nothing (no byte of the cap): one restricted experiment's loop of refused requests
grows /run/sandbox-mcp/egress-<tag>/log/access.log without bound, for every tenant's
proxy and the host's /run alike.
"""

from __future__ import annotations

import os
import re
from collections.abc import Iterator
from pathlib import Path

import httpx2
import pytest
from e2e_server import start_server, stop_server
from egress_testkit import PYTHON_IMAGE, OutsideWorld, outside_world, remove_restricted_network
from mcp_http import run_command, tool

from app.runtime.egress_squid import SquidFolder, folder_root

pytestmark = pytest.mark.e2e

REQUESTS = 10_000
# Refused requests (a name on no allow-list) as fast as Squid answers them, reusing a
# connection while Squid keeps it open.
FLOOD = f"""python3 - <<'EOF'
import os, socket
from urllib.parse import urlsplit
proxy = urlsplit(os.environ["http_proxy"])
request = b"GET http://refused.test/ HTTP/1.1\\r\\nHost: refused.test\\r\\n\\r\\n"
sent, s = 0, None
while sent < {REQUESTS}:
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


@pytest.fixture(scope="module")
def world(tmp_path_factory: pytest.TempPathFactory) -> Iterator[OutsideWorld]:
    if os.geteuid() != 0:
        pytest.fail("network 'restricted' needs root (iptables, ip netns)")
    with outside_world(tmp_path_factory.mktemp("outside")) as made:
        yield made


async def test_counted_proxy_log_lines_do_not_pile_up(tmp_path: Path, world: OutsideWorld) -> None:
    server = start_server(
        tmp_path / "state",
        SANDBOX_MCP_EGRESS_PROXY="true",
        SANDBOX_MCP_EGRESS_ALLOWLIST="pypi.org",
        SANDBOX_MCP_EGRESS_TEST_HOSTS=world.test_hosts(),
        SANDBOX_MCP_IMAGES=PYTHON_IMAGE,
        SANDBOX_MCP_DEFAULT_IMAGE=PYTHON_IMAGE,
        SANDBOX_MCP_POOL_SIZE="1",
    )
    network = None
    try:
        found = re.search(r'"network": "sandbox-mcp-restricted-([^"]+)"', server.log())
        assert found is not None, server.log()[-2000:]
        network = f"sandbox-mcp-restricted-{found[1]}"
        access_log = SquidFolder(folder_root(found[1])).access_log
        async with httpx2.AsyncClient(timeout=300) as http:
            created = await tool(http, server, "", "create_experiment", {"network": "restricted"})
            assert not created["is_error"], created
            experiment = str(created["experiment_id"])
            before = access_log.stat().st_size
            ran = await run_command(http, server, "", experiment, FLOOD, timeout_s=240)
            assert ran["stdout"].strip() == f"sent {REQUESTS}", ran
            assert "refused" in ran["stderr"], ran  # counted: the notice came back
            grown = access_log.stat().st_size - before
            print(f"\n{grown:,} bytes of log in {ran['duration_s']} s")
        # Every line is counted by now (the command's result read the log to its end);
        # the log should not keep them (a rotation once counted, or a cap).
        assert grown < 256 * 1024, (
            f"the proxy's log grew {grown:,} bytes for {REQUESTS} refused requests of one "
            f"experiment, all counted already, and keeps them in {access_log}"
        )
    finally:
        stop_server(server)
        if network is not None:
            remove_restricted_network(network)
