"""Destroyed experiments' containers removed after the answer: bounded per sandbox,
retried when the engine fails, waited for by whoever needs them gone."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable

import pytest

from app.experiments.removals import DeferredRemovals
from app.runtime.errors import RuntimeFailure


class HeldEngine:
    """Removes a container once the test lets it (one event per container)."""

    def __init__(self) -> None:
        self.release: dict[str, asyncio.Event] = {}
        self.removed: list[str] = []
        self.failures: dict[str, int] = {}

    def hold(self, *ids: str) -> None:
        for container_id in ids:
            self.release[container_id] = asyncio.Event()

    async def remove(self, container_id: str) -> None:
        if container_id in self.release:
            await self.release[container_id].wait()
        if self.failures.get(container_id, 0) > 0:
            self.failures[container_id] -= 1
            raise RuntimeFailure("The engine answered 500.")
        self.removed.append(container_id)


async def start(
    removals: DeferredRemovals,
    sandbox_key: str,
    container_id: str,
    then: Callable[[bool], Awaitable[None]] | None = None,
) -> asyncio.Task[bool]:
    """As a destroy does: its turn, then the removal."""
    await removals.turn(sandbox_key)
    return removals.begin(sandbox_key, container_id, then)


async def turns(n: int = 20) -> None:
    """Let every task that can run do so (nothing here waits on a clock)."""
    for _ in range(n):
        await asyncio.sleep(0)


async def test_a_sandbox_past_its_bound_waits_for_its_own_removals_only() -> None:
    engine = HeldEngine()
    engine.hold("a1", "a2", "a3")
    removals = DeferredRemovals(engine.remove, per_sandbox=2)
    first = await start(removals, "alice", "a1")
    await start(removals, "alice", "a2")
    third = asyncio.ensure_future(start(removals, "alice", "a3"))
    bob = await start(removals, "bob", "b1")  # another tenant's is not held up
    await turns()
    assert not third.done()  # alice has 2 in progress: her third waits
    assert await bob
    assert engine.removed == ["b1"]
    assert removals.pending("alice") == 2
    engine.release["a1"].set()
    assert await first
    await asyncio.wait_for(third, 30)  # a bound against a hang, not the verdict
    assert removals.pending("alice") == 2  # a2 and a3: never more than the bound
    engine.release["a2"].set()
    engine.release["a3"].set()
    await removals.idle()
    assert sorted(engine.removed) == ["a1", "a2", "a3", "b1"]
    assert removals.pending("alice") == 0
    await removals.close()


async def test_settled_waits_for_the_sandboxs_removals() -> None:
    engine = HeldEngine()
    engine.hold("a1")
    removals = DeferredRemovals(engine.remove)
    await start(removals, "alice", "a1")
    await removals.settled("bob", 30)  # nothing of bob's: no wait
    waiting = asyncio.ensure_future(removals.settled("alice", 30))
    await turns()
    assert not waiting.done()
    engine.release["a1"].set()
    await asyncio.wait_for(waiting, 30)
    assert engine.removed == ["a1"]
    await removals.close()


async def test_an_engine_failure_is_retried_then_left_to_the_next_start() -> None:
    engine = HeldEngine()
    engine.failures = {"a1": 1, "a2": 5}
    removals = DeferredRemovals(engine.remove, retry_delays_s=(0, 0))
    once = await start(removals, "alice", "a1")
    never = await start(removals, "alice", "a2")
    assert await once is True  # the second attempt removed it
    assert await never is False  # three attempts failed: the start-up sweep's
    assert engine.removed == ["a1"]
    await removals.close()


async def test_close_stops_what_is_left() -> None:
    engine = HeldEngine()
    engine.hold("a1")
    removals = DeferredRemovals(engine.remove)
    stuck = await start(removals, "alice", "a1")
    await removals.close(timeout_s=0)
    assert stuck.cancelled()  # the next start's sweep removes it
    assert engine.removed == []


@pytest.mark.parametrize("per_sandbox", [1, 4])
async def test_every_removal_ends_and_is_forgotten(per_sandbox: int) -> None:
    engine = HeldEngine()
    removals = DeferredRemovals(engine.remove, per_sandbox=per_sandbox)
    for i in range(10):
        await start(removals, "alice", f"a{i}")
    await removals.idle()
    assert len(engine.removed) == 10
    assert removals.pending("alice") == 0
    await removals.close()


async def test_the_step_after_a_removal_is_told_whether_it_is_gone() -> None:
    engine = HeldEngine()
    engine.failures = {"a2": 5}
    removals = DeferredRemovals(engine.remove, retry_delays_s=(0, 0))
    told: list[tuple[str, bool]] = []

    def after(name: str, fail: bool = False) -> Callable[[bool], Awaitable[None]]:
        async def step(gone: bool) -> None:
            told.append((name, gone))
            if fail:
                raise RuntimeError("a step that fails is logged, not raised")

        return step

    assert await (await start(removals, "alice", "a1", then=after("a1")))
    assert not await (await start(removals, "alice", "a2", then=after("a2")))
    assert await (await start(removals, "alice", "a3", then=after("a3", fail=True)))
    assert told == [("a1", True), ("a2", False), ("a3", True)]
    await removals.close()
