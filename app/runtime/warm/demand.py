"""How many warm containers to keep: the warm pool's sizing policy.

A burst of first calls (a link shared around) meets the engine's own pace unless its
containers are started before the calls arrive. The pool keeps ``floor`` of them
always, and grows towards ``ceiling`` on three signals that come before (or with) a
burst, each of which fades by itself, so an idle server shrinks back to its floor:

- a sign-in whose sandbox holds no slot yet (its first call is on its way): it counts
  until the sandbox holds one, or for ``signin_window_s`` at most;
- a forming queue: each caller waiting for a slot will need a container when one frees;
- the recent rate of creates: the creates of the last ``rate_window_s``, scaled to the
  ``horizon_s`` ahead (about the time a refill takes under such a load).

The ceiling is the budget (``WarmBudget``: containers, and memory at what an idle warm
container costs). The sign-in signal cannot be spent by one client: each sign-in
address (``auth.client_address``'s budget key) counts at most ``per_address`` pending
sign-ins, its share of the ceiling, whatever the number it makes; its sign-ins are
bounded on their own by the per-address sign-in budget. A warm container belongs to
no one (the next first call takes it), so growing the pool takes nothing from others.

The same budget holds the sandboxes' prepared containers (:mod:`app.runtime.warm.prepared`,
one per lessee for its next experiment): the pool's target is what the budget leaves
beside them, never below the floor, and they get only what the pool neither holds nor
wants (``WarmPool.spare``). So the two together stay within the ceiling.
"""

from __future__ import annotations

import math
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass

# What one idle warm container costs the host, measured (tests/bench/bench_warm.py): about
# 6.2 MB in its cgroup (sleep infinity and its executor) plus 13-14 MB for its containerd
# shim; rounded up.
IDLE_MB = 20.0


@dataclass(frozen=True)
class WarmBudget:
    """The warm pool's bounds: at least ``floor``, at most ``max_containers`` and
    ``max_memory_mb`` of idle containers at ``idle_mb`` each."""

    floor: int
    max_containers: int
    max_memory_mb: int
    idle_mb: float = IDLE_MB

    @property
    def ceiling(self) -> int:
        by_memory = int(self.max_memory_mb // self.idle_mb)
        return max(self.floor, min(self.max_containers, by_memory))

    def per_address(self, share_percent: int) -> int:
        """Pending sign-ins one address may count: its share of the ceiling, at least 1."""
        return max(1, math.ceil(self.ceiling * share_percent / 100))


class WarmDemand:
    """The target size of the warm pool, from the signals above (see the module doc).

    Args:
        budget: The floor and the ceiling.
        address_share_percent: The percent of the ceiling one sign-in address may grow.
        holds_slot: Whether a sandbox key holds a slot (leased or reserved) now.
        queued: How many callers wait in the queue now.
        prepared: How many prepared containers the budget holds now (made or being made).
        clock: Monotonic seconds.
    """

    def __init__(
        self,
        budget: WarmBudget,
        *,
        address_share_percent: int = 100,
        holds_slot: Callable[[str], bool] = lambda key: False,
        queued: Callable[[], int] = lambda: 0,
        prepared: Callable[[], int] = lambda: 0,
        clock: Callable[[], float] = time.monotonic,
        signin_window_s: float = 120.0,
        rate_window_s: float = 60.0,
        horizon_s: float = 10.0,
    ) -> None:
        self.budget = budget
        self._per_address = budget.per_address(address_share_percent)
        self._holds_slot = holds_slot
        self._queued = queued
        self.prepared = prepared
        self._clock = clock
        self._signin_window_s = signin_window_s
        self._rate_window_s = rate_window_s
        self._horizon_s = horizon_s
        # Sign-ins waiting for their first call: key -> (address, when); oldest first.
        self._pending: dict[str, tuple[str, float]] = {}
        self._creates: deque[float] = deque(maxlen=10_000)
        self._listeners: list[Callable[[], None]] = []

    def on_change(self, listener: Callable[[], None]) -> None:
        """Call ``listener`` when a signal rises (the pool wakes and grows at once)."""
        self._listeners.append(listener)

    def signed_in(self, sandbox_key: str, address: str | None) -> None:
        """A token was issued for ``sandbox_key`` from ``address`` (its budget key)."""
        self._pending.pop(sandbox_key, None)
        self._pending[sandbox_key] = (address or "", self._clock())
        self._notify()

    def created(self) -> None:
        """An experiment's container was asked for (warm or cold)."""
        self._creates.append(self._clock())
        self._notify()

    def target(self) -> int:
        """How many warm containers to keep now: floor + signals, within what the
        ceiling leaves beside the prepared containers (never below the floor)."""
        now = self._clock()
        by_address: dict[str, int] = {}
        for key, (address, at) in list(self._pending.items()):
            if now - at > self._signin_window_s or self._holds_slot(key):
                del self._pending[key]
                continue
            by_address[address] = by_address.get(address, 0) + 1
        signins = sum(min(n, self._per_address) for n in by_address.values())
        while self._creates and now - self._creates[0] > self._rate_window_s:
            self._creates.popleft()
        rate = math.ceil(len(self._creates) * self._horizon_s / self._rate_window_s)
        wanted = self.budget.floor + signins + self._queued() + rate
        room = self.budget.ceiling - self.prepared()
        return max(self.budget.floor, min(room, wanted))

    def _notify(self) -> None:
        for listener in self._listeners:
            listener()
