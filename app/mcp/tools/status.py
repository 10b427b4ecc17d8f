"""The MCP tools and resources: the agent-facing surface, nothing else.

Each tool is a thin function: it declares its parameters and its output model
(the model becomes the tool's ``outputSchema``) and hands its body to the
``ToolRunner``, which owns identity, errors and the audit trail.
"""

from __future__ import annotations

from typing import Annotated

from mcp.server.mcpserver import MCPServer
from mcp.types import CallToolResult
from pydantic import Field

from app.experiments.evidence.shelf import fingerprint
from app.mcp.envelope import ToolOutput, enveloped
from app.mcp.runner import ToolRunner
from app.mcp.tools.common import READ_ONLY, VIEW_TOOL_META
from jail.context import CallContext
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


def register_tools(server: MCPServer, runner: ToolRunner, pool: SlotPool) -> None:
    """Add every tool to ``server``. Called once, by the composition root."""
    status = StatusView(pool)

    @server.tool(
        title="Sandbox status",
        meta=VIEW_TOOL_META,  # the MCP Apps view shows this result
        description=(
            "What you hold on this server: your sandbox (a short fingerprint), whether a "
            "sandbox slot is leased to you, your place in the queue if you are waiting, and "
            "how long an idle sandbox survives.\n\n"
            "USE THIS when a call answered that you are queued, to see your place without "
            "joining the queue again, or to learn how long your work survives idle.\n\n"
            "RETURNS sandbox, holds_slot, slot, queue_position, idle_timeout_s, and the "
            "server-wide free slots and queue length.\n\n"
            "NEVER takes a slot, joins the queue or changes anything."
        ),
        annotations=READ_ONLY,
    )
    async def sandbox_status() -> Annotated[CallToolResult, enveloped(SandboxStatus)]:
        async def body(call: CallContext) -> SandboxStatus:
            # Read from the shared state when several processes share the pool.
            return await status.of(call.sandbox_key)

        return await runner.run("sandbox_status", body, takes_slot=False, sees_slot=False)
