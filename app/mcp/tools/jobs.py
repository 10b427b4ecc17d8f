"""The command tools: run a command in an experiment, and follow, read or cancel its job.

A command runs as a job (``JobView``): synchronously, up to a wait, or in the
background; the job tools take no sandbox slot, so an agent can poll, page through
output or cancel while another call holds one. Thin by design, as every tool module:
each declares its parameters and output model and hands the work to
``ExperimentManager`` through the ``ToolRunner``.
"""

from __future__ import annotations

from typing import Annotated, Literal

from mcp.server.mcpserver import Context
from mcp.types import CallToolResult
from pydantic import Field

from app.experiments.views import MAX_PAGE_CHARS, JobView
from app.mcp.envelope import enveloped
from app.mcp.tools import seed_names as seed
from app.mcp.tools.common import (
    READ_ONLY,
    Command,
    EnvRequests,
    ExperimentId,
    JobId,
    Seconds,
    SeedTimeout,
    ToolDeps,
    hints,
    progress,
    run_job,
    tool,
)
from jail import CallContext

EXECUTE = (
    "Run a shell command (/bin/sh -c) inside an experiment's container, in /workspace or "
    "`workdir`.\n\n"
    "USE THIS for anything you would otherwise run in a terminal: installs, builds, "
    "scripts, one-off exploration. Prefer run_tests for the test suite.\n\n"
    "RETURNS exit code, stdout and stderr and duration; a long output comes as an excerpt "
    "(its start and its end, where errors are; read it whole with get_job_result `offset`). "
    "A non-zero "
    "exit is a normal result to read, not an error. `background=true` returns a job id at "
    "once (then get_job_status / get_job_result); a synchronous call still running after "
    "45 s also returns its job id and keeps running to its timeout.\n\n"
    "NEVER runs on the host or reaches your project: only the experiment's copy."
)


@tool(
    title="Run a command in an experiment",
    description=EXECUTE,
    # An arbitrary command may delete or overwrite anything in the experiment's copy
    # (never outside it); it reaches the network only where egress is allowed.
    annotations=lambda deps: hints(
        read_only=False, destructive=True, idempotent=False, open_world=deps.egress
    ),
)
async def execute_experiment(
    deps: ToolDeps,
    experiment_id: ExperimentId,
    command: Command,
    background: bool = False,
    timeout_s: Annotated[
        Seconds | None, Field(description="Seconds; default the experiment's.")
    ] = None,
    env: EnvRequests = [],  # noqa: B006
    workdir: Annotated[
        str | None,
        Field(max_length=4096, description="A folder relative to /workspace to run in."),
    ] = None,
    timeout: SeedTimeout = None,  # noqa: ASYNC109 (the seed's name)
    ctx: Context | None = None,
) -> Annotated[CallToolResult, enveloped(JobView)]:
    async def start(call: CallContext, until_done: bool) -> JobView:
        seconds = seed.timeout(timeout_s, timeout)
        text = command
        if workdir is not None:
            workspace = await deps.manager.workspace(call, experiment_id)
            text = await seed.in_workdir(call.in_thread, workspace, workdir, command)
        return await deps.manager.execute(
            call,
            experiment_id,
            text,
            background=background,
            timeout_s=seconds,
            env=env,
            until_done=until_done,
        )

    return await run_job(deps, "execute_experiment", ctx, start)


@tool(
    title="Job status",
    description=(
        "The status of a job (a command started by execute_experiment or run_tests), "
        "without its output.\n\n"
        "USE THIS to poll a background command cheaply: is it still running, did it "
        "finish, with which exit code. Then call get_job_result for the output.\n\n"
        "RETURNS job id, experiment id, command, status (running, completed, failed, "
        "timeout, cancelled or lost), exit code and duration.\n\n"
        "NEVER waits, changes the job, or takes a sandbox slot."
    ),
    annotations=READ_ONLY,
)
async def get_job_status(
    deps: ToolDeps, job_id: JobId
) -> Annotated[CallToolResult, enveloped(JobView)]:
    return await deps.runner.run(
        "get_job_status", lambda call: deps.manager.job_status(call, job_id), takes_slot=False
    )


@tool(
    title="Job result",
    description=(
        "A job's result with its output, waiting up to `wait_s` seconds (at most 45) for "
        "it to finish.\n\n"
        "USE THIS after execute_experiment returned a job id (background=true, or a "
        "command that outlived the synchronous wait). Call it again while the status is "
        "still `running`. USE IT with `offset` to read a long output whole, page by page "
        "(each page's `end` is the next `offset`).\n\n"
        "RETURNS the same shape as execute_experiment: status, exit code, stdout and "
        "stderr (an excerpt, head and tail, when long), duration, and for run_tests jobs "
        "the parsed `tests`; with `offset`, one `page` of the stream instead.\n\n"
        "NEVER starts, stops or changes the job; waiting is its only effect."
    ),
    annotations=READ_ONLY,
)
async def get_job_result(
    deps: ToolDeps,
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

    return await deps.runner.run(
        "get_job_result",
        lambda call: deps.manager.job_result(call, job_id, wait_s, page),
        takes_slot=False,
        progress=progress(ctx),
    )


@tool(
    title="Cancel job",
    description=(
        "Cancel a running job: its whole process tree inside the container is killed.\n\n"
        "USE THIS when a command is stuck, runs far longer than it should, or is no "
        "longer needed. Safe on a job that already ended: it returns the final state "
        "untouched, with a note.\n\n"
        "RETURNS the job as it ended (status `cancelled`, and the output up to the kill).\n\n"
        "NEVER touches other jobs, the experiment's files or its container; the "
        "experiment stays usable."
    ),
    # Kills a running process (its work is lost); cancelling twice changes nothing more.
    annotations=hints(read_only=False, destructive=True, idempotent=True),
)
async def cancel_job(
    deps: ToolDeps, job_id: JobId
) -> Annotated[CallToolResult, enveloped(JobView)]:
    return await deps.runner.run(
        "cancel_job", lambda call: deps.manager.cancel_job(call, job_id), takes_slot=False
    )
