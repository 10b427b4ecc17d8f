"""A sliding-window rate limiter, in memory, bounded in the number of keys it tracks."""

from __future__ import annotations

import time
from collections import OrderedDict, deque
from collections.abc import Callable


class RateLimiter:
    """At most ``limit`` events per ``window_s`` for each key (use one key for a global budget)."""

    def __init__(
        self,
        limit: int,
        window_s: float,
        *,
        max_keys: int = 10_000,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.limit = limit
        self.window_s = window_s
        self._max_keys = max_keys
        self._clock = clock
        self._events: OrderedDict[str, deque[float]] = OrderedDict()

    def allow(self, key: str = "") -> bool:
        """Count one event for ``key``; False (and not counted) when over the limit."""
        now = self._clock()
        events = self._events.get(key)
        if events is None:
            if len(self._events) >= self._max_keys:
                self._events.popitem(last=False)  # forget the least recently seen key
            events = self._events[key] = deque()
        else:
            self._events.move_to_end(key)
        while events and events[0] <= now - self.window_s:
            events.popleft()
        if len(events) >= self.limit:
            return False
        events.append(now)
        return True

    def retry_after_s(self, key: str = "") -> int:
        events = self._events.get(key)
        if not events:
            return 0
        return max(1, int(events[0] + self.window_s - self._clock()) + 1)
