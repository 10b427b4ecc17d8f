"""The runtime's one way into worker threads (the Docker SDK blocks).

Two bounded pools behind one helper: short calls (create, exec set-up, inspect,
remove, ...) and output streams. A stream holds its thread for as long as the
command stays silent, so streams get their own limiter: many long, quiet
commands must never starve the calls that would kill them.
"""

from __future__ import annotations

import functools
from collections.abc import AsyncIterator, Callable, Iterator
from typing import ParamSpec, TypeVar

import anyio
import anyio.to_thread

P = ParamSpec("P")
T = TypeVar("T")


def _step(iterator: Iterator[T]) -> tuple[T] | None:
    try:
        return (next(iterator),)
    except StopIteration:
        return None


class Offload:
    """Runs blocking callables and iterators in worker threads, bounded."""

    def __init__(self, *, calls: int, streams: int) -> None:
        if calls < 1 or streams < 1:
            raise ValueError("calls and streams must be at least 1")
        self._calls = anyio.CapacityLimiter(calls)
        self._streams = anyio.CapacityLimiter(streams)

    async def call(self, func: Callable[P, T], *args: P.args, **kwargs: P.kwargs) -> T:
        """``func(*args, **kwargs)`` in a worker thread.

        Cancelling the caller waits for the call to return (SDK calls carry the
        client's own timeout), so a thread is never left running unaccounted.
        """
        return await anyio.to_thread.run_sync(
            functools.partial(func, *args, **kwargs), limiter=self._calls
        )

    async def iterate(self, iterator: Iterator[T]) -> AsyncIterator[T]:
        """Yield the items of a blocking iterator, each ``next()`` in a worker thread.

        A cancelled caller does not wait for a ``next()`` blocked on a silent
        stream: the thread is abandoned (and its slot freed) until the source is
        closed, which the owner of the stream must then do (for a Docker stream,
        ``CancellableStream.close()`` shuts its socket and the ``next()`` returns).
        """
        while True:
            step = await anyio.to_thread.run_sync(
                _step, iterator, limiter=self._streams, abandon_on_cancel=True
            )
            if step is None:
                return
            yield step[0]
