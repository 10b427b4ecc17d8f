"""Benchmark: light tool calls per second, beside the bare SDK's floor in the same run.

Prints figures, asserts nothing. 16 connections call for a fixed time (bounded):

1. the bare SDK server (``_bare_sdk_server.py``: one echo tool, no auth, no audit);
2. our server, ``sandbox_status`` with a bearer token (identity, audit row, metrics).

Each line also gives the server process's CPU time per call (user + system, from
``/proc``): on a machine shared with other work, calls/s follow the load, the CPU a
call costs the server much less so. Both servers run the same uvicorn (h11, one
process, the default asyncio loop).

    uv run python tests/bench/bench_light_calls.py

2026-12-06, beside a loaded CI run (load 9-12; bench_light_calls_wrk.py has the wrk
figures of the same session): before (a705c0c) bare 565, ours 373 calls/s (0.66);
after (188aa58) bare 489, ours 409 calls/s (0.84); server CPU 1311 -> 1304 us a call.
13:27, load 3-6, one after the other: before (a3424b8) bare 996, ours 652 calls/s
(0.65), server CPU 871 and 1449 us a call; after (2185d16, light calls in one exchange)
bare 909, ours 870 calls/s (0.96), server CPU 973 and 938 us a call.
"""

from __future__ import annotations

import asyncio
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import httpx2

sys.path.insert(0, str(Path(__file__).parents[1] / "support"))

from e2e_server import free_port, start_server, stop_server
from mcp_http import call_tool
from oauth_browser import ManualClient

CONNECTIONS = 16
SECONDS = 8.0


def cpu_seconds(pid: int) -> float:
    """User + system CPU time of process ``pid`` so far (Linux ``/proc``)."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


async def hammer(call: object, label: str, pid: int) -> None:
    latencies: list[float] = []
    deadline = time.perf_counter() + SECONDS
    errors = 0

    async def worker() -> None:
        nonlocal errors
        while time.perf_counter() < deadline:
            started = time.perf_counter()
            response = await call()  # type: ignore[operator]
            latencies.append(time.perf_counter() - started)
            errors += response.status_code != 200

    started, cpu = time.perf_counter(), cpu_seconds(pid)
    await asyncio.gather(*(worker() for _ in range(CONNECTIONS)))
    elapsed, cpu = time.perf_counter() - started, cpu_seconds(pid) - cpu
    print(
        f"{label:38s} {len(latencies) / elapsed:7.0f} calls/s  "
        f"p50 {statistics.median(latencies) * 1000:5.1f} ms  "
        f"server CPU {cpu / len(latencies) * 1e6:5.0f} us/call  errors {errors}"
    )


def start_bare(port: int) -> subprocess.Popen[bytes]:
    script = Path(__file__).with_name("_bare_sdk_server.py")
    return subprocess.Popen([sys.executable, str(script), str(port)])


async def bare_floor(http: httpx2.AsyncClient) -> None:
    port = free_port()
    process = await asyncio.to_thread(start_bare, port)
    try:
        url = f"http://127.0.0.1:{port}/mcp"
        for _ in range(100):
            try:
                await http.get(f"http://127.0.0.1:{port}/")
                break
            except httpx2.TransportError:
                await asyncio.sleep(0.1)

        async def call() -> httpx2.Response:
            return await http.post(
                url,
                json={
                    "jsonrpc": "2.0",
                    "id": 1,
                    "method": "tools/call",
                    "params": {
                        "name": "echo",
                        "arguments": {"text": "hi"},
                        "_meta": {
                            "io.modelcontextprotocol/protocolVersion": "2026-07-28",
                            "io.modelcontextprotocol/clientCapabilities": {},
                        },
                    },
                },
                headers={
                    "accept": "application/json, text/event-stream",
                    "mcp-protocol-version": "2026-07-28",
                    "mcp-method": "tools/call",
                    "mcp-name": "echo",
                },
            )

        await hammer(call, "bare SDK server, echo (floor)", process.pid)
    finally:
        process.terminate()
        await asyncio.to_thread(process.wait, 10)


async def main() -> None:
    limits = httpx2.Limits(max_connections=CONNECTIONS, max_keepalive_connections=CONNECTIONS)
    async with httpx2.AsyncClient(timeout=60, limits=limits) as http:
        await bare_floor(http)
        with tempfile.TemporaryDirectory() as tmp:
            server = start_server(
                Path(tmp) / "state",
                SANDBOX_MCP_AUTH="oauth",
                SANDBOX_MCP_POOL_SIZE="4",
                SANDBOX_MCP_LOG_LEVEL="WARNING",
            )
            try:
                client = await ManualClient.register(http, server.base_url)
                token = await client.access_token(http)

                async def call() -> httpx2.Response:
                    return await call_tool(http, server.base_url, token, "sandbox_status")

                await hammer(call, "sandbox-mcp, sandbox_status + bearer", server.process.pid)
            finally:
                stop_server(server)


if __name__ == "__main__":
    asyncio.run(main())
