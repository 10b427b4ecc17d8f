"""With git egress on, a clone URL that names the host's own network is refused.

Seen: https://169.254.169.254/..., https://10.0.0.5/..., https://127.0.0.1/... and
internal names were cloned from, and git's error lines came back (a port prober).
"""

from __future__ import annotations

import httpx2
import pytest
from e2e_server import RunningServer, Servers
from mcp_http import tool

pytestmark = pytest.mark.e2e


@pytest.fixture(scope="module")
def server(serve_module: Servers) -> RunningServer:
    return serve_module(
        SANDBOX_MCP_ALLOW_GIT_EGRESS="true",
        SANDBOX_MCP_POOL_SIZE="2",
        # The default MAX_EXPERIMENTS: the six refusals below must not use it up.
    )


@pytest.mark.parametrize(
    "url",
    [
        "https://169.254.169.254/latest/meta-data/",
        "https://10.0.0.5/o/r.git",
        "https://127.0.0.1/o/r.git",
        "https://2130706433/o/r.git",
        "https://localhost:8000/o/r.git",
        "https://metadata.google.internal/computeMetadata/v1/",
    ],
)
async def test_a_clone_of_the_hosts_own_network_is_refused(
    http: httpx2.AsyncClient, server: RunningServer, url: str
) -> None:
    created = await tool(http, server, "", "create_experiment", {"git": {"url": url}})
    assert created["is_error"], created
    assert created["error"]["code"] == "GIT_SOURCE_REFUSED"
    message = created["error"]["message"]
    for detail in ("169.254", "10.0.0.5", "127.0.0.1", "Connection", "port 8000"):
        assert detail not in message
    assert "runtime.clone" not in server.log(), "no helper ran"
