"""Destroyed experiments' containers, removed after ``destroy_experiment`` has answered.

A container's removal at the engine (kill, wait, unmount, forget) and the walk that
measures the workspace's changes were most of a destroy's time on a 5,000-file
project (2 cores, 2026-12-06, quiet): the removal 50 to 140 ms, the walk of the
workspace and its baseline pack 50 ms on dir slots and 75 ms on zfs-fuse (every
file's stat a round trip to a daemon in user space), and run side by side with the
removal in the background the destroy still took 169 ms (dir) and 173 ms (zfs). The
destroy now records the findings it has (jobs, tests, exit codes),
moves the folder into its slot's trash and answers; here the container is removed,
then the change size measured on the folder in the trash (nothing can change it
any more) and added to the findings, and only then is the folder deleted (a live
container still mounts it).

Bounds. A destroy begins only while its sandbox has fewer than
``MAX_PENDING_PER_SANDBOX`` removals in progress, and otherwise waits for one of its
own first, so no tenant piles up engine work (destroys of one sandbox that begin
together may pass it by how many they are, at most its calls in flight). A
container being removed stays in its sandbox's share at the engine (the admission
lists it), and its folder stays on the slot's disk (the quota or the disk budget
counts it), until each is gone; a create, and the reset of the slot, wait for the
sandbox's pending removals first (``settled``), so a sandbox at its container cap
that destroys one is not refused by its own leftover.

The walk runs in the sandbox's own thread share, as the destroy's walk did. A
restart forgets what is pending here: the containers of destroyed experiments are
orphans to the start-up sweep (``ExperimentManager.recover``), their folders are
deleted by the trash's sweep, which runs after it, and their findings keep
``changes_pending`` (no change size).
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, Sequence

import structlog

from app.errors import ServiceError

log = structlog.get_logger(__name__)

# Removals in progress per sandbox: MAX_EXPERIMENTS (4), so a sandbox destroying all it
# holds at once waits for none of them.
MAX_PENDING_PER_SANDBOX = 4
# How long a create or a slot's reset waits for the sandbox's pending removals.
REMOVAL_WAIT_S = 30.0
# The engine answers 500 under load: a removal is tried again after these pauses.
RETRY_DELAYS_S: Sequence[float] = (1.0, 5.0)


class DeferredRemovals:
    """Container removals that go on after the caller's answer, bounded per sandbox.

    Args:
        remove: Removes one container (``SandboxBackend.remove``).
        per_sandbox: Removals in progress per sandbox at most.
        retry_delays_s: Pauses before the second, third, ... attempt.
    """

    def __init__(
        self,
        remove: Callable[[str], Awaitable[None]],
        *,
        per_sandbox: int = MAX_PENDING_PER_SANDBOX,
        retry_delays_s: Sequence[float] = RETRY_DELAYS_S,
    ) -> None:
        self._remove = remove
        self._per_sandbox = per_sandbox
        self._delays = tuple(retry_delays_s)
        self._pending: dict[str, set[asyncio.Task[bool]]] = {}

    def pending(self, sandbox_key: str) -> int:
        return sum(not t.done() for t in self._pending.get(sandbox_key, ()))

    async def turn(self, sandbox_key: str) -> None:
        """Wait while the sandbox has ``per_sandbox`` removals in progress (a destroy
        waits here before it changes anything, so a caller that hangs up meanwhile
        leaves nothing half done)."""
        while (mine := self._running(sandbox_key)) and len(mine) >= self._per_sandbox:
            await asyncio.wait(mine, return_when=asyncio.FIRST_COMPLETED)

    def begin(
        self,
        sandbox_key: str,
        container_id: str,
        then: Callable[[bool], Awaitable[None]] | None = None,
    ) -> asyncio.Task[bool]:
        """Remove ``container_id``, then run ``then`` (told whether it is gone); the task
        says whether it is gone, once both are done. Takes no await: once the caller
        has recorded the destroy, nothing can cancel it in between."""
        task = asyncio.create_task(
            self._teardown(container_id, then), name=f"remove-{container_id[:12]}"
        )
        self._pending.setdefault(sandbox_key, set()).add(task)
        task.add_done_callback(lambda t: self._forget(sandbox_key, t))
        return task

    async def settled(self, sandbox_key: str, timeout_s: float = REMOVAL_WAIT_S) -> None:
        """Wait, at most ``timeout_s``, until the sandbox's removals are done."""
        mine = self._running(sandbox_key)
        if mine:
            await asyncio.wait(mine, timeout=timeout_s)

    async def idle(self) -> None:
        """Wait until every removal started so far is done (tests, benches)."""
        while tasks := [t for ts in self._pending.values() for t in ts if not t.done()]:
            await asyncio.wait(tasks)

    async def close(self, timeout_s: float = 10.0) -> None:
        """At shutdown: wait for removals in progress, then stop them (the next start's
        sweep removes what is left)."""
        tasks = [t for ts in self._pending.values() for t in ts if not t.done()]
        if not tasks:
            return
        _, not_done = await asyncio.wait(tasks, timeout=timeout_s)
        for task in not_done:
            task.cancel()
        if not_done:
            await asyncio.wait(not_done)
            log.warning("experiment.removals_abandoned", count=len(not_done))

    def _running(self, sandbox_key: str) -> list[asyncio.Task[bool]]:
        return [t for t in self._pending.get(sandbox_key, ()) if not t.done()]

    def _forget(self, sandbox_key: str, task: asyncio.Task[bool]) -> None:
        mine = self._pending.get(sandbox_key)
        if mine is not None:
            mine.discard(task)
            if not mine:
                del self._pending[sandbox_key]

    async def _teardown(
        self, container_id: str, then: Callable[[bool], Awaitable[None]] | None
    ) -> bool:
        removed = await self._attempts(container_id)
        if then is not None:
            try:
                await then(removed)
            except Exception:
                log.exception("experiment.teardown_step_failed", container_id=container_id[:12])
        return removed

    async def _attempts(self, container_id: str) -> bool:
        """Never raises (nobody waits for the answer): False when the container may
        still be there, for the next start's sweep."""
        for attempt, delay in enumerate((0.0, *self._delays)):
            await asyncio.sleep(delay)
            try:
                await self._remove(container_id)
            except ServiceError as exc:
                log.warning(
                    "experiment.removal_failed",
                    container_id=container_id[:12],
                    attempt=attempt + 1,
                    code=exc.code,
                    reason=exc.message,
                )
                continue
            except Exception:
                log.exception("experiment.removal_crashed", container_id=container_id[:12])
                return False
            return True
        return False
