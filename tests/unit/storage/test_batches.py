"""Decisions in batches (app/storage/batches.py): who decides which items, and what a
failed or abandoned batch leaves to the callers behind it."""

from __future__ import annotations

import asyncio

import pytest

from app.storage.batches import Batches


async def settle() -> None:
    for _ in range(20):
        await asyncio.sleep(0)


class Decider:
    """Answers each item with its double; fails a batch holding "bad"; holds the first
    batch until ``release`` is set."""

    def __init__(self) -> None:
        self.batches: list[list[object]] = []
        self.release = asyncio.Event()

    async def decide(self, items: list[object]) -> list[object]:
        self.batches.append(items)
        if len(self.batches) == 1:
            await self.release.wait()
        if "bad" in items:
            raise ValueError("bad batch")
        return [f"{item}{item}" for item in items]


async def test_items_queued_behind_a_batch_are_decided_together_at_most_max_at_once() -> None:
    decider = Decider()
    batches: Batches[object, object] = Batches(decider.decide, max_batch=3)
    first = asyncio.create_task(batches.decide("a"))
    await settle()
    rest = [asyncio.create_task(batches.decide(item)) for item in "bcdef"]
    await settle()
    decider.release.set()
    assert await asyncio.gather(first, *rest) == ["aa", "bb", "cc", "dd", "ee", "ff"]
    assert decider.batches == [["a"], ["b", "c", "d"], ["e", "f"]]


async def test_a_failed_batch_fails_its_callers_only() -> None:
    """The holder whose own item was not in the failed batch goes on to decide it."""
    decider = Decider()
    batches: Batches[object, object] = Batches(decider.decide, max_batch=2)
    first = asyncio.create_task(batches.decide("a"))
    await settle()
    rest = [asyncio.create_task(batches.decide(item)) for item in ("bad", "c", "d")]
    await settle()
    decider.release.set()
    outcomes = await asyncio.gather(first, *rest, return_exceptions=True)
    assert outcomes[0] == "aa"
    assert [type(o) for o in outcomes[1:3]] == [ValueError, ValueError]
    assert outcomes[3] == "dd"


async def test_a_cancelled_holder_leaves_its_batch_to_the_next() -> None:
    """Nothing of a batch abandoned mid-transaction was committed: the next holder
    decides its items again, from scratch."""
    decider = Decider()
    batches: Batches[object, object] = Batches(decider.decide, max_batch=10)
    holder = asyncio.create_task(batches.decide("a"))
    await settle()
    behind = asyncio.create_task(batches.decide("b"))
    await settle()
    holder.cancel()
    await settle()
    with pytest.raises(asyncio.CancelledError):
        await holder
    decider.release.set()
    # The others of its batch go back to the queue, its own item does not (nobody
    # would read it): "b"'s caller decides "b" alone.
    assert await behind == "bb"
    assert decider.batches == [["a"], ["b"]]
