"""Benchmark: light-call throughput (``sandbox_status``) with 1, 2 and 3 server processes.

Prints figures, asserts nothing. For each count, that many real servers share one
fresh PostgreSQL database, one state dir and one public URL (as behind a proxy
spreading connections); one user signs in on the first and 16 connections call
``sandbox_status`` with its token, spread evenly over the processes, for a fixed
time. Each call checks the bearer token, reads the pool from the database (it is
shared) and writes an audit row. Each line also gives the CPU time the server
processes spent per call (PostgreSQL's own is not counted): on a loaded machine,
calls/s follow the load, CPU per call much less so.

    source /tmp/dev/env.sh   # SANDBOX_MCP_TEST_POSTGRES_URL
    uv run python tests/bench/bench_workers.py
"""

from __future__ import annotations

import asyncio
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

import httpx2

sys.path.insert(0, str(Path(__file__).parents[1] / "support"))

from db_testkit import fresh_postgres
from e2e_server import RunningServer, free_port, start_server, stop_server
from mcp_http import call_tool
from oauth_browser import ManualClient

sys.path.insert(0, str(Path(__file__).parent))
from bench_light_calls import cpu_seconds

CONNECTIONS = 16
SECONDS = float(os.environ.get("BENCH_SECONDS", "8"))


async def hammer(http: httpx2.AsyncClient, servers: list[RunningServer], token: str) -> str:
    latencies: list[float] = []
    errors = 0
    deadline = time.perf_counter() + SECONDS

    async def worker(server: RunningServer) -> None:
        nonlocal errors
        while time.perf_counter() < deadline:
            started = time.perf_counter()
            response = await call_tool(http, server.base_url, token, "sandbox_status")
            latencies.append(time.perf_counter() - started)
            errors += response.status_code != 200

    pids = [server.process.pid for server in servers]
    started, cpu = time.perf_counter(), sum(map(cpu_seconds, pids))
    await asyncio.gather(*(worker(servers[i % len(servers)]) for i in range(CONNECTIONS)))
    elapsed, cpu = time.perf_counter() - started, sum(map(cpu_seconds, pids)) - cpu
    return (
        f"{len(latencies) / elapsed:7.0f} calls/s  "
        f"servers' CPU {cpu / len(latencies) * 1e6:5.0f} us/call  "
        f"p50 {statistics.median(latencies) * 1000:6.1f} ms  "
        f"p95 {statistics.quantiles(latencies, n=20)[-1] * 1000:6.1f} ms  errors {errors}"
    )


async def measure(http: httpx2.AsyncClient, processes: int) -> str:
    async with fresh_postgres() as url:
        with tempfile.TemporaryDirectory() as tmp:
            ports = [free_port() for _ in range(processes)]
            env = {
                "SANDBOX_MCP_AUTH": "oauth",
                "SANDBOX_MCP_POOL_SIZE": "4",
                "SANDBOX_MCP_LOG_LEVEL": "WARNING",
                "SANDBOX_MCP_DATABASE_URL": url,
                "SANDBOX_MCP_PUBLIC_URL": f"http://127.0.0.1:{ports[0]}",
            }
            servers: list[RunningServer] = []
            try:
                for port in ports:
                    servers.append(start_server(Path(tmp) / "state", port=port, **env))
                client = await ManualClient.register(http, servers[0].base_url)
                token = await client.access_token(http)
                return await hammer(http, servers, token)
            finally:
                for server in servers:
                    stop_server(server)


async def main() -> None:
    limits = httpx2.Limits(max_connections=CONNECTIONS, max_keepalive_connections=CONNECTIONS)
    print(f"os.cpu_count() = {os.cpu_count()}; {CONNECTIONS} connections, {SECONDS:.0f} s each")
    async with httpx2.AsyncClient(timeout=60, limits=limits) as http:
        for processes in (1, 2, 3):
            figures = await measure(http, processes)
            print(
                f"{processes} process{'es' if processes > 1 else '  '}, sandbox_status: {figures}"
            )


if __name__ == "__main__":
    asyncio.run(main())
