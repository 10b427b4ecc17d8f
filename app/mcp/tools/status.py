"""``sandbox_status``: what the caller holds on this server, the lightest call.

Thin by design, as every tool module: it declares its output model and hands the work
to the ``StatusView`` (``app/mcp/status_view.py``) through the ``ToolRunner``.
"""

from __future__ import annotations

from typing import Annotated

from mcp.types import CallToolResult

from app.mcp.envelope import enveloped
from app.mcp.status_view import SandboxStatus
from app.mcp.tools.common import READ_ONLY, VIEW_TOOL_META, ToolDeps, tool
from jail.context import CallContext


@tool(
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
    light=True,  # the pool's view (memory, or one read of the shared pool's database)
)
async def sandbox_status(deps: ToolDeps) -> Annotated[CallToolResult, enveloped(SandboxStatus)]:
    async def body(call: CallContext) -> SandboxStatus:
        # Read from the shared state when several processes share the pool.
        return await deps.status.of(call.sandbox_key)

    return await deps.runner.run("sandbox_status", body, takes_slot=False, sees_slot=False)
