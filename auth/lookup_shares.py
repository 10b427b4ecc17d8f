"""Shares of a few threads that block on DNS lookups, one per key (a sandbox, a sign-in
address, a network).

``getaddrinfo`` holds its thread for as long as the nameserver makes it, and a timeout
around it ends only the waiting: a host whose nameserver never answers keeps the thread
busy long after its caller gave up. A tenant who picks such hosts must fill only its own
share of the threads, never everyone's. So a lookup takes a place in each of its keys'
shares before it starts, and gives them back when the lookup itself ends, not when its
caller stops waiting.

Used for the metadata-document fetcher's lookups (``auth.client_documents``: per sign-in
address and per network) and for remote clones' (``app.runtime.git.egress``: per
sandbox and per sign-in address). In ``auth`` so that both may import it.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Sequence
from dataclasses import dataclass
from typing import Any, TypeVar

T = TypeVar("T")


@dataclass
class _Gate:
    slots: asyncio.Semaphore
    users: int = 0  # lookups holding or waiting for one of its slots


class KeyedShares:
    """Lookups in flight per key, for one pool of threads (one instance per process, as
    the threads are). A key's gate is dropped when no lookup holds or waits for it, so
    the keys kept are those in use."""

    def __init__(self) -> None:
        self._gates: dict[str, _Gate] = {}
        self._running: set[asyncio.Future[Any]] = set()  # lookups nobody waits on, kept alive

    @property
    def idle(self) -> bool:
        """No lookup holds or waits for a place."""
        return not self._gates

    async def take(self, keys: Sequence[tuple[str, int]]) -> HeldShare:
        """A place in each key's share (``(key, limit)``: at most ``limit`` in flight),
        waiting for each in turn. Callers name their keys in one order of kinds (a
        sandbox before its address, an address before its network), so no two wait on
        each other. Cancelled (a caller's timeout), it gives back what it took."""
        held: list[str] = []
        try:
            for key, limit in keys:
                await self._enter(key, limit)
                held.append(key)
        except BaseException:
            self._leave(held)
            raise
        return HeldShare(self, held)

    async def _enter(self, key: str, limit: int) -> None:
        gate = self._gates.setdefault(key, _Gate(asyncio.Semaphore(limit)))
        gate.users += 1
        try:
            await gate.slots.acquire()
        except BaseException:
            gate.users -= 1
            if not gate.users:
                del self._gates[key]
            raise

    def _leave(self, keys: list[str]) -> None:
        for key in keys:
            gate = self._gates[key]
            gate.slots.release()
            gate.users -= 1
            if not gate.users:
                del self._gates[key]


class HeldShare:
    """Places taken for one lookup: handed to it by :meth:`run`, or given back unused by
    :meth:`release` (both at most once; whichever comes first)."""

    def __init__(self, shares: KeyedShares, keys: list[str]) -> None:
        self._shares = shares
        self._keys: list[str] | None = keys

    def _claim(self) -> list[str]:
        if self._keys is None:
            raise RuntimeError("this share was already used or given back")
        keys, self._keys = self._keys, None
        return keys

    async def run(self, lookup: Awaitable[T]) -> T:
        """``lookup``'s result; its places are held until it ends, even when the caller
        stops waiting first (cancelled, or its timeout passed): the thread is busy until
        then."""
        try:
            keys = self._claim()
        except RuntimeError:
            if asyncio.iscoroutine(lookup):
                lookup.close()  # never started: no "never awaited" warning
            raise
        shares = self._shares
        task = asyncio.ensure_future(lookup)
        shares._running.add(task)

        def ended(done: asyncio.Future[T]) -> None:
            shares._running.discard(done)
            shares._leave(keys)
            if not done.cancelled():
                done.exception()  # retrieved: the caller may have stopped waiting

        task.add_done_callback(ended)
        return await asyncio.shield(task)

    def release(self) -> None:
        """Give the places back without a lookup; nothing once :meth:`run` has them."""
        if self._keys is not None:
            self._shares._leave(self._claim())
