"""TenantThreads: a sandbox's share of the worker threads, on real threads.

Every wait is on an event (a thread's ``threading.Event``, a task's state), never
on a wall-clock window: the calls block in their threads until the test lets them go.
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Callable

import pytest

from app.tenancy.threads import TenantThreads

WAIT_S = 10.0  # a generous bound on an event that should come at once


class Gates:
    """Blocking calls that say when they start and return when released."""

    def __init__(self) -> None:
        self.started: list[str] = []
        self._lock = threading.Lock()
        self._release: dict[str, threading.Event] = {}
        self._changed = asyncio.Event()
        self._loop = asyncio.get_running_loop()

    def call(self, name: str) -> Callable[[], str]:
        release = self._release.setdefault(name, threading.Event())

        def blocking() -> str:
            with self._lock:
                self.started.append(name)
            self._loop.call_soon_threadsafe(self._changed.set)
            assert release.wait(WAIT_S), f"{name} was never released"
            return name

        return blocking

    def release(self, name: str) -> None:
        self._release[name].set()

    async def until_started(self, count: int) -> None:
        async def wait() -> None:
            while len(self.started) < count:
                self._changed.clear()
                await self._changed.wait()

        await asyncio.wait_for(wait(), WAIT_S)


async def settle() -> None:
    """Let every ready task run (a call's way into its thread takes a few steps)."""
    for _ in range(20):
        await asyncio.sleep(0)


async def test_a_sandbox_runs_at_most_its_share_and_the_others_are_not_held() -> None:
    threads = TenantThreads(total=8, per_sandbox=2)
    gates = Gates()
    hostile = [asyncio.create_task(threads.run("mallory", gates.call(f"m{n}"))) for n in range(6)]
    await gates.until_started(2)
    await settle()
    assert sorted(gates.started) == ["m0", "m1"], "only the sandbox's share runs"
    honest = asyncio.create_task(threads.run("alice", gates.call("a0")))
    await gates.until_started(3)
    assert gates.started[-1] == "a0", "alice runs while mallory's calls wait"
    gates.release("a0")
    assert await asyncio.wait_for(honest, WAIT_S) == "a0"
    assert not any(task.done() for task in hostile)
    for n in range(6):
        gates.release(f"m{n}")
    assert await asyncio.gather(*hostile) == [f"m{n}" for n in range(6)]


async def test_a_sandbox_s_waiting_calls_run_in_their_order() -> None:
    threads = TenantThreads(total=4, per_sandbox=1)
    gates = Gates()
    tasks = []
    for n in range(5):
        tasks.append(asyncio.create_task(threads.run("mallory", gates.call(f"m{n}"))))
        await settle()  # queued in this order
    for n in range(5):
        await gates.until_started(n + 1)
        await settle()
        assert gates.started == [f"m{i}" for i in range(n + 1)]  # one at a time, FIFO
        gates.release(f"m{n}")
    await asyncio.gather(*tasks)


async def test_the_total_bounds_all_sandboxes_together_first_come_first_served() -> None:
    threads = TenantThreads(total=3, per_sandbox=2)
    gates = Gates()
    first = [asyncio.create_task(threads.run("a", gates.call(f"a{n}"))) for n in range(2)]
    await gates.until_started(2)
    later = [asyncio.create_task(threads.run(key, gates.call(key))) for key in ("b", "c")]
    await gates.until_started(3)
    await settle()
    assert gates.started[2] == "b", "c waits for a free thread"
    assert threads.busy() == 3
    gates.release("a0")
    await gates.until_started(4)
    assert gates.started[3] == "c"
    for name in ("a1", "b", "c"):
        gates.release(name)
    await asyncio.gather(*first, *later)
    assert threads.busy() == 0


async def test_a_cancelled_waiting_call_leaves_the_queue_and_nothing_leaks() -> None:
    threads = TenantThreads(total=4, per_sandbox=1)
    gates = Gates()
    running = asyncio.create_task(threads.run("mallory", gates.call("m0")))
    await gates.until_started(1)
    gone = asyncio.create_task(threads.run("mallory", gates.call("m1")))
    after = asyncio.create_task(threads.run("mallory", gates.call("m2")))
    await settle()
    gone.cancel()  # the client went away while the call waited
    with pytest.raises(asyncio.CancelledError):
        await gone
    gates.release("m0")
    await gates.until_started(2)
    assert gates.started == ["m0", "m2"], "the cancelled call never ran"
    gates.release("m2")
    await asyncio.gather(running, after)
    assert threads.sandboxes() == 0, "no limiter is kept for a sandbox with no calls"


async def test_a_cancelled_running_call_keeps_its_place_until_its_thread_returns() -> None:
    # A thread cannot be stopped: giving its place back at once would let a tenant
    # start threads without bound by cancelling its calls.
    threads = TenantThreads(total=4, per_sandbox=1)
    gates = Gates()
    running = asyncio.create_task(threads.run("mallory", gates.call("m0")))
    await gates.until_started(1)
    waiting = asyncio.create_task(threads.run("mallory", gates.call("m1")))
    running.cancel()
    await settle()
    assert gates.started == ["m0"], "m0's thread still runs: m1 waits"
    assert threads.busy() == 1
    gates.release("m0")
    await gates.until_started(2)  # the place came back with the thread
    gates.release("m1")
    assert await asyncio.wait_for(waiting, WAIT_S) == "m1"
    await asyncio.gather(running, return_exceptions=True)
    assert threads.busy() == 0
    assert threads.sandboxes() == 0


async def test_many_past_sandboxes_leave_no_limiter_behind() -> None:
    threads = TenantThreads(total=4, per_sandbox=2)
    results = await asyncio.gather(*(threads.run(f"key{n}", str, n) for n in range(200)))
    assert results == [str(n) for n in range(200)]
    assert threads.sandboxes() == 0


async def test_an_error_in_the_thread_reaches_the_caller_and_frees_the_place() -> None:
    threads = TenantThreads(total=1, per_sandbox=1)
    with pytest.raises(ZeroDivisionError):
        await threads.run("mallory", divmod, 1, 0)
    assert await threads.run("mallory", divmod, 7, 2) == (3, 1)
    assert threads.sandboxes() == 0


def test_a_share_of_zero_is_refused() -> None:
    with pytest.raises(ValueError, match="1 <= per_sandbox"):
        TenantThreads(total=0, per_sandbox=1)


async def test_the_server_s_work_on_a_tree_does_not_wait_behind_the_sandbox_s_calls() -> None:
    # The disk budget's measurement of a flooding sandbox must still run.
    threads = TenantThreads(total=4, per_sandbox=1)
    gates = Gates()
    flood = [asyncio.create_task(threads.run("mallory", gates.call(f"m{n}"))) for n in range(4)]
    await gates.until_started(1)
    measured = asyncio.create_task(threads.run_server_work(gates.call("measure")))
    await gates.until_started(2)
    assert gates.started == ["m0", "measure"]
    gates.release("measure")
    assert await asyncio.wait_for(measured, WAIT_S) == "measure"
    for n in range(4):
        gates.release(f"m{n}")
    await asyncio.gather(*flood)


async def test_the_upkeep_s_executor_is_free_while_every_tenant_thread_is_taken() -> None:
    # The loop's default executor (asyncio.to_thread) is the server's upkeep's.
    threads = TenantThreads(total=2, per_sandbox=1)
    gates = Gates()
    taken = [asyncio.create_task(threads.run(key, gates.call(key))) for key in ("a", "b", "c")]
    await gates.until_started(2)
    assert threads.busy() == 2
    assert await asyncio.wait_for(asyncio.to_thread(sum, [1, 2]), WAIT_S) == 3
    for key in ("a", "b", "c"):
        gates.release(key)
    await asyncio.gather(*taken)
