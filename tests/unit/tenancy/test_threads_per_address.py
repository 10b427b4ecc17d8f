"""One address's sandboxes share a bound on the tenant threads.

The worker threads are shared per sandbox key (THREADS_PER_SANDBOX, 2) under one total
(TENANT_THREADS, 16), but one address may hold SANDBOXES_PER_ADDRESS (20) live
sandboxes: without a bound of their own, eight of its sandboxes, each running two slow
searches (10 s each, and a cancelled search keeps its thread until it returns), held
all sixteen, so every other tenant's file call waited behind them, round after round.
THREADS_PER_ADDRESS (8) bounds them together.
"""

from __future__ import annotations

import asyncio
import threading

from app.settings.auth import AuthSettings
from app.settings.mcp import McpSettings
from app.tenancy.threads import TenantThreads

WAIT_S = 10.0


class Gates:
    """Blocking calls that record their start and return once released (all at once)."""

    def __init__(self) -> None:
        self.started: list[str] = []
        self._lock = threading.Lock()
        self.go = threading.Event()
        self._changed = asyncio.Event()
        self._loop = asyncio.get_running_loop()

    def call(self, name: str):  # type: ignore[no-untyped-def]
        def blocking() -> str:
            with self._lock:
                self.started.append(name)
            self._loop.call_soon_threadsafe(self._changed.set)
            assert self.go.wait(WAIT_S), f"{name} was never released"
            return name

        return blocking

    async def until(self, done) -> None:  # type: ignore[no-untyped-def]
        async with asyncio.timeout(WAIT_S):
            while not done():
                self._changed.clear()
                await self._changed.wait()


async def test_one_address_s_sandboxes_cannot_hold_every_tenant_thread() -> None:
    mcp, auth = McpSettings(), AuthSettings()
    threads = TenantThreads(
        total=mcp.tenant_threads,
        per_sandbox=mcp.threads_per_sandbox,
        per_address=mcp.threads_per_address,
    )
    gates = Gates()
    # One address's sandboxes, as many as it may hold, two slow calls each.
    hostile = [
        asyncio.create_task(threads.run_as(f"mallory-{s}", "203.0.113.7", gates.call(f"m{s}.{c}")))
        for s in range(auth.sandboxes_per_address)
        for c in range(mcp.threads_per_sandbox)
    ]
    await gates.until(lambda: len(gates.started) >= mcp.threads_per_address)
    # Signed in from another address, or with none (local mode): either gets a thread.
    others = [
        asyncio.create_task(threads.run_as("alice", "198.51.100.1", gates.call("alice"))),
        asyncio.create_task(threads.run("bob", gates.call("bob"))),
    ]
    try:
        await gates.until(lambda: {"alice", "bob"} <= set(gates.started))
        mallory = [name for name in gates.started if name.startswith("m")]
        assert len(mallory) == mcp.threads_per_address, "one address: its bound, no more"
        assert threads.busy() == mcp.threads_per_address + 2
        assert threads.addresses() == 2
    finally:
        gates.go.set()
        async with asyncio.timeout(WAIT_S):
            results = await asyncio.gather(*hostile, *others, return_exceptions=True)
    assert not [r for r in results if isinstance(r, BaseException)]
    assert threads.addresses() == 0, "no limiter is kept for an address with no calls"
    assert threads.sandboxes() == 0


def test_the_shares_must_nest() -> None:
    import pytest

    with pytest.raises(ValueError, match="per_sandbox <= per_address <= total"):
        TenantThreads(total=8, per_sandbox=2, per_address=16)
    with pytest.raises(ValueError, match="per_sandbox <= per_address <= total"):
        TenantThreads(total=8, per_sandbox=4, per_address=2)
