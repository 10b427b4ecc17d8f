"""What the tool modules share: parameter types, annotation presets, progress, a
command tool's call.

Annotations are hints a client acts on (Claude runs read-only tools without
asking, and its connector directory requires ``title``, ``readOnlyHint`` and
``destructiveHint``), so every tool states all four, from one of these presets.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Annotated, Any

from mcp.server.mcpserver import Context
from mcp.types import CallToolResult, ToolAnnotations
from pydantic import Field

from app.experiments.views import JobView
from app.mcp.runner import Progress, ToolRunner
from app.mcp.tasks.extension import running_as_task
from jail import CallContext

ExperimentId = Annotated[str, Field(max_length=64, description="An id from create_experiment.")]
JobId = Annotated[str, Field(max_length=64, description="A job id from execute_experiment.")]
Command = Annotated[str, Field(min_length=1, max_length=100_000, description="Run by /bin/sh -c.")]
EnvRequests = Annotated[
    list[Annotated[str, Field(max_length=32_768)]],
    Field(
        max_length=100,
        description=(
            "Environment for the command: NAME=value sets a literal; NAME alone forwards the "
            "server's value (local mode only). Credential-shaped names (*_TOKEN, *_SECRET, "
            "*PASSWORD*, AWS_*, ...) are refused."
        ),
    ),
]
# A wall clock; above the operator's ceiling it is clamped (and the agent told), not refused.
Seconds = Annotated[float, Field(gt=0)]
# The seed's name for timeout_s (see seed_names.timeout).
SeedTimeout = Annotated[Seconds | None, Field(description="= timeout_s, seconds.")]


def hints(
    *, read_only: bool, destructive: bool, idempotent: bool, open_world: bool = False
) -> ToolAnnotations:
    """All four hints, always set: a client reads a missing one as its worst case."""
    return ToolAnnotations(
        read_only_hint=read_only,
        destructive_hint=destructive,
        idempotent_hint=idempotent,
        open_world_hint=open_world,
    )


# Looks at the caller's sandbox and changes nothing; the same call answers the same.
READ_ONLY = hints(read_only=True, destructive=False, idempotent=True)


def progress(ctx: Context | None) -> Progress | None:
    # Progress reaches the client only if it asked for it, and never from a task: the
    # response that would carry it has been sent.
    return ctx.report_progress if ctx is not None and not running_as_task() else None


def run_job(
    runner: ToolRunner,
    tool: str,
    ctx: Context | None,
    start: Callable[[CallContext, bool], Awaitable[JobView]],
) -> Awaitable[CallToolResult]:
    """A command tool's call (execute_experiment, run_tests): it holds the sandbox's slot,
    reports progress, and ``start`` is told to wait for the job's end (its second
    argument) when the call runs as an MCP task."""

    async def body(call: CallContext) -> JobView:
        return await start(call, running_as_task())

    return runner.run(tool, body, takes_slot=True, progress=progress(ctx))


# The MCP Apps view (``app/mcp/view/``) and the ``_meta`` of the tools whose results it
# shows (get_experiment, inspect_changes, compare_experiments, sandbox_status): here,
# beside the other things the tools share, so the tools need nothing of the view (the
# view builds on the tools). The gate takes both keys off for a client that did not
# declare the extension, or when the view is turned off; ``LEGACY_URI_KEY`` is the
# flat key claude.ai still reads beside ``_meta.ui``.
VIEW_URI = "ui://sandbox-mcp/view.html"
LEGACY_URI_KEY = "ui/resourceUri"
VIEW_TOOL_META: dict[str, Any] = {"ui": {"resourceUri": VIEW_URI}, LEGACY_URI_KEY: VIEW_URI}
