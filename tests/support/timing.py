"""Clock checks whose verdict does not depend on how busy the machine is.

A busy machine does not make an operation do more work; it adds pauses to some
runs of it (another process had the CPU, a cache was cold). The shortest of several
runs is the operation's own cost, so bounds are checked on that, or against a
reference measured the same way in the same test (a floor that slows down with the
machine). A broken operation (a scan, a wait, a synchronous delete) is slow on
every run, so its shortest run still fails the check.
"""

from __future__ import annotations

import time
from collections.abc import Awaitable, Callable


def fastest(
    action: Callable[[], object], runs: int = 5, *, before: Callable[[], object] | None = None
) -> float:
    """The shortest wall time of ``runs`` runs of ``action``, in seconds; ``before``
    (untimed) prepares each run."""
    best = float("inf")
    for _ in range(runs):
        if before is not None:
            before()
        started = time.perf_counter()
        action()
        best = min(best, time.perf_counter() - started)
    return best


async def fastest_async(
    action: Callable[[], Awaitable[object]],
    runs: int = 5,
    *,
    before: Callable[[], object] | None = None,
) -> float:
    """``fastest`` for a coroutine function; ``before`` (untimed) prepares each run."""
    best = float("inf")
    for _ in range(runs):
        if before is not None:
            before()
        started = time.perf_counter()
        await action()
        best = min(best, time.perf_counter() - started)
    return best
