"""The real server plus one slot-taking probe tool, for end-to-end tests of the pool.

Until the experiment tools exist, this is how the suite drives the slot-taking
path over HTTP: `python tests/support/probe_app.py` behaves like `sandbox-mcp
serve` (same settings, same wiring) with one extra tool, `probe_sandbox`.
"""

from __future__ import annotations

import asyncio
import os
from typing import Annotated

import uvicorn
from mcp.server.mcpserver import Context, MCPServer
from mcp.types import CallToolResult
from pydantic import Field

from app.mcp.envelope import ToolOutput, enveloped
from app.mcp.runner import ToolRunner
from app.ops.admin import preflight
from app.root.main import build_http_app, build_services
from app.settings import load_settings
from jail import CallContext, Jail


class ProbeResult(ToolOutput):
    slot_root: str
    files: list[str] = Field(default_factory=list)


def register_probe(server: MCPServer, runner: ToolRunner) -> None:
    @server.tool(description="Test probe: takes a slot, writes a file there, lists the files.")
    async def probe_sandbox(
        write: str = "", ctx: Context | None = None
    ) -> Annotated[CallToolResult, enveloped(ProbeResult)]:
        async def body(call: CallContext) -> ProbeResult:
            assert call.slot_root is not None
            with Jail.open(call.slot_root) as jail:
                if write:
                    jail.write_bytes(write, b"probe")
                names = sorted(info.path for info in jail.list_dir("."))
            return ProbeResult(slot_root=call.slot_root.name, files=names)

        progress = ctx.report_progress if ctx is not None else None
        return await runner.run("probe_sandbox", body, takes_slot=True, progress=progress)


def main() -> None:
    settings = load_settings()
    asyncio.run(preflight(settings))
    services = build_services(settings)
    register_probe(services.mcp, services.runner)
    app = build_http_app(services)
    uvicorn.run(app, host=settings.server.host, port=settings.server.port, log_config=None)


if __name__ == "__main__":
    os.environ.setdefault("SANDBOX_MCP_AUTH", "oauth")
    main()
