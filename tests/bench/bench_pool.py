"""Benchmark: leases and the queue at a pool of 500 with 1,000 waiting keys.

Prints figures, asserts nothing. Uses the production bookkeeping (SqlPoolState on
SQLite in WAL mode, as the embedded default) and real dir slots.

    uv run python tests/bench/bench_pool.py
"""

from __future__ import annotations

import asyncio
import contextlib
import statistics
import tempfile
import time
from pathlib import Path

from pool_fakes import opened

from app.storage.db import create_engine, upgrade_schema
from app.storage.slots.pool_store import SqlPoolState
from pool.leases import Queued, SlotPool
from pool.provision import provision_dir
from pool.slots_dir import DirSlotStore

SIZE, WAITING = 500, 1000


def pct(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


async def main() -> None:
    with tempfile.TemporaryDirectory() as tmp:
        state = Path(tmp)
        await provision_dir(state, SIZE, owner=None)
        engine = create_engine(f"sqlite+aiosqlite:///{state / 'db.sqlite'}")
        await upgrade_schema(engine)
        store = await opened(DirSlotStore(state))
        pool = SlotPool(SqlPoolState(engine), store, size=SIZE, idle_timeout_s=600)
        await pool.open()

        # 1. Taking a free slot (the first call of a key): p50 / p99.
        take: list[float] = []
        for i in range(SIZE):
            started = time.perf_counter()
            await pool.acquire(f"holder-{i}")
            take.append((time.perf_counter() - started) * 1000)

        # 2. A call of a key that already holds its slot (every later tool call).
        again: list[float] = []
        for i in range(2000):
            started = time.perf_counter()
            await pool.acquire(f"holder-{i % SIZE}")
            again.append((time.perf_counter() - started) * 1000)

        # 3. 1,000 keys join the queue, then call again (keeping their place).
        join: list[float] = []
        for i in range(WAITING):
            started = time.perf_counter()
            with contextlib.suppress(Queued):
                await pool.acquire(f"waiter-{i}")
            join.append((time.perf_counter() - started) * 1000)
        requeue: list[float] = []
        for i in range(0, WAITING, 10):
            started = time.perf_counter()
            with contextlib.suppress(Queued):
                await pool.acquire(f"waiter-{i}")
            requeue.append((time.perf_counter() - started) * 1000)

        # 4. Release one by one (slot emptied, handed to the head as a reservation),
        #    and the head claims it: lease + release pairs per second.
        started = time.perf_counter()
        for i in range(SIZE):
            await pool.release(f"holder-{i}")
            await pool.acquire(f"waiter-{i}")
        handover_s = time.perf_counter() - started
        pool.check_invariants()
        await store.close()
        await engine.dispose()

    print(f"pool of {SIZE}, {WAITING} waiting keys, SQLite WAL bookkeeping, dir slots")
    for label, values in (
        ("take a free slot", take),
        ("call with a slot held", again),
        ("join the queue", join),
        ("call again while queued", requeue),
    ):
        print(
            f"{label:<24} p50 {statistics.median(values):.3f} ms   p99 {pct(values, 0.99):.3f} ms"
        )
    print(
        f"release + hand to head + claim: {SIZE / handover_s:.0f} per second "
        f"({handover_s / SIZE * 1000:.2f} ms each, including the dir slot reset)"
    )


if __name__ == "__main__":
    asyncio.run(main())
