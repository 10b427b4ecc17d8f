"""The MCP tools and resources: the agent-facing surface, nothing else.

Each tool is a thin function: it declares its parameters and its output model
(the model becomes the tool's ``outputSchema``) and hands its body to the
``ToolRunner``, which owns identity, errors and the audit trail.
"""

from __future__ import annotations

from typing import Annotated

from mcp.server.mcpserver import MCPServer
from mcp.types import CallToolResult, ToolAnnotations
from pydantic import Field

from app.experiments.shelf import fingerprint
from app.mcp.envelope import ToolOutput, enveloped
from app.mcp.runner import ToolRunner
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
        description=(
            "Show what you hold on this server: your sandbox, whether a slot is leased to you, "
            "and how long an idle sandbox survives. Never takes a slot."
        ),
        annotations=ToolAnnotations(read_only_hint=True, open_world_hint=False),
    )
    async def sandbox_status() -> Annotated[CallToolResult, enveloped(SandboxStatus)]:
        async def body(call: CallContext) -> SandboxStatus:
            slot = pool.lease_of(call.sandbox_key)
            stats = pool.stats()
            return SandboxStatus(
                sandbox=fingerprint(call.sandbox_key),
                holds_slot=slot is not None,
                slot=slot.name if slot else None,
                queue_position=pool.position_of(call.sandbox_key),
                idle_timeout_s=int(pool.idle_timeout_s),
                pool_free=stats.free,
                pool_queued=stats.queued,
            )

        return await runner.run("sandbox_status", body, takes_slot=False)
