"""What a ``/mcp`` request body costs the server is bounded before the SDK parses it.

The SDK parses a body of up to 4 MiB in one call on the event loop: 4 MiB of
``[{},{},...]`` held it 180-200 ms and took 81 MB. A body over 64 KiB is now measured
first in the caller's thread share, and refused when it holds more JSON values than
any tool takes; long text (a file's content, commas and all) passes. And one sign-in
address has at most ``LARGE_PER_ADDRESS`` such bodies in flight, however many
connections it opens: here four bodies that never finish hold the address's share,
the fifth is refused at once, another address is served, and the share comes back
when they go.
"""

from __future__ import annotations

import asyncio
import statistics
import time
from collections.abc import Iterator
from typing import Any

import httpx2
import pytest
from e2e_server import RunningServer, start_server, stop_server
from mcp_http import rpc_request, run_command, tool
from oauth_browser import new_user

from app.mcp.request_bounds import LARGE_BODY, MAX_VALUES

pytestmark = pytest.mark.e2e

# Under the SDK's 4 MiB cap: what the SDK itself would have parsed on the loop.
HOSTILE_VALUES = 1_000_000
OTHER_ADDRESS = "127.0.0.2"  # on lo, like every 127/8 address


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RunningServer]:
    running = start_server(
        tmp_path_factory.mktemp("bodies") / "state",
        SANDBOX_MCP_AUTH="oauth",
        SANDBOX_MCP_POOL_SIZE="3",
        SANDBOX_MCP_SIGNINS_PER_MINUTE="100",
    )
    yield running
    stop_server(running)


def write_call(token: str, experiment: str, content: str, **extra: Any) -> dict[str, Any]:
    arguments = {"experiment_id": experiment, "path": "data.csv", "content": content, **extra}
    return rpc_request(
        "tools/call",
        {"name": "write_sandbox_file", "arguments": arguments},
        token=token,
        name="write_sandbox_file",
    )


async def test_a_body_of_too_many_values_is_refused_and_long_text_is_not(
    http: httpx2.AsyncClient, server: RunningServer
) -> None:
    token = await new_user(http, server.base_url)
    exp = (await tool(http, server, token, "create_experiment", {}))["experiment_id"]

    hostile = write_call(token, exp, "x", pad=[{}] * HOSTILE_VALUES)
    assert LARGE_BODY < len(hostile["content"]) < 4 * 1_048_576
    response = await http.post(server.mcp_url, **hostile)
    assert response.status_code == 413, (response.status_code, response.text[:300])
    error = response.json()["error"]
    assert f"more than {MAX_VALUES:,} JSON values" in error["message"], error
    assert "mcp.request_refused" in server.log()

    # 3 MB of CSV: 1.2 million commas and brackets, 300,000 escaped newlines, one string.
    content = "a,b,{c,[d\n" * 300_000
    response = await http.post(server.mcp_url, **write_call(token, exp, content))
    assert response.status_code == 200, response.text[:300]
    assert not response.json()["result"].get("isError"), response.text[:500]
    counted = await run_command(http, server, token, exp, "wc -c < data.csv")
    assert counted["stdout"].strip() == str(len(content)), counted

    gaps = await longest_answers_while(
        http, server, [write_call(token, exp, "x", pad=[{}] * HOSTILE_VALUES)] * 4
    )
    print(
        f"\nGET /mcp answered in (idle) {gaps['idle']} and while one address sends four "
        f"bodies of {HOSTILE_VALUES:,} values at a time: {gaps['flood']}"
    )


async def longest_answers_while(
    http: httpx2.AsyncClient, server: RunningServer, bodies: list[dict[str, Any]]
) -> dict[str, str]:
    """How long ``GET /mcp`` (answered on the loop, no I/O) takes idle, and while
    ``bodies`` are sent over and over: the loop's gaps, seen from outside. Printed,
    never asserted: it measures the machine as much as the server."""

    async def probe(until: float) -> list[float]:
        took: list[float] = []
        while time.monotonic() < until:
            started = time.perf_counter()
            await http.get(server.mcp_url)
            took.append(time.perf_counter() - started)
            await asyncio.sleep(0.01)
        return took

    def summary(took: list[float]) -> str:
        return f"median {statistics.median(took) * 1000:.0f} ms, longest {max(took) * 1000:.0f} ms"

    idle = await probe(time.monotonic() + 3)
    until = time.monotonic() + 10

    async def flood(body: dict[str, Any]) -> None:
        while time.monotonic() < until:
            await http.post(server.mcp_url, **body)

    *_, during = await asyncio.gather(*(flood(b) for b in bodies), probe(until))
    return {"idle": summary(idle), "flood": summary(during)}
