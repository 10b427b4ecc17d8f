"""Callers of one serialized decision, decided in batches: those that queue while a
batch's transaction runs are decided together by the next holder, in the order they came.

A decision every process serializes (an asyncio lock in the process, an advisory lock
across processes on PostgreSQL) used to take a transaction per caller. On a database
busy with the tenants' work each transaction waits for a connection, SQLite's write
lock and the loop, so the last of N callers waited N transactions: under the fairness
bench's sign-in flood an honest registration waited for 13 to 17 of them (issue 25).
Here a caller waits for the batch in progress and its own, however many queue. The
rate ledger's takes (``rate_store``) and the sign-in's admissions (``auth_store``) are
decided this way; each ``decide`` answers every item as if it came alone, in order.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, field
from typing import Generic, TypeVar, cast

T = TypeVar("T")
R = TypeVar("R")


@dataclass(eq=False)
class _Queued(Generic[T]):
    item: T
    decided: bool = False
    result: object = None
    error: BaseException | None = field(default=None, repr=False)


class Batches(Generic[T, R]):
    """``decide(items)`` (one transaction, one answer an item, in order) for at most
    ``max_batch`` queued items at a time, one batch at a time in this process."""

    def __init__(
        self, decide: Callable[[list[T]], Awaitable[Sequence[R]]], *, max_batch: int
    ) -> None:
        self._decide = decide
        self._max_batch = max_batch
        self._lock = asyncio.Lock()
        self._queued: list[_Queued[T]] = []

    async def decide(self, item: T) -> R:
        """``item``'s answer, decided alone or with the items queued beside it.

        Raises:
            Whatever its batch's ``decide`` raised (every item of the batch gets it).
        """
        mine = _Queued(item)
        self._queued.append(mine)
        try:
            async with self._lock:
                # The lock's holder before us may have decided ours with its own batch.
                while not mine.decided:
                    batch = self._queued[: self._max_batch]
                    del self._queued[: len(batch)]
                    await self._run(batch)
        except asyncio.CancelledError:
            # Not decided: nobody will read it, so nobody spends anything for it.
            if mine in self._queued:
                self._queued.remove(mine)
            raise
        if mine.error is not None:
            raise mine.error
        return cast(R, mine.result)

    async def _run(self, batch: list[_Queued[T]]) -> None:
        try:
            results = await self._decide([queued.item for queued in batch])
        except asyncio.CancelledError:
            # The holder went away: the next holder decides its batch from scratch
            # (nothing was committed).
            self._queued[:0] = batch
            raise
        except Exception as exc:
            # Every caller of the failed batch gets its error; the holder goes on to its
            # own item if that was not in it.
            for queued in batch:
                queued.decided, queued.error = True, exc
            return
        assert len(results) == len(batch)
        for queued, result in zip(batch, results, strict=True):
            queued.decided, queued.result = True, result
