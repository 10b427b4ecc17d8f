"""Benchmark: honest tenants beside hostile ones, against a run without the hostile ones.

Prints figures, asserts nothing. One real server (loopback, OAuth, real Docker),
20 honest tenants each running a normal session (create an experiment, write a
file, run a command, search, read), measured twice in the same run:

1. alone (the floor);
2. while 20 hostile tenants attack: catastrophic regexes and globs, background-job
   floods, commands printing megabytes, junk sign-in POSTs and empty registrations.

For each run: the honest calls' p50, p95 and p99 latencies, their error count, and
the attackers' calls refused and accepted.

    uv run python tests/bench/bench_fairness.py
"""

from __future__ import annotations

import asyncio
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import httpx2

sys.path.insert(0, str(Path(__file__).parents[1] / "support"))

from e2e_server import RunningServer, start_server, stop_server
from mcp_http import tool
from oauth_browser import ManualClient

HONEST = 20
HOSTILE = 20
ROUNDS = 3  # sessions per honest tenant and run
ATTACK_S = 60.0  # at most; the attackers stop when the honest tenants are done

REDOS = "(a+)+$"
GLOB_BOMB = "*a*a*a*a*a*a*a*a*a*a*b"


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


async def timed(
    http: httpx2.AsyncClient, server: RunningServer, token: str, name: str, args: dict[str, Any]
) -> tuple[float, dict[str, Any]]:
    started = time.perf_counter()
    try:
        result = await tool(http, server, token, name, args)
    except (AssertionError, httpx2.HTTPError) as exc:
        result = {"is_error": True, "error": {"code": type(exc).__name__}}
    return time.perf_counter() - started, result


async def honest_session(
    http: httpx2.AsyncClient, server: RunningServer, token: str, latencies: list[float]
) -> int:
    """One normal session; returns how many of its calls failed."""
    errors = 0
    seconds, created = await timed(
        http, server, token, "create_experiment", {"files": {"app.py": "print('hi')\n"}}
    )
    latencies.append(seconds)
    if created.get("is_error"):
        return 1
    exp = created["experiment_id"]
    steps: list[tuple[str, dict[str, Any]]] = [
        ("write_sandbox_file", {"experiment_id": exp, "path": "notes.txt", "content": "a\n" * 50}),
        ("execute_experiment", {"experiment_id": exp, "command": "python3 app.py"}),
        ("search_sandbox", {"experiment_id": exp, "pattern": "print"}),
        ("read_sandbox_file", {"experiment_id": exp, "path": "notes.txt"}),
        ("sandbox_status", {}),
        ("destroy_experiment", {"experiment_id": exp}),
    ]
    for name, args in steps:
        seconds, result = await timed(http, server, token, name, args)
        latencies.append(seconds)
        errors += bool(result.get("is_error"))
    return errors


async def attacker(
    http: httpx2.AsyncClient,
    server: RunningServer,
    token: str,
    n: int,
    stop: asyncio.Event,
    tally: dict[str, int],
) -> None:
    """One hostile tenant: an experiment, then attacks in turn until told to stop."""
    _, created = await timed(
        http,
        server,
        token,
        "create_experiment",
        {"files": {"bomb.txt": "a" * 5000 + "!\n", ("a" * 120) + ".txt": "x"}},
    )
    if created.get("is_error"):
        tally["refused"] += 1
        return
    exp = created["experiment_id"]
    attacks: list[tuple[str, dict[str, Any]]] = [
        ("search_sandbox", {"experiment_id": exp, "pattern": REDOS}),
        ("collect_artifacts", {"experiment_id": exp, "patterns": [GLOB_BOMB]}),
        ("execute_experiment", {"experiment_id": exp, "command": "sleep 30", "background": True}),
        (
            "execute_experiment",
            {"experiment_id": exp, "command": "head -c 5000000 /dev/zero | tr '\\0' a"},
        ),
    ]
    turn = n
    while not stop.is_set():
        name, args = attacks[turn % len(attacks)]
        turn += 1
        _, result = await timed(http, server, token, name, args)
        tally["refused" if result.get("is_error") else "accepted"] += 1


async def junk(
    http: httpx2.AsyncClient, server: RunningServer, stop: asyncio.Event, tally: dict[str, int]
) -> None:
    """Sign-in POSTs without a transaction, and empty registrations, back to back."""
    while not stop.is_set():
        for response in await asyncio.gather(
            http.post(f"{server.base_url}/authorize", data={"tx": "x", "csrf": "y"}),
            http.post(f"{server.base_url}/register", json={}),
            return_exceptions=True,
        ):
            if isinstance(response, BaseException):
                tally["junk_failed"] += 1
            else:
                tally["junk_sent"] += 1


async def run(server: RunningServer, honest: list[str], hostile: list[str] | None) -> None:
    latencies: list[float] = []
    tally = {"refused": 0, "accepted": 0, "junk_sent": 0, "junk_failed": 0}
    stop = asyncio.Event()
    limits = httpx2.Limits(max_connections=200)
    async with httpx2.AsyncClient(timeout=120, limits=limits) as http:
        attackers = [
            asyncio.create_task(attacker(http, server, token, n, stop, tally))
            for n, token in enumerate(hostile or [])
        ]
        if hostile:
            attackers.append(asyncio.create_task(junk(http, server, stop, tally)))
            await asyncio.sleep(3)  # let the attack start first
        started = time.perf_counter()

        async def tenant(token: str) -> int:
            return sum(
                [await honest_session(http, server, token, latencies) for _ in range(ROUNDS)]
            )

        errors = sum(
            await asyncio.wait_for(asyncio.gather(*(tenant(t) for t in honest)), ATTACK_S * 5)
        )
        elapsed = time.perf_counter() - started
        stop.set()
        await asyncio.gather(*attackers, return_exceptions=True)
    label = "with 20 attackers" if hostile else "alone (floor)"
    print(
        f"{label:18s}: {len(latencies)} honest calls in {elapsed:.1f} s, errors {errors}; "
        f"p50 {statistics.median(latencies) * 1000:.0f} ms, "
        f"p95 {percentile(latencies, 0.95) * 1000:.0f} ms, "
        f"p99 {percentile(latencies, 0.99) * 1000:.0f} ms"
    )
    if hostile:
        print(
            f"{'':18s}  attackers: {tally['refused']} calls refused, {tally['accepted']} "
            f"accepted; {tally['junk_sent']} junk sign-ins/registrations sent"
        )


async def main() -> None:
    with tempfile.TemporaryDirectory() as tmp:
        server = start_server(
            Path(tmp) / "state",
            SANDBOX_MCP_AUTH="oauth",
            SANDBOX_MCP_POOL_SIZE=str(HONEST + HOSTILE + 4),
            SANDBOX_MCP_SIGNINS_PER_MINUTE="1000",
            SANDBOX_MCP_SANDBOXES_PER_ADDRESS="1000",
            SANDBOX_MCP_NEW_SANDBOXES_PER_HOUR="10000",
            SANDBOX_MCP_REGISTRATIONS_PER_MINUTE="1000",
        )
        try:
            async with httpx2.AsyncClient(timeout=60) as http:
                client = await ManualClient.register(http, server.base_url)
                tokens = [await client.access_token(http) for _ in range(HONEST + HOSTILE)]
            honest, hostile = tokens[:HONEST], tokens[HONEST:]
            await run(server, honest, None)
            await run(server, honest, hostile)
        finally:
            stop_server(server)


if __name__ == "__main__":
    asyncio.run(main())
