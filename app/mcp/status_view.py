"""``sandbox_status``'s answer (``SandboxStatus``) and its cache per key (``StatusView``).

Beside the tools rather than among them: the tools' dependencies (``ToolDeps``) hold the
one ``StatusView`` the composition root builds.
"""

from __future__ import annotations

from pydantic import Field

from app.experiments.evidence.shelf import fingerprint
from app.mcp.envelope import ToolOutput
from pool.leases import SlotPool


class SandboxStatus(ToolOutput):
    sandbox: str = Field(description="A short, non-secret fingerprint of your sandbox key.")
    holds_slot: bool = Field(description="Whether a sandbox slot is currently leased to you.")
    slot: str | None = Field(default=None, description="The leased slot's name, if any.")
    queue_position: int | None = Field(
        default=None, description="Your place in the waiting queue, if you are waiting."
    )
    idle_timeout_s: int = Field(
        description="Seconds of inactivity after which your sandbox is emptied and its slot freed."
    )
    pool_free: int = Field(description="Slots free right now, server-wide.")
    pool_queued: int = Field(description="Callers waiting for a slot right now, server-wide.")


class StatusView:
    """``sandbox_status``'s answer for a key, kept until the pool changes.

    A light call's share of the work: building the answer (the pool's view, the key's
    fingerprint, the model) cost about as much as the rest of the tool's body. It
    depends only on the pool's memory, so it is kept per key while the pool's
    ``view_version`` stays the same, and never on a shared pool (another process may
    change it at any time, so there each call reads the database).
    """

    MAX_KEYS = 4096  # a bound on the memory: past it, the cache starts over

    def __init__(self, pool: SlotPool) -> None:
        self._pool = pool
        self._version: int | None = None
        self._answers: dict[str, SandboxStatus] = {}

    async def of(self, key: str) -> SandboxStatus:
        version = self._pool.view_version()
        if version is None:
            return await self._build(key)
        if version != self._version:
            self._answers.clear()
            self._version = version
        answer = self._answers.get(key)
        if answer is None:
            answer = await self._build(key)
            # Kept only if nothing changed while it was built (a view reads no storage
            # on a private pool, but the next change may land while this one waits).
            if self._pool.view_version() == version:
                if len(self._answers) >= self.MAX_KEYS:
                    self._answers.clear()
                self._answers[key] = answer
        return answer

    async def _build(self, key: str) -> SandboxStatus:
        view = await self._pool.view(key)
        slot, stats = view.slot, view.stats
        return SandboxStatus(
            sandbox=fingerprint(key),
            holds_slot=slot is not None,
            slot=slot.name if slot else None,
            queue_position=view.queue_position,
            idle_timeout_s=int(self._pool.idle_timeout_s),
            pool_free=stats.free,
            pool_queued=stats.queued,
        )
