"""The engine's creation gate: how many container creations (create and start) are sent
to the engine at once, and in which order.

The engine serves a few creations at once well; more only queue inside it, behind its
own locks (tests/bench/bench_engine_concurrency.py). So at most ``limit`` are sent at
once, and the rest wait here in two lanes:

- real requests (a create_experiment going cold, a warm container a lessee may wait
  for) wait in arrival order, so a slow creation delays no one beyond its own place;
- background ones (a sandbox's prepared container: :mod:`app.runtime.warm.prepared`)
  are sent only when no real request waits, and at most ``background`` at once, so
  places stay free for the real requests that arrive while they run. A real request
  that arrives while background ones wait goes before all of them.

A background creation is made for no one yet: it may wait indefinitely (a steady
stream of real requests starves it, which is the point), and its owner may cancel it
while it waits here (nothing was sent to the engine yet).
"""

from __future__ import annotations

import asyncio
import contextlib
from collections import deque
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager


class CreateGate:
    """At most ``limit`` creations at the engine at once, real requests first (see above).

    Args:
        limit: Creations sent to the engine at once (SANDBOX_MCP_ENGINE_CREATES).
        background: The most of them that may be background ones (default: half, at least 1).
    """

    def __init__(self, limit: int, background: int | None = None) -> None:
        if limit < 1:
            raise ValueError("limit must be at least 1")
        self.limit = limit
        self.background_limit = max(1, limit // 2) if background is None else background
        self._in_use = 0
        self._background_in_use = 0
        self._waiting: deque[asyncio.Future[None]] = deque()
        self._background_waiting: deque[asyncio.Future[None]] = deque()

    @property
    def in_use(self) -> int:
        return self._in_use

    @property
    def waiting(self) -> tuple[int, int]:
        """(real requests, background ones) waiting for a place."""
        return len(self._waiting), len(self._background_waiting)

    @asynccontextmanager
    async def place(self, *, background: bool = False) -> AsyncIterator[None]:
        """Hold a place while one creation is at the engine."""
        await self._acquire(background)
        try:
            yield
        finally:
            self._release(background)

    def _free_for(self, background: bool) -> bool:
        if self._in_use >= self.limit or self._waiting:
            return False
        if not background:
            return True
        return not self._background_waiting and self._background_in_use < self.background_limit

    async def _acquire(self, background: bool) -> None:
        if self._free_for(background):
            self._take(background)
            return
        lane = self._background_waiting if background else self._waiting
        turn: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        lane.append(turn)
        try:
            await turn
        except asyncio.CancelledError:
            if turn.done() and not turn.cancelled():
                self._release(background)  # given a place just before the cancel: pass it on
            else:
                with contextlib.suppress(ValueError):  # already passed over by _hand_on
                    lane.remove(turn)
            raise

    def _take(self, background: bool) -> None:
        self._in_use += 1
        if background:
            self._background_in_use += 1

    def _release(self, background: bool) -> None:
        self._in_use -= 1
        if background:
            self._background_in_use -= 1
        self._hand_on()

    def _hand_on(self) -> None:
        """Give the free places to the waiters: real requests first, in arrival order."""
        while self._in_use < self.limit:
            if self._waiting:
                turn, background = self._waiting.popleft(), False
            elif self._background_waiting and self._background_in_use < self.background_limit:
                turn, background = self._background_waiting.popleft(), True
            else:
                return
            if turn.done():
                continue  # cancelled while waiting (it removes itself, but be sure)
            self._take(background)
            turn.set_result(None)
