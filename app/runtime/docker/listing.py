"""One listing of our containers, shared by every admission that waits for one.

Each container creation is admitted against what the engine holds (``capacity``).
Listing the engine's containers for each creation, one at a time, made a burst of
a hundred creations wait for a hundred listings in a row (each slower as the engine
fills): the listing, not the engine's create, was the line. A listing that *began
after* a caller arrived is as good for it as one of its own, so callers that arrive
while one is under way wait for the next, and all of those share it.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass


@dataclass(frozen=True)
class Listing:
    began: float  # monotonic: everything that ended before it is in it
    found: Mapping[str, str]  # each live container's sandbox, by name


class SharedListing:
    """Listings of ``live``, one at a time, each shared by the callers waiting for it."""

    def __init__(
        self,
        live: Callable[[], Awaitable[Mapping[str, str]]],
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._live = live
        self._clock = clock
        self._last: Listing | None = None
        self._running: asyncio.Future[Listing] | None = None

    async def since(self, arrived: float) -> Listing:
        """A listing that began at ``arrived`` or later (the engine's errors propagate)."""
        while True:
            last = self._last
            if last is not None and last.began >= arrived:
                return last
            if self._running is None:
                self._running = asyncio.ensure_future(self._list())
            # Shielded: a caller that gives up must not cancel the others' listing.
            await asyncio.shield(self._running)

    async def _list(self) -> Listing:
        began = self._clock()
        try:
            listing = Listing(began, await self._live())
            self._last = listing
            return listing
        finally:
            self._running = None
