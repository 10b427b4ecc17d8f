"""Every tool of the server, in the order ``tools/list`` gives them, in one list.

Each is a module-level function over ``ToolDeps`` (``common.tool``); ``register`` gives
each its dependencies and adds it to the server. The MCP Apps view's app-only tools are
not here: the view registers its own, when it is on (``app/mcp/view/``).
"""

from __future__ import annotations

from mcp.server.mcpserver import MCPServer

from app.mcp.tools import evidence, experiments, files, jobs, status
from app.mcp.tools.common import ToolDeps, ToolFunction, spec_of

TOOLS: list[ToolFunction] = [
    status.sandbox_status,
    jobs.execute_experiment,
    jobs.get_job_status,
    jobs.get_job_result,
    jobs.cancel_job,
    experiments.create_experiment,
    experiments.get_experiment,
    experiments.list_experiments,
    experiments.destroy_experiment,
    experiments.check_sandbox_runtime,
    files.read_sandbox_file,
    files.write_sandbox_file,
    files.edit_sandbox_file,
    files.list_sandbox_files,
    files.search_sandbox,
    evidence.run_tests,
    evidence.inspect_changes,
    evidence.collect_artifacts,
    evidence.compare_experiments,
    evidence.map_project,
]


def register(server: MCPServer, deps: ToolDeps) -> None:
    """Add every tool to ``server``, each with ``deps``. Called once, by the root."""
    for function in TOOLS:
        spec = spec_of(function)
        server.add_tool(
            spec.bound(deps),
            name=spec.name,
            title=spec.title,
            description=spec.description,
            annotations=spec.annotations_for(deps),
            meta=spec.meta,
        )


def light_tools() -> frozenset[str]:
    """The tools declared light: their calls are served in one exchange."""
    return frozenset(spec_of(function).name for function in TOOLS if spec_of(function).light)
