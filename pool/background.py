"""Stopping a long-lived part's background task (the watchdog's ticks, the warm pool's
filling, recovery's polls...): cancel it and wait until it has unwound.

In ``pool/`` as the lowest package that runs such a task; ``app/`` uses it too.
"""

from __future__ import annotations

import asyncio
import contextlib


async def cancel_and_wait(task: asyncio.Task[None] | None) -> None:
    """Cancel ``task`` (None: nothing to stop) and wait for it to finish its cleanup."""
    if task is not None:
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task
