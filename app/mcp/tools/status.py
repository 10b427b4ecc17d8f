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

from app.experiments.shelf import fingerprint
from app.mcp.envelope import ToolOutput, enveloped
from app.mcp.runner import ToolRunner
from app.mcp.tools._common import READ_ONLY
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


def register_tools(server: MCPServer, runner: ToolRunner, pool: SlotPool) -> None:
    """Add every tool to ``server``. Called once, by the composition root."""

    @server.tool(
        title="Sandbox status",
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
            view = await pool.view(call.sandbox_key)
            slot, stats = view.slot, view.stats
            return SandboxStatus(
                sandbox=fingerprint(call.sandbox_key),
                holds_slot=slot is not None,
                slot=slot.name if slot else None,
                queue_position=view.queue_position,
                idle_timeout_s=int(pool.idle_timeout_s),
                pool_free=stats.free,
                pool_queued=stats.queued,
            )

        return await runner.run("sandbox_status", body, takes_slot=False, sees_slot=False)
