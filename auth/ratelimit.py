"""Sliding-window rate limits: in memory for one process (bounded in the number of
keys it tracks), or on a shared ledger (the database) so that several server
processes do not each grant the whole budget."""

from __future__ import annotations

import time
from collections import OrderedDict, deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Protocol

from auth.client_address import network_key


class RateLimiter:
    """At most ``limit`` events per ``window_s`` for each key (use one key for a global budget).

    ``allow`` checks and counts in one step. Where several budgets must all agree
    before anything is spent, ask each ``retry_after_s`` first and ``charge`` them
    only if all are 0 (no await in between, so nothing can slip through).
    """

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

    def _recent(self, key: str) -> deque[float]:
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
        return events

    def allow(self, key: str = "") -> bool:
        """Count one event for ``key``; False (and not counted) when over the limit."""
        if self.retry_after_s(key):
            return False
        self.charge(key)
        return True

    def charge(self, key: str = "") -> None:
        """Count one event for ``key``, whatever the limit says."""
        self._recent(key).append(self._clock())

    def retry_after_s(self, key: str = "") -> int:
        """0 if one more event for ``key`` is within the limit, else the seconds until it is."""
        events = self._recent(key)
        if len(events) < self.limit:
            return 0
        return max(1, int(events[-self.limit] + self.window_s - self._clock()) + 1)


@dataclass(frozen=True)
class Shares:
    """How much of a global budget one network and one address prefix may spend.

    A budget for everyone is only as good as the number of networks it takes to
    spend it: with a share per address prefix alone, a few /64s (cheap: a /48 holds
    65,536) spent it all and locked out every new user (issue 23, finding 7). So
    each global budget has two shares, in percent of it, rounded up (at least 1):
    one *network* (an IPv4 /24, an IPv6 /48; ``auth.client_address.network_key``)
    may spend ``network_percent``, one *address prefix* (an IPv4 address, an IPv6
    /64) ``address_percent``. Spending it all then takes ``100 / network_percent``
    networks (10 by default), and a network ``network_percent / address_percent``
    addresses; a press, registration or fetch counts on all three at once, and only
    when all three have room.
    """

    address_percent: int = 5
    network_percent: int = 10

    def of(self, limit: int) -> tuple[int, int]:
        """What one address prefix and one network may spend of ``limit``."""
        return _percent(limit, self.address_percent), _percent(limit, self.network_percent)


DEFAULT_SHARES = Shares()


def _percent(limit: int, percent: int) -> int:
    return max(1, -(-limit * percent // 100))  # rounded up


class PrefixedBudget:
    """One budget for everyone (``limit`` per ``window_s``) of which one network and
    one address prefix may each spend at most their :class:`Shares`."""

    def __init__(
        self,
        limit: int,
        window_s: float,
        *,
        shares: Shares = DEFAULT_SHARES,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.per_prefix, self.per_network = shares.of(limit)
        self._everyone = RateLimiter(limit, window_s, clock=clock)
        self._networks = RateLimiter(self.per_network, window_s, clock=clock)
        self._prefixes = RateLimiter(self.per_prefix, window_s, clock=clock)

    def retry_after_s(self, prefix: str) -> int:
        """0 if ``prefix`` may spend one more now, else the seconds until it may."""
        return max(
            self._everyone.retry_after_s(),
            self._networks.retry_after_s(network_key(prefix)),
            self._prefixes.retry_after_s(prefix),
        )

    def charge(self, prefix: str) -> None:
        self._everyone.charge()
        self._networks.charge(network_key(prefix))
        self._prefixes.charge(prefix)

    def allow(self, prefix: str) -> bool:
        """Check and spend one in one step; False (nothing spent) when any is spent."""
        if self.retry_after_s(prefix):
            return False
        self.charge(prefix)
        return True

    async def take(self, prefix: str) -> int:
        """Spend one if all three allow it (0), else the seconds to wait (nothing spent)."""
        wait = self.retry_after_s(prefix)
        if not wait:
            self.charge(prefix)
        return wait


class EventLedger(Protocol):
    """Where shared budgets count their events (``app.storage.rate_store``)."""

    async def take(self, budgets: Sequence[tuple[str, int]], window_s: float, now: float) -> int:
        """Count one event in every bucket if each holds fewer than its limit in the last
        ``window_s``, atomically for every process; else the seconds until they would
        (and nothing is counted)."""
        ...


class SharedPrefixedBudget:
    """:class:`PrefixedBudget` on a shared ledger: the same limits, whatever number of
    processes spend it."""

    def __init__(
        self,
        ledger: EventLedger,
        name: str,
        limit: int,
        window_s: float,
        *,
        shares: Shares = DEFAULT_SHARES,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self.per_prefix, self.per_network = shares.of(limit)
        self._ledger = ledger
        self._name = name
        self._limit = limit
        self._window_s = window_s
        self._clock = clock

    async def take(self, prefix: str) -> int:
        """Spend one if all three allow it (0), else the seconds to wait (nothing spent)."""
        budgets = [
            (self._name, self._limit),
            (f"{self._name}:net:{network_key(prefix)}", self.per_network),
            (f"{self._name}:{prefix}", self.per_prefix),
        ]
        return await self._ledger.take(budgets, self._window_s, self._clock())


class Budget(Protocol):
    async def take(self, prefix: str) -> int: ...
