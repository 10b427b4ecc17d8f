"""Benchmark: ``execute_experiment("true")`` over HTTP on both exec paths, beside the floor.

    uv run python tests/bench/bench_exec.py [--samples 50]

Two real servers (loopback, OAuth, dir slots, real Docker), one with
``SANDBOX_MCP_EXEC_PATH=auto`` (the container's executor, app/runtime/exec/protocol.py)
and one with ``docker-exec``; in each, one signed-in user and one experiment. In
the same run, samples interleaved (so drift hits all alike), p50 and p95 of:

1. ``execute_experiment("true")`` round trip on the fast path and on ``docker exec``;
2. the floor of the ``docker exec`` path: ``docker exec true`` alone through the SDK,
   in the same container;
3. what the HTTP layer costs by itself: ``sandbox_status`` (a light call: bearer
   check, one audit row) on the same server, the floor of any tool call.

Prints figures, asserts only that every call succeeded.
"""

from __future__ import annotations

import argparse
import asyncio
import sys
import tempfile
import time
from pathlib import Path

import docker
import httpx2

sys.path.insert(0, str(Path(__file__).parent))

from _bench_servers import new_user, pct, server_on
from mcp_http import tool


def line(name: str, values: list[float]) -> str:
    p50, p95 = pct(values, 0.5) * 1000, pct(values, 0.95) * 1000
    return f"  {name:<52} p50 {p50:7.1f} ms   p95 {p95:7.1f} ms"


async def timed(coro_factory) -> float:  # type: ignore[no-untyped-def]
    started = time.perf_counter()
    result = await coro_factory()
    elapsed = time.perf_counter() - started
    assert not result.get("is_error"), result
    return elapsed


async def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--samples", type=int, default=50)
    args = parser.parse_args()
    client = docker.from_env(timeout=120)
    with (
        tempfile.TemporaryDirectory(prefix="bench-exec-") as root,
        server_on("dir", Path(root), 2, SANDBOX_MCP_EXEC_PATH="auto") as fast,
        server_on("dir", Path(root), 2, SANDBOX_MCP_EXEC_PATH="docker-exec") as slow,
    ):
        async with httpx2.AsyncClient(timeout=120) as http:
            servers = {"fast": fast, "docker-exec": slow}
            tokens = {k: await new_user(http, s) for k, s in servers.items()}
            experiments = {}
            for key, server in servers.items():
                created = await tool(http, server, tokens[key], "create_experiment", {})
                assert not created["is_error"], created
                experiments[key] = created["experiment_id"]

            def execute(key: str):  # type: ignore[no-untyped-def]
                return lambda: tool(
                    http,
                    servers[key],
                    tokens[key],
                    "execute_experiment",
                    {"experiment_id": experiments[key], "command": "true"},
                )

            def status(key: str):  # type: ignore[no-untyped-def]
                return lambda: tool(http, servers[key], tokens[key], "sandbox_status", {})

            # Warm-up: the executor starts in the background at create; the first
            # commands may still go through docker exec.
            await asyncio.sleep(1.0)
            for key in servers:
                for _ in range(3):
                    await timed(execute(key))
            found = client.api.containers(
                filters={"label": f"io.sandbox-mcp.experiment={experiments['fast']}"}
            )
            assert len(found) == 1, found
            container = client.containers.get(found[0]["Id"])

            series: dict[str, list[float]] = {
                "fast": [],
                "docker-exec": [],
                "floor": [],
                "status": [],
            }
            for _ in range(args.samples):
                series["fast"].append(await timed(execute("fast")))
                series["docker-exec"].append(await timed(execute("docker-exec")))
                started = time.perf_counter()
                code, _ = await asyncio.to_thread(container.exec_run, "true", user="1000:1000")
                series["floor"].append(time.perf_counter() - started)
                assert code == 0
                series["status"].append(await timed(status("fast")))
    client.close()
    print(f'execute_experiment("true") over HTTP, {args.samples} samples, interleaved')
    print(line("fast path (the container's executor)", series["fast"]))
    print(line("docker exec path", series["docker-exec"]))
    print(line("floor: docker exec true alone (SDK, same container)", series["floor"]))
    print(line("floor of any tool call: sandbox_status", series["status"]))
    fast50 = pct(series["fast"], 0.5)
    print(
        f"  fast path p50 vs docker exec path p50: {fast50 / pct(series['docker-exec'], 0.5):.2f}x"
    )
    print(f"  fast path p50 vs docker exec floor p50: {fast50 / pct(series['floor'], 0.5):.2f}x")
    print(
        f"  fast path p50 minus sandbox_status p50 (the command's own share): "
        f"{(fast50 - pct(series['status'], 0.5)) * 1000:.1f} ms"
    )


if __name__ == "__main__":
    asyncio.run(main())
