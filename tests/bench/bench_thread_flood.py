"""Benchmark: a tenant's small reads while another tenant floods the worker threads.

Prints figures, asserts nothing. One real server (loopback, OAuth, real Docker), two
tenants. The hostile one keeps ``HOSTILE_CALLS`` slow searches in flight for
``FLOOD_S`` seconds (a new one for each that ends; see tests/support/thread_flood.py);
the honest one reads a one-line file, one read after the other, measured twice in
the same run:

1. alone (the floor);
2. during the flood.

    uv run python tests/bench/bench_thread_flood.py
"""

from __future__ import annotations

import asyncio
import sys
import tempfile
import time
from pathlib import Path

import httpx2

sys.path.insert(0, str(Path(__file__).parents[1] / "support"))

from e2e_server import RunningServer, start_server, stop_server
from thread_flood import (
    SERVER_ENV,
    mallory_and_alice,
    percentiles,
    read_small,
    search,
    until_busy,
)

HOSTILE_CALLS = 12
FLOOD_S = 30.0
FLOOR_READS = 50


async def sustained_flood(
    http: httpx2.AsyncClient, server: RunningServer, hostile: tuple[str, str], stop: asyncio.Event
) -> int:
    """Keep HOSTILE_CALLS searches in flight until ``stop``; how many finished."""
    running = {search(http, server, *hostile) for _ in range(HOSTILE_CALLS)}
    finished = 0
    while not stop.is_set():
        stopping = asyncio.create_task(stop.wait())
        done, _ = await asyncio.wait(running | {stopping}, return_when=asyncio.FIRST_COMPLETED)
        stopping.cancel()
        for task in done - {stopping}:
            running.discard(task)
            finished += 1
            running.add(search(http, server, *hostile))
    for task in running:
        task.cancel()
    await asyncio.gather(*running, return_exceptions=True)
    return finished


async def main() -> None:
    with tempfile.TemporaryDirectory() as tmp:
        server = start_server(Path(tmp) / "state", **SERVER_ENV)
        try:
            async with httpx2.AsyncClient(timeout=120) as http:
                hostile, honest = await mallory_and_alice(http, server)

                floor = [await read_small(http, server, *honest) for _ in range(FLOOR_READS)]

                stop = asyncio.Event()
                flooding = asyncio.create_task(sustained_flood(http, server, hostile, stop))
                await until_busy(server, cpu_s=1.0)
                during: list[float] = []
                deadline = time.monotonic() + FLOOD_S
                while time.monotonic() < deadline:
                    during.append(await read_small(http, server, *honest))
                stop.set()
                searches = await flooding
        finally:
            stop_server(server)
    print(f"honest read, alone (floor):           {percentiles(floor)}")
    print(f"honest read, {HOSTILE_CALLS} hostile searches in flight: {percentiles(during)}")
    print(f"hostile searches finished in {FLOOD_S:.0f} s: {searches}")


if __name__ == "__main__":
    asyncio.run(main())
