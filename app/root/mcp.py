"""How the composition root builds the tool layer: the MCP server with its tasks and
listen-stream caps, every tool and resource registered on one runner, and the
stateless ``/mcp`` endpoint in front of it."""

from __future__ import annotations

from mcp.server.mcpserver import MCPServer
from starlette.types import ASGIApp

from app.experiments.manager import ExperimentManager
from app.experiments.recovery.process_registry import ProcessRegistry
from app.mcp.allowed_hosts import transport_security
from app.mcp.resources import register_resources
from app.mcp.runner import Identity, ToolRunner
from app.mcp.server import SandboxMCPServer
from app.mcp.status_view import StatusView
from app.mcp.tasks.extension import TasksExtension
from app.mcp.tasks.mirror import TaskMirror, TaskRecords
from app.mcp.tasks.store import TaskStore
from app.mcp.tools import catalog
from app.mcp.tools.common import ToolDeps
from app.mcp.transport import StatelessTransport
from app.mcp.view.gate import ViewGate
from app.mcp.view.tools import build_view
from app.settings import ServerSettings, Settings
from app.version import service_version
from pool.leases import SlotPool

INSTRUCTIONS = (
    "sandbox-mcp gives you a private, disposable sandbox for running code. "
    "Every result carries `notes`: read them, they tell you when your sandbox was "
    "emptied, is ready, or how long it survives without activity."
)

# The test suite registers a tool of its own (a slot-taking probe) on the same runner.


def build_mcp_server(
    settings: Settings,
    identity: Identity,
    runner: ToolRunner,
    pool: SlotPool,
    manager: ExperimentManager,
    task_records: TaskRecords,
    registry: ProcessRegistry,
) -> SandboxMCPServer:
    calls = settings.mcp
    tasks = TaskStore(
        keep_s=calls.task_keep_s,
        max_per_sandbox=calls.max_tasks_per_sandbox,
        max_total=calls.max_tasks,
    )
    # Tasks mirrored to the database: tasks/get and tasks/cancel through any process.
    mirror = TaskMirror(task_records, registry, tasks)
    # The MCP Apps view: registered only when on, and offered by the gate only to the
    # requests that declare the extension (the gate also takes the view's _meta off the
    # tools that name it for everyone else, whether the view is on or not).
    view = (
        build_view(runner, manager, pool, public_url=settings.server.effective_public_url)
        if calls.apps_view
        else None
    )
    mcp = SandboxMCPServer(
        "sandbox-mcp",
        version=service_version(),
        instructions=INSTRUCTIONS,
        log_level=settings.server.log_level,
        extensions=[TasksExtension(identity, tasks, mirror), *([view] if view else [])],
    )
    app_only = [binding.kwargs["name"] for binding in view.tools()] if view else []
    mcp.middleware.append(ViewGate(enabled=view is not None, app_only_tools=app_only))
    mcp.cap_listen_streams(
        identity, per_sandbox=calls.max_listen_streams_per_sandbox, total=calls.max_listen_streams
    )
    # Egress decides the openWorldHint of the tools that can then reach the network.
    # Network "restricted" reaches the open world too (its allow-list of it).
    egress = settings.egress
    deps = ToolDeps(
        runner=runner,
        manager=manager,
        status=StatusView(pool),
        egress=egress.reaches_network,
        git_egress=egress.clones,
    )
    catalog.register(mcp, deps)
    register_resources(mcp, runner, manager)
    return mcp


def mcp_endpoint(mcp: MCPServer, server: ServerSettings, runner: ToolRunner) -> ASGIApp:
    """``/mcp``: stateless in both protocol eras, no request depends on an MCP session
    (``transport.py``); Host and Origin checked against the public URL; a large body
    measured in the caller's thread share before the SDK parses it."""
    return StatelessTransport(
        mcp.streamable_http_app(
            streamable_http_path="/mcp",
            stateless_http=True,
            transport_security=transport_security(
                server.effective_public_url, server.host, server.port
            ),
            host=server.host,
        ),
        threads=runner.threads,
        light_tools=catalog.light_tools(),
    )
