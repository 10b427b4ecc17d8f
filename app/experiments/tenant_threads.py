"""Where a tenant's blocking work runs: worker threads that no tenant can hold alone.

File tools, project maps, change reports, artifact copies and disk measurements
walk and read a tenant's tree in a thread. On the event loop's default executor
(``asyncio.to_thread``: min(32, cpus + 4) threads, 6 on two cores) one tenant with
a dozen concurrent searches held every thread, and everyone else's calls, and the
server's own upkeep, queued behind them.

Two anyio ``CapacityLimiter``s bound it instead (FIFO, and a waiter that is
cancelled leaves the queue): one per sandbox key, so a sandbox runs at most
``per_sandbox`` calls at once and the rest of its calls wait their turn, in front
of one for all tenant work, sized so that several sandboxes fit. The calls that
hold both run on a thread pool of that size of their own, not the default
executor, which is left to the server's upkeep (slot remounts, the warm pool, the
egress meter, provisioning): tenants can never starve it.

A call whose caller is cancelled (the client went away) keeps its places until its
thread returns: a Python thread cannot be stopped, and giving its place back early
would let a tenant start unbounded threads by cancelling. Every such call is
bounded (the search's time budget, the entry caps), so the place comes back soon.
(``anyio.to_thread.run_sync`` would not do: its shield holds against anyio's
cancel scopes, not against ``Task.cancel()``, which the runner and the SDK use.)
"""

from __future__ import annotations

import asyncio
import functools
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import ParamSpec, TypeVar

import anyio

from jail.context import InThread

# Two calls at once per sandbox (a search beside a read), sixteen for all tenants:
# eight sandboxes' worth, while the default executor keeps its own for the upkeep.
DEFAULT_PER_SANDBOX = 2
DEFAULT_TOTAL = 16

P = ParamSpec("P")
T = TypeVar("T")


@dataclass
class _Share:
    """One sandbox's limiter and how many of its calls hold or wait for it."""

    limiter: anyio.CapacityLimiter
    users: int = 0


class TenantThreads:
    """Runs tenants' blocking callables in worker threads, a bounded share each."""

    def __init__(
        self, *, total: int = DEFAULT_TOTAL, per_sandbox: int = DEFAULT_PER_SANDBOX
    ) -> None:
        if total < 1 or per_sandbox < 1:
            raise ValueError("total and per_sandbox must be at least 1")
        self.per_sandbox = per_sandbox
        self._total = anyio.CapacityLimiter(total)
        # Never queues: a call reaches it only holding one of the total's tokens.
        self._executor = ThreadPoolExecutor(max_workers=total, thread_name_prefix="tenant")
        self._shares: dict[str, _Share] = {}

    async def run(
        self, sandbox_key: str, func: Callable[P, T], *args: P.args, **kwargs: P.kwargs
    ) -> T:
        """``func(*args, **kwargs)`` in a worker thread, within ``sandbox_key``'s share.

        The sandbox's own place is taken first: its waiting calls then never hold a
        place in the shared queue that another sandbox's call could use.
        """
        share = self._shares.get(sandbox_key)
        if share is None:
            share = self._shares[sandbox_key] = _Share(anyio.CapacityLimiter(self.per_sandbox))
        share.users += 1
        try:
            async with share.limiter:
                return await self.run_server_work(func, *args, **kwargs)
        finally:
            share.users -= 1
            if share.users == 0:  # the last user drops it: no limiter per past sandbox
                del self._shares[sandbox_key]

    async def run_server_work(self, func: Callable[P, T], *args: P.args, **kwargs: P.kwargs) -> T:
        """The server's own work on a tenant's tree (the disk budget's measurement),
        within the total but outside the sandbox's share: the sandbox's own flood of
        calls must not put off the check that would stop its commands."""
        async with self._total:
            thread = asyncio.get_running_loop().run_in_executor(
                self._executor, functools.partial(func, *args, **kwargs)
            )
            return await _until_returned(thread)

    def for_sandbox(self, sandbox_key: str) -> InThread:
        """``run`` bound to one sandbox key (what a call's context carries)."""
        return functools.partial(self.run, sandbox_key)

    def sandboxes(self) -> int:
        """How many sandboxes have a call running or waiting (their limiters are kept)."""
        return len(self._shares)

    def busy(self) -> int:
        """Threads in use by tenant work, all sandboxes together."""
        return int(self._total.borrowed_tokens)


async def _until_returned(thread: asyncio.Future[T]) -> T:
    """The thread's result; a cancelled caller is told so only once the thread has
    returned, so its places stay taken for as long as the thread runs."""
    cancelled: asyncio.CancelledError | None = None
    while not thread.done():
        try:
            await asyncio.wait({thread})  # a cancelled wait leaves the thread alone
        except asyncio.CancelledError as exc:
            cancelled = exc
    if cancelled is not None:
        raise cancelled
    return thread.result()
