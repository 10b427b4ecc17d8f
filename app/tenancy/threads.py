"""Where a tenant's blocking work runs: worker threads that no tenant can hold alone.

File tools, project maps, change reports, artifact copies and disk measurements
walk and read a tenant's tree in a thread. On the event loop's default executor
(``asyncio.to_thread``: min(32, cpus + 4) threads, 6 on two cores) one tenant with
a dozen concurrent searches held every thread, and everyone else's calls, and the
server's own upkeep, queued behind them.

anyio ``CapacityLimiter``s bound it instead (FIFO, and a waiter that is cancelled
leaves the queue): one per sandbox key, so a sandbox runs at most ``per_sandbox``
calls at once and the rest of its calls wait their turn; one per sign-in address
(hosted mode), so the sandboxes one address may hold (20 by default) run at most
``per_address`` together; then one for all tenant work, sized so that several
addresses fit. The calls that
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
import contextlib
import functools
from collections.abc import AsyncIterator, Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import ParamSpec, TypeVar

import anyio

from jail.context import InThread

# Two calls at once per sandbox (a search beside a read), sixteen for all tenants:
# eight sandboxes' worth, while the default executor keeps its own for the upkeep;
# one address's sandboxes at most half of them.
DEFAULT_PER_SANDBOX = 2
DEFAULT_PER_ADDRESS = 8
DEFAULT_TOTAL = 16

P = ParamSpec("P")
T = TypeVar("T")


@dataclass
class _Share:
    """One sandbox's (or address's) limiter and how many calls hold or wait for it."""

    limiter: anyio.CapacityLimiter
    users: int = 0


class _Shares:
    """A limiter per key while a call of that key holds or waits for it, dropped by
    the key's last call (no limiter per past sandbox or address)."""

    def __init__(self, size: int) -> None:
        self.size = size
        self._by_key: dict[str, _Share] = {}

    @contextlib.asynccontextmanager
    async def place(self, key: str) -> AsyncIterator[None]:
        share = self._by_key.get(key)
        if share is None:
            share = self._by_key[key] = _Share(anyio.CapacityLimiter(self.size))
        share.users += 1
        try:
            async with share.limiter:
                yield
        finally:
            share.users -= 1
            if share.users == 0:
                del self._by_key[key]

    def __len__(self) -> int:
        return len(self._by_key)


class TenantThreads:
    """Runs tenants' blocking callables in worker threads, a bounded share each."""

    def __init__(
        self,
        *,
        total: int = DEFAULT_TOTAL,
        per_sandbox: int = DEFAULT_PER_SANDBOX,
        per_address: int | None = None,
    ) -> None:
        """``per_address`` None: an address is bounded by the total alone."""
        per_address = total if per_address is None else per_address
        if not 1 <= per_sandbox <= per_address <= total:
            raise ValueError("1 <= per_sandbox <= per_address <= total must hold")
        self.per_sandbox = per_sandbox
        self._total = anyio.CapacityLimiter(total)
        # Never queues: a call reaches it only holding one of the total's tokens.
        self._executor = ThreadPoolExecutor(max_workers=total, thread_name_prefix="tenant")
        self._sandboxes = _Shares(per_sandbox)
        self._addresses = _Shares(per_address)

    async def run(
        self, sandbox_key: str, func: Callable[P, T], *args: P.args, **kwargs: P.kwargs
    ) -> T:
        """``func(*args, **kwargs)`` in a worker thread, within ``sandbox_key``'s share
        (a sandbox with no sign-in address: local mode, or tests)."""
        return await self.run_as(sandbox_key, None, func, *args, **kwargs)

    async def run_as(
        self,
        sandbox_key: str,
        address: str | None,
        func: Callable[P, T],
        *args: P.args,
        **kwargs: P.kwargs,
    ) -> T:
        """``func(*args, **kwargs)`` in a worker thread, within ``sandbox_key``'s share
        and, when it has one, its sign-in ``address``'s.

        The places are taken narrowest first: a sandbox's waiting calls then never
        hold a place of its address, nor an address's one of the total, that another
        sandbox's call could use.
        """
        async with self._sandboxes.place(sandbox_key):
            if address is None:
                return await self.run_server_work(func, *args, **kwargs)
            async with self._addresses.place(address):
                return await self.run_server_work(func, *args, **kwargs)

    async def run_server_work(self, func: Callable[P, T], *args: P.args, **kwargs: P.kwargs) -> T:
        """The server's own work on a tenant's tree (the disk budget's measurement),
        within the total but outside the sandbox's share: the sandbox's own flood of
        calls must not put off the check that would stop its commands."""
        async with self._total:
            thread = asyncio.get_running_loop().run_in_executor(
                self._executor, functools.partial(func, *args, **kwargs)
            )
            return await _until_returned(thread)

    def for_sandbox(self, sandbox_key: str, address: str | None = None) -> InThread:
        """``run_as`` bound to one sandbox key and its sign-in address (what a call's
        context carries)."""
        return functools.partial(self.run_as, sandbox_key, address)

    def sandboxes(self) -> int:
        """How many sandboxes have a call running or waiting (their limiters are kept)."""
        return len(self._sandboxes)

    def addresses(self) -> int:
        """How many sign-in addresses have a call running or waiting."""
        return len(self._addresses)

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
