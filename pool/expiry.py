"""What the idle watchdog asks of the pool each tick: take back idle leases, lapsed
reservations and silent queue places, and count running jobs as activity."""

from __future__ import annotations

from collections.abc import Callable

from pool._pool_base import log
from pool.handover import HandingOverPool
from pool.state import PoolChanges


class ExpiringPool(HandingOverPool):
    """``expire`` and ``keep_busy_alive`` (``pool.watchdog`` calls them)."""

    async def expire(self, is_busy: Callable[[str], bool] = lambda _: False) -> int:
        """Take back what has been idle for ``idle_timeout_s``; the watchdog calls this.

        Idle leases (unless ``is_busy`` says a job runs), unclaimed reservations and
        silent queue places expire. Returns how many things expired.
        """
        expired = 0
        idle_keys: list[str] = []
        async with self._locked() as tx:
            now = self._clock()
            deadline = now - self.idle_timeout_s
            for index, last in list(self._idle_leases.items()):
                if last > deadline:
                    break
                key = self._slots[index].sandbox_key
                assert key is not None
                if is_busy(key):
                    self._touch_locked(key, index, now)  # a running job is activity
                else:
                    idle_keys.append(key)
            changes = PoolChanges()
            for key, seen in list(self._idle_queue.items()):
                if seen > deadline:
                    break
                del self._idle_queue[key], self._queue[key]
                self._dirty_seen.pop(key, None)
                changes.drop_queue.append(key)
                self._event("dequeued", key)
                expired += 1
            granted: list[str] = []
            for index, until in list(self._reservations.items()):
                if until > now:
                    break
                # Nobody claimed it, so nothing was written: pass it on as it is.
                lapsed = self._slots[index].sandbox_key
                self._by_key.pop(lapsed or "", None)
                del self._reservations[index]
                self._event("lapsed", lapsed, slot=index)
                granted += self._hand_on_locked(index, now, changes)
                expired += 1
            if changes:
                await tx.apply(changes)
            tx.announce(granted)
        await self._announce(granted)
        for key in idle_keys:
            expired += await self._release(key, note="emptied", idle_since=deadline)
        if self._shared is not None:
            expired += await self.resume_resets()
        if expired:
            log.info("pool.expired", count=expired)
        return expired

    async def keep_busy_alive(self, is_busy: Callable[[str], bool]) -> None:
        """Count this process's running jobs as activity (each tick, every process: on a
        shared state the elected watchdog cannot see another process's jobs)."""
        for key in self.leased_keys():
            if is_busy(key):
                self.touch(key)
