"""Sharing the server's containers, and its output readers, fairly between sandboxes.

Containers. The server runs at most ``total`` containers of ours, and every
slot of the pool is promised one of them: a sandbox's *first* container is
admitted whenever the server is below ``total``, while its second and later
ones (*extras*) come only out of ``total - slots``, what is left once every
slot has its first. The promise covers every slot of the pool, leased now or
not: a container cannot be taken back, so an extra granted while half the
pool was free would otherwise stop a sandbox leased later from getting its
first. Why a first always fits (with ``total >= slots``, checked at start-up):
let ``extras`` be the containers beyond each holder's first. A first container
or the removal of a sandbox's last one leaves ``extras`` unchanged; only an
admitted extra raises it, and only while ``extras + 1 <= total - slots``. So
``in use = holders + extras <= holders + total - slots``, and a slot holder
without a container leaves ``holders <= slots - 1``: ``in use < total``.
Containers that name no sandbox (stray ones) count as extras.

Output readers. A command's output is read by a worker thread, held while the
command is silent. Every sandbox runs at most ``jobs`` commands at once, plus
one stream per creation in flight (its clone, then its setup commands one by
one), and creations are bounded by the experiments cap; so
:func:`output_streams` readers are enough for every sandbox at its caps at
once, and one tenant's jobs can never leave another's output unread.
"""

from __future__ import annotations

import time
from collections import Counter
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping
from contextlib import asynccontextmanager
from dataclasses import dataclass

import anyio

from app.errors import ConfigurationError, LimitReached, ServiceError
from app.runtime.docker.listing import SharedListing
from app.runtime.errors import CapacityExceeded

UNATTRIBUTED = ""  # the sandbox of a container that names none


def output_streams(slots: int, jobs_per_sandbox: int, experiments_per_sandbox: int) -> int:
    """Output readers enough for every slot's sandbox at its caps at once (see above)."""
    return slots * (jobs_per_sandbox + experiments_per_sandbox)


@dataclass(frozen=True)
class ContainerShares:
    """The admission rule (see the module doc); pure, so it is tested on its own.

    Args:
        total: Live containers of ours, server-wide.
        slots: Sandboxes promised a first container (the pool's size; 0: none).
        per_sandbox: The most one sandbox may hold (None: no cap of its own).
    """

    total: int
    slots: int = 0
    per_sandbox: int | None = None

    def __post_init__(self) -> None:
        if self.total < 1:
            raise ConfigurationError("max_containers must be at least 1.")
        if self.total < self.slots:
            raise ConfigurationError(
                f"max_containers ({self.total}) must be at least the pool size ({self.slots}): "
                "every sandbox must be able to run one experiment."
            )
        if self.per_sandbox is not None and self.per_sandbox < 1:
            raise ConfigurationError("max_containers_per_sandbox must be at least 1.")

    @property
    def spare(self) -> int:
        """Containers for second and later experiments, shared by every sandbox."""
        return self.total - self.slots

    def refusal(self, held: Mapping[str, int], sandbox: str) -> ServiceError | None:
        """Why ``sandbox`` may not have one more container now (None: it may).

        ``held`` is the containers of each sandbox, in flight included.
        """
        mine = held.get(sandbox, 0)
        if sandbox != UNATTRIBUTED and self.per_sandbox is not None and mine >= self.per_sandbox:
            return LimitReached(
                f"Your sandbox already runs its maximum of {self.per_sandbox} experiment "
                "containers; destroy an experiment you no longer need with destroy_experiment.",
                limit="containers_per_sandbox",
                value=self.per_sandbox,
            )
        in_use = sum(held.values())
        if mine == 0 and sandbox != UNATTRIBUTED:
            # A first container: within the promise unless the server is over its total.
            return CapacityExceeded(self.total) if in_use >= self.total else None
        # An extra (this also keeps in_use + 1 <= total, as holders <= max(...)).
        holders = sum(1 for key, n in held.items() if key != UNATTRIBUTED and n > 0)
        extras = in_use - holders
        if extras + 1 > self.total - max(self.slots, holders):
            return CapacityExceeded(self.total, spare=self.spare)
        return None


class ContainerLimiter:
    """Admits container creations by :class:`ContainerShares`, one decision at a time.

    Args:
        shares: The admission rule.
        live: The sandbox of every live container of ours by name (at the engine).
        clock: Monotonic seconds.
    """

    def __init__(
        self,
        shares: ContainerShares,
        live: Callable[[], Awaitable[Mapping[str, str]]],
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.shares = shares
        self._clock = clock
        self._listing = SharedListing(live, clock)
        self._lock = anyio.Lock()
        # Admitted creations by container name: (sandbox, when it ended, None: in flight).
        self._creating: dict[str, tuple[str, float | None]] = {}

    @asynccontextmanager
    async def admit(self, sandbox: str, name: str) -> AsyncIterator[None]:
        """Hold a place for the container ``name`` of ``sandbox`` while it is created.

        The decision reads a listing of the engine that began after the call (shared
        with the calls waiting with it: ``app.runtime.docker.listing``) and adds the
        creations admitted here that it may not show: those in flight, and those that
        ended after it began (by name, so one the listing shows is not counted twice).
        The lock makes the sum exact within this process.

        Raises:
            LimitReached: the sandbox holds its own maximum.
            CapacityExceeded: the server, or its spare capacity, is full.
        """
        listing = await self._listing.since(self._clock())
        async with self._lock:
            found = listing.found
            for other, (_, ended) in list(self._creating.items()):
                # Listings are decided in the order they began: no later decision reads
                # one older than this, which shows (or no longer needs) what ended before.
                if ended is not None and ended < listing.began:
                    del self._creating[other]
            held = Counter(found.values())
            held.update(owner for other, (owner, _) in self._creating.items() if other not in found)
            refusal = self.shares.refusal(held, sandbox)
            if refusal is not None:
                raise refusal
            self._creating[name] = (sandbox, None)
        try:
            yield
        finally:
            self._creating[name] = (sandbox, self._clock())
