"""A leaky bucket: how long to wait so that what was used stays within a rate."""

from __future__ import annotations

import time
from collections.abc import Callable


class Throttle:
    """At most ``per_s`` units a second, with a second's worth of burst: ``take``
    counts what was used and says how long to wait before using more."""

    def __init__(self, per_s: float, clock: Callable[[], float] = time.monotonic) -> None:
        self.per_s = per_s
        self._clock = clock
        self._level = 0.0
        self._at = clock()

    def take(self, amount: float) -> float:
        now = self._clock()
        self._level = max(0.0, self._level - (now - self._at) * self.per_s) + amount
        self._at = now
        return max(0.0, self._level - self.per_s) / self.per_s
