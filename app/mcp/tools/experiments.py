"""The experiment tools of the single-user Sandbox MCP, same names, over the manager.

Thin by design: each declares its parameters and output model and hands the
work to ``ExperimentManager`` through the ``ToolRunner``. No tool exposes a
Docker flag, a mount or a privilege, and no tool name starts with ``docker_``.
"""

from __future__ import annotations

from typing import Annotated, Literal

from mcp.server.mcpserver import Context, MCPServer
from mcp.types import CallToolResult, ToolAnnotations
from pydantic import BaseModel, Field

from app.experiments.creation import CreateRequest
from app.experiments.manager import ExperimentManager
from app.experiments.views import (
    MAX_PAGE_CHARS,
    CreatedExperiment,
    DestroyReport,
    ExperimentList,
    ExperimentView,
    JobView,
    RuntimeView,
)
from app.mcp.envelope import enveloped
from app.mcp.runner import Progress, ToolRunner
from app.mcp.tasks import running_as_task
from app.runtime.backend import Limits
from jail import CallContext

READ_ONLY = ToolAnnotations(read_only_hint=True, open_world_hint=False)


class GitRequest(BaseModel):
    url: Annotated[str, Field(min_length=1, max_length=2000, description="An https URL.")]
    ref: Annotated[
        str | None, Field(max_length=200, description="A branch, tag or commit; default HEAD.")
    ] = None


ExperimentId = Annotated[str, Field(max_length=64, description="An id from create_experiment.")]
JobId = Annotated[str, Field(max_length=64, description="A job id from execute_experiment.")]
Command = Annotated[str, Field(min_length=1, max_length=100_000, description="Run by /bin/sh -c.")]
EnvRequests = Annotated[
    list[Annotated[str, Field(max_length=32_768)]],
    Field(
        max_length=100,
        description=(
            "Environment for the command: NAME=value sets a literal; credential-shaped names "
            "(*_TOKEN, *_SECRET, *PASSWORD*, AWS_*, ...) are refused."
        ),
    ),
]


def register_experiment_tools(
    server: MCPServer, runner: ToolRunner, manager: ExperimentManager
) -> None:
    """Add the experiment tools to ``server``. Called once, by the composition root."""

    @server.tool(
        description=(
            "Create an experiment: a fresh, isolated container (no network by default) with a "
            "workspace at /workspace holding your project, from `files` (path -> text), from "
            "`git` (https URL and ref), from another experiment (`from_experiment`), or empty. "
            "`setup_commands` run in order and stop at the first failure. Returns the "
            "experiment id and the isolation applied."
        )
    )
    async def create_experiment(
        name: Annotated[str, Field(max_length=200)] = "",
        goal: Annotated[str, Field(max_length=4000, description="What you want to find out.")] = "",
        image: Annotated[
            str | None, Field(description="One of check_sandbox_runtime's images.")
        ] = None,
        files: Annotated[
            dict[str, str] | None,
            Field(description="Workspace-relative path -> file content (text)."),
        ] = None,
        project_path: Annotated[
            str | None, Field(description="Local mode only: a host folder to snapshot-copy.")
        ] = None,
        from_experiment: Annotated[
            str | None, Field(description="Copy this experiment's current workspace.")
        ] = None,
        git: Annotated[
            GitRequest | None,
            Field(description="Clone a repository (https) in a short-lived helper container."),
        ] = None,
        setup_commands: Annotated[list[Command], Field(max_length=50)] = [],  # noqa: B006
        network: Literal["none", "egress"] = "none",
        cpus: Annotated[float | None, Field(gt=0)] = None,
        memory_mb: Annotated[int | None, Field(gt=0)] = None,
        pids: Annotated[int | None, Field(gt=0)] = None,
        env: EnvRequests = [],  # noqa: B006
        ctx: Context | None = None,
    ) -> Annotated[CallToolResult, enveloped(CreatedExperiment)]:
        defaults = Limits()
        request = CreateRequest(
            name=name,
            goal=goal,
            image=image,
            files=files,
            project_path=project_path,
            from_experiment=from_experiment,
            git_url=git.url if git else None,
            git_ref=git.ref if git else None,
            setup_commands=tuple(setup_commands),
            network=network,
            limits=Limits(
                cpus=cpus or defaults.cpus,
                memory_mb=memory_mb or defaults.memory_mb,
                pids=pids or defaults.pids,
            ),
            env=tuple(env),
        )

        async def body(call: CallContext) -> CreatedExperiment:
            return await manager.create(call, request)

        return await runner.run("create_experiment", body, takes_slot=True, progress=_progress(ctx))

    @server.tool(
        description=(
            "Run a shell command in an experiment's /workspace. Returns exit code, stdout and "
            "stderr (each capped at 1 MB) and duration; a non-zero exit is a normal result. "
            "`background=true` returns a job id at once; a synchronous call that runs past "
            "45 s also returns its job id and keeps running to its own timeout."
        )
    )
    async def execute_experiment(
        experiment_id: ExperimentId,
        command: Command,
        background: bool = False,
        timeout_s: Annotated[float | None, Field(gt=0)] = None,
        env: EnvRequests = [],  # noqa: B006
        ctx: Context | None = None,
    ) -> Annotated[CallToolResult, enveloped(JobView)]:
        async def body(call: CallContext) -> JobView:
            return await manager.execute(
                call,
                experiment_id,
                command,
                background=background,
                timeout_s=timeout_s,
                env=env,
                until_done=running_as_task(),
            )

        return await runner.run(
            "execute_experiment", body, takes_slot=True, progress=_progress(ctx)
        )

    @server.tool(description="The status of a job (no output).", annotations=READ_ONLY)
    async def get_job_status(job_id: JobId) -> Annotated[CallToolResult, enveloped(JobView)]:
        async def body(call: CallContext) -> JobView:
            return await manager.job_status(call, job_id)

        return await runner.run("get_job_status", body, takes_slot=False)

    @server.tool(
        description="A job's result with its output, waiting up to wait_s (at most 45) for it.",
        annotations=READ_ONLY,
    )
    async def get_job_result(
        job_id: JobId,
        wait_s: Annotated[float, Field(ge=0, le=45)] = 30,
        offset: Annotated[
            int | None,
            Field(
                ge=0,
                description="Read the recorded output from this character on, one page at a "
                "time, instead of its excerpt (pass each page's `end` as the next offset).",
            ),
        ] = None,
        stream: Annotated[
            Literal["stdout", "stderr"], Field(description="Which output `offset` pages.")
        ] = "stdout",
        max_chars: Annotated[
            int, Field(ge=1, le=MAX_PAGE_CHARS, description="The most one page holds.")
        ] = 20_000,
        ctx: Context | None = None,
    ) -> Annotated[CallToolResult, enveloped(JobView)]:
        page = (stream, offset, max_chars) if offset is not None else None

        async def body(call: CallContext) -> JobView:
            return await manager.job_result(call, job_id, wait_s, page)

        return await runner.run("get_job_result", body, takes_slot=False, progress=_progress(ctx))

    @server.tool(description="Cancel a running job: its whole process tree is killed.")
    async def cancel_job(job_id: JobId) -> Annotated[CallToolResult, enveloped(JobView)]:
        async def body(call: CallContext) -> JobView:
            return await manager.cancel_job(call, job_id)

        return await runner.run("cancel_job", body, takes_slot=False)

    @server.tool(
        description="One experiment: state, isolation, and the commands run in it.",
        annotations=READ_ONLY,
    )
    async def get_experiment(
        experiment_id: ExperimentId,
    ) -> Annotated[CallToolResult, enveloped(ExperimentView)]:
        async def body(call: CallContext) -> ExperimentView:
            return await manager.get(call, experiment_id)

        return await runner.run("get_experiment", body, takes_slot=False)

    @server.tool(description="Your experiments, destroyed ones included.", annotations=READ_ONLY)
    async def list_experiments() -> Annotated[CallToolResult, enveloped(ExperimentList)]:
        async def body(call: CallContext) -> ExperimentList:
            return ExperimentList(experiments=await manager.list_all(call))

        return await runner.run("list_experiments", body, takes_slot=False)

    @server.tool(
        description=(
            "Destroy an experiment: its container and files go, its record and findings stay "
            "(comparable later). Idempotent: returns the final report."
        )
    )
    async def destroy_experiment(
        experiment_id: ExperimentId,
    ) -> Annotated[CallToolResult, enveloped(DestroyReport)]:
        async def body(call: CallContext) -> DestroyReport:
            return await manager.destroy(call, experiment_id)

        return await runner.run("destroy_experiment", body, takes_slot=False)

    @server.tool(
        description=(
            "What the runtime offers: reachability, images, limits and network policy. "
            "Never takes a slot."
        ),
        annotations=READ_ONLY,
    )
    async def check_sandbox_runtime() -> Annotated[CallToolResult, enveloped(RuntimeView)]:
        async def body(call: CallContext) -> RuntimeView:
            return await manager.runtime()

        return await runner.run("check_sandbox_runtime", body, takes_slot=False)


def _progress(ctx: Context | None) -> Progress | None:
    # Queue position updates reach the client only if it asked for progress, and
    # never from a task: the response that would carry them has been sent.
    return ctx.report_progress if ctx is not None and not running_as_task() else None
