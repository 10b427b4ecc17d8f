"""One tenant floods the server with slow file calls while another reads a small file.

Shared by tests/e2e/test_thread_flood_over_http.py (which asserts) and
tests/bench/bench_thread_flood.py (which prints figures). The slow call is
``search_sandbox`` for a pattern that matches nothing, over a workspace of 2 MB
files of short lines: each search scans until its 10 s budget runs out, in a
worker thread, and holds that thread all the while.
"""

from __future__ import annotations

import asyncio
import os
import statistics
import time
from dataclasses import dataclass, field
from typing import Any

import httpx2
from e2e_server import RunningServer
from mcp_http import run_command, tool
from oauth_browser import new_users

# The server both run: two tenants (signed in from loopback), no queue wait.
SERVER_ENV = {
    "SANDBOX_MCP_AUTH": "oauth",
    "SANDBOX_MCP_POOL_SIZE": "2",
    "SANDBOX_MCP_QUEUE_WAIT_S": "0",
    "SANDBOX_MCP_SIGNINS_PER_MINUTE": "100",
}

# A tenant: its bearer token and its experiment's id.
Tenant = tuple[str, str]

# 24 files of 2 MB (the search's cap a file), 400,000 lines each: more than one
# search gets through in its 10 s budget on this machine.
MAKE_BIG_TREE = (
    "for i in $(seq 1 24); do yes aaaa | head -c 2000000 > big$i.txt || exit 1; done; ls | wc -l"
)


async def mallory_and_alice(
    http: httpx2.AsyncClient, server: RunningServer
) -> tuple[Tenant, Tenant]:
    """The hostile tenant with its big tree, and the honest one with its small file."""
    mallory, alice = await new_users(http, server.base_url, 2)
    hostile = (mallory, await hostile_workspace(http, server, mallory))
    return hostile, (alice, await honest_workspace(http, server, alice))


async def hostile_workspace(http: httpx2.AsyncClient, server: RunningServer, token: str) -> str:
    """An experiment of ``token``'s whose workspace makes every search slow."""
    created = await tool(http, server, token, "create_experiment", {"name": "flood"})
    assert not created["is_error"], created
    experiment = str(created["experiment_id"])
    made = await run_command(http, server, token, experiment, MAKE_BIG_TREE)
    assert (made["status"], made["exit_code"]) == ("completed", 0), made
    return experiment


async def honest_workspace(http: httpx2.AsyncClient, server: RunningServer, token: str) -> str:
    created = await tool(
        http, server, token, "create_experiment", {"files": {"notes.txt": "hello\n"}}
    )
    assert not created["is_error"], created
    return str(created["experiment_id"])


def search(
    http: httpx2.AsyncClient, server: RunningServer, token: str, experiment: str
) -> asyncio.Task[dict[str, Any]]:
    return asyncio.create_task(
        tool(
            http,
            server,
            token,
            "search_sandbox",
            {"experiment_id": experiment, "pattern": "no-such-text"},
        )
    )


async def read_small(
    http: httpx2.AsyncClient, server: RunningServer, token: str, experiment: str
) -> float:
    """Seconds one ``read_sandbox_file`` of a one-line file took."""
    started = time.perf_counter()
    read = await tool(
        http,
        server,
        token,
        "read_sandbox_file",
        {"experiment_id": experiment, "path": "notes.txt"},
    )
    elapsed = time.perf_counter() - started
    assert not read["is_error"], read
    assert read["content"] == "hello\n", read
    return elapsed


def cpu_seconds(pid: int) -> float:
    """User and system CPU time of process ``pid`` so far (Linux /proc)."""
    with open(f"/proc/{pid}/stat") as stat:
        fields = stat.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


async def until_busy(server: RunningServer, cpu_s: float, timeout_s: float = 60) -> None:
    """Wait until the server has burnt ``cpu_s`` more CPU seconds: the flood's calls are
    in its threads (the event that starts the honest reads, not a clock)."""
    start = cpu_seconds(server.process.pid)
    deadline = time.monotonic() + timeout_s
    while cpu_seconds(server.process.pid) - start < cpu_s:
        assert time.monotonic() < deadline, "the flood never reached the server's threads"
        await asyncio.sleep(0.05)


@dataclass
class Flood:
    """The honest reads' latencies while the hostile calls were all still in flight."""

    during: list[float] = field(default_factory=list)
    hostile_done_at_first_read: int = 0
    hostile_results: list[dict[str, Any]] = field(default_factory=list)


async def flood(
    http: httpx2.AsyncClient,
    server: RunningServer,
    hostile: tuple[str, str],
    honest: tuple[str, str],
    *,
    calls: int,
    reads: int,
) -> Flood:
    """``calls`` concurrent hostile searches; honest reads one after the other until
    ``reads`` are done or a hostile call has finished. The hostile calls are
    cancelled (their connections closed) at the end."""
    searches = [search(http, server, *hostile) for _ in range(calls)]
    found = Flood()
    try:
        await until_busy(server, cpu_s=1.0)
        while len(found.during) < reads:
            latency = await read_small(http, server, *honest)
            finished = sum(task.done() for task in searches)
            if not found.during:
                found.hostile_done_at_first_read = finished
            if finished:
                break
            found.during.append(latency)
    finally:
        for task in searches:
            task.cancel()
        results = await asyncio.gather(*searches, return_exceptions=True)
    found.hostile_results = [r for r in results if isinstance(r, dict)]
    return found


def percentiles(latencies: list[float]) -> str:
    if len(latencies) < 2:
        return f"n={len(latencies)} " + " ".join(f"{x * 1000:.0f} ms" for x in latencies)
    cuts = statistics.quantiles(latencies, n=20, method="inclusive")
    return (
        f"n={len(latencies)} p50 {statistics.median(latencies) * 1000:.0f} ms, "
        f"p95 {cuts[18] * 1000:.0f} ms, max {max(latencies) * 1000:.0f} ms"
    )
