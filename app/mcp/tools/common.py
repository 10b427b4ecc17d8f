"""What the tool modules share: what every tool runs on (``ToolDeps``) and how it is
declared (``tool``), parameter types, annotation presets, progress, a command tool's call,
and a file tool's work on a workspace (``in_workspace``).

A tool is a module-level ``async def`` whose first parameter is ``deps: ToolDeps``; its
other parameters are the tool's input (the MCP SDK reads them, and its return annotation,
for the schemas). ``@tool(...)`` keeps its title, description, annotations and ``_meta``
beside it; ``app/mcp/tools/catalog.py`` lists every tool, in order, and registers each
with its ``deps`` bound (the composition root builds one ``ToolDeps``).

Annotations are hints a client acts on (Claude runs read-only tools without
asking, and its connector directory requires ``title``, ``readOnlyHint`` and
``destructiveHint``), so every tool states all four, from one of these presets.
"""

from __future__ import annotations

import functools
import inspect
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Annotated, Any, Concatenate, ParamSpec, TypeVar

from mcp.server.mcpserver import Context
from mcp.types import CallToolResult, ToolAnnotations
from pydantic import Field

from app.experiments.manager import ExperimentManager
from app.experiments.views import JobView
from app.mcp.runner import Progress, ToolRunner
from app.mcp.status_view import StatusView
from app.mcp.tasks.extension import running_as_task
from jail import CallContext


@dataclass(frozen=True)
class ToolDeps:
    """What the tools run on, built once by the composition root.

    ``egress`` and ``git_egress``: whether this server lets experiments, or the clones of
    create_experiment, out to the network; the tools that can then reach it say so
    (``openWorldHint``).
    """

    runner: ToolRunner
    manager: ExperimentManager
    status: StatusView
    egress: bool = False
    git_egress: bool = False


ToolFunction = Callable[..., Awaitable[CallToolResult]]
F = TypeVar("F", bound=ToolFunction)
P = ParamSpec("P")
T = TypeVar("T")


async def in_workspace(
    deps: ToolDeps,
    call: CallContext,
    experiment_id: str,
    work: Callable[Concatenate[Path, P], T],
    *args: P.args,
    **kwargs: P.kwargs,
) -> T:
    """``work(workspace, *args, **kwargs)`` on the experiment's workspace folder, in a
    thread of the caller's sandbox's share (a walk of a tenant's tree must not hold the
    event loop, nor more threads than the sandbox's share)."""
    workspace = await deps.manager.workspace(call, experiment_id)
    return await call.in_thread(work, workspace, *args, **kwargs)


@dataclass(frozen=True)
class ToolSpec:
    """A tool as declared: its function and what ``tools/list`` says of it. Annotations
    that depend on the server (``openWorldHint`` where egress is on) are a function of
    its ``ToolDeps``."""

    function: ToolFunction
    title: str
    description: str
    annotations: ToolAnnotations | Callable[[ToolDeps], ToolAnnotations]
    meta: dict[str, Any] | None = None
    # Answers from what the server holds, never waits for a slot, a container or a
    # tenant, sends no progress: served in one exchange (app/mcp/light_calls.py).
    light: bool = False

    @property
    def name(self) -> str:
        return self.function.__name__

    def bound(self, deps: ToolDeps) -> ToolFunction:
        """The function with ``deps`` given: what the SDK registers (its signature, the
        tool's input, is the function's less its first parameter)."""
        function = self.function
        signature = inspect.signature(function, eval_str=True)
        _, *inputs = signature.parameters.values()

        @functools.wraps(function)
        async def call(*args: Any, **kwargs: Any) -> CallToolResult:
            return await function(deps, *args, **kwargs)

        call.__signature__ = signature.replace(parameters=inputs)  # type: ignore[attr-defined]
        call.__annotations__ = {
            **{p.name: p.annotation for p in inputs},
            "return": signature.return_annotation,
        }
        return call

    def annotations_for(self, deps: ToolDeps) -> ToolAnnotations:
        return (
            self.annotations
            if isinstance(self.annotations, ToolAnnotations)
            else (self.annotations(deps))
        )


def tool(
    *,
    title: str,
    description: str,
    annotations: ToolAnnotations | Callable[[ToolDeps], ToolAnnotations],
    meta: dict[str, Any] | None = None,
    light: bool = False,
) -> Callable[[F], F]:
    """Declare a tool: its spec rides on the function (``spec_of``), which stays callable
    as written (with its ``deps``), e.g. from a test. ``light``: see ``ToolSpec.light``."""

    def declare(function: F) -> F:
        function.__tool_spec__ = ToolSpec(  # type: ignore[attr-defined]
            function, title, description, annotations, meta, light
        )
        return function

    return declare


def spec_of(function: ToolFunction) -> ToolSpec:
    spec: ToolSpec = function.__tool_spec__  # type: ignore[attr-defined]
    return spec


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
    deps: ToolDeps,
    name: str,
    ctx: Context | None,
    start: Callable[[CallContext, bool], Awaitable[JobView]],
) -> Awaitable[CallToolResult]:
    """A command tool's call (execute_experiment, run_tests): it holds the sandbox's slot,
    reports progress, and ``start`` is told to wait for the job's end (its second
    argument) when the call runs as an MCP task."""

    async def body(call: CallContext) -> JobView:
        return await start(call, running_as_task())

    return deps.runner.run(name, body, takes_slot=True, progress=progress(ctx))


# The MCP Apps view (``app/mcp/view/``) and the ``_meta`` of the tools whose results it
# shows (get_experiment, inspect_changes, compare_experiments, sandbox_status): here,
# beside the other things the tools share, so the tools need nothing of the view (the
# view builds on the tools). The gate takes both keys off for a client that did not
# declare the extension, or when the view is turned off; ``LEGACY_URI_KEY`` is the
# flat key claude.ai still reads beside ``_meta.ui``.
VIEW_URI = "ui://sandbox-mcp/view.html"
LEGACY_URI_KEY = "ui/resourceUri"
VIEW_TOOL_META: dict[str, Any] = {"ui": {"resourceUri": VIEW_URI}, LEGACY_URI_KEY: VIEW_URI}
