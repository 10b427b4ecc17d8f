"""The experiment tools of the single-user Sandbox MCP, same names, over the manager:
create, get, list and destroy an experiment, and what the runtime offers. Running a
command in one, and its jobs, are the command tools (:mod:`app.mcp.tools.jobs`),
registered with these.

Thin by design: each declares its parameters and output model and hands the
work to ``ExperimentManager`` through the ``ToolRunner``. No tool exposes a
Docker flag, a mount or a privilege, and no tool name starts with ``docker_``.
Seed 001's parameter names are accepted beside ours (see ``seed_names``).
"""

from __future__ import annotations

from typing import Annotated, Literal

from mcp.server.mcpserver import Context
from mcp.types import CallToolResult
from pydantic import BaseModel, Field

from app.errors import InvalidArgument
from app.experiments.creation import CreateRequest
from app.experiments.views import (
    CreatedExperiment,
    DestroyReport,
    ExperimentList,
    ExperimentView,
    RuntimeView,
)
from app.mcp.envelope import enveloped
from app.mcp.tasks.extension import running_as_task
from app.mcp.tools import seed_names as seed
from app.mcp.tools.common import (
    READ_ONLY,
    VIEW_TOOL_META,
    Command,
    EnvRequests,
    ExperimentId,
    Seconds,
    SeedTimeout,
    ToolDeps,
    hints,
    progress,
    tool,
)
from app.runtime.backend import Limits
from jail import CallContext


class GitRequest(BaseModel):
    url: Annotated[str, Field(min_length=1, max_length=2000, description="An https URL.")]
    ref: Annotated[
        str | None, Field(max_length=200, description="A branch, tag or commit; default HEAD.")
    ] = None


ListLimit = Annotated[int, Field(ge=1, le=200)]

CREATE = (
    "Create an experiment: a fresh, isolated container with the project in /workspace.\n\n"
    "USE THIS before anything you should not do on the user's machine: installing "
    "dependencies, a build, an upgrade, unfamiliar code, a fix you are unsure of. For "
    "several approaches, create one experiment each (a baseline plus candidates), then "
    "compare_experiments.\n\n"
    "The project comes from `files` (path -> text), `git` (https URL), `from_experiment` "
    "(a copy of another), `project_path` (local mode only; secrets are never copied), or "
    "nothing. `setup_commands` run in order and stop at the first failure.\n\n"
    "RETURNS the experiment_id and the isolation applied; read `warnings` (clamped limits).\n\n"
    "NEVER: network unless asked and allowed, host environment (hosted), host mounts, "
    "writes back to your project."
)


@tool(
    title="Create experiment",
    description=CREATE,
    # Adds a new experiment and touches no existing one; each call makes another.
    annotations=lambda deps: hints(
        read_only=False,
        destructive=False,
        idempotent=False,
        open_world=deps.egress or deps.git_egress,
    ),
)
async def create_experiment(
    deps: ToolDeps,
    name: Annotated[str, Field(max_length=200)] = "",
    goal: Annotated[
        str | None, Field(max_length=4000, description="What you want to find out.")
    ] = None,
    image: Annotated[
        str | None, Field(max_length=200, description="One of check_sandbox_runtime's images.")
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
    network: Annotated[
        Literal["none", "egress", "restricted"] | None,
        Field(
            description=(
                "none (the default); restricted: only package registries and the other "
                "names of the server's allow-list, through its proxy; egress: anywhere "
                "(only where the operator allows). check_sandbox_runtime lists them."
            )
        ),
    ] = None,
    egress_allowlist: Annotated[
        list[Annotated[str, Field(max_length=253)]] | None,
        Field(
            max_length=100,
            description=(
                "Network restricted: the names to allow (a subset of the server's "
                "list; others are left out with a warning). Default: the server's list."
            ),
        ),
    ] = None,
    cpus: Annotated[float | None, Field(gt=0, description="CPU cores; clamped.")] = None,
    memory_mb: Annotated[int | None, Field(gt=0, description="Memory, MB; clamped.")] = None,
    pids: Annotated[int | None, Field(gt=0, description="Processes; clamped.")] = None,
    env: EnvRequests | None = None,
    timeout_s: Annotated[
        Seconds | None,
        Field(description="Default wall clock of each command (setup ones too), seconds."),
    ] = None,
    # Seed 001's names, with the seed's meaning.
    objective: Annotated[
        str | None, Field(max_length=4000, description="What you want to find out (= goal).")
    ] = None,
    base_image: Annotated[
        str | None, Field(max_length=200, description="The image to run in (= image).")
    ] = None,
    network_mode: Annotated[
        seed.SeedNetworkMode | None,
        Field(description="none, enabled (= network egress) or restricted (= restricted)."),
    ] = None,
    cpu_limit: Annotated[float | None, Field(gt=0, description="CPU cores (= cpus).")] = None,
    memory_limit: Annotated[
        str | int | None, Field(description="'512m', '1g', '2GB' or bytes (= memory_mb).")
    ] = None,
    timeout: SeedTimeout = None,  # noqa: ASYNC109 (the seed's name)
    environment_allowlist: Annotated[
        EnvRequests | None, Field(description="NAME=value, or NAME (local mode only) (= env).")
    ] = None,
    mount_strategy: Annotated[
        seed.MountStrategy | None,
        Field(description="COPY_TO_SANDBOX (always; READ_ONLY_BIND_MOUNT is refused)."),
    ] = None,
    ctx: Context | None = None,
) -> Annotated[CallToolResult, enveloped(CreatedExperiment)]:
    async def body(call: CallContext) -> CreatedExperiment:
        seed.copy_only(mount_strategy)
        chosen = seed.network(network, network_mode)
        if egress_allowlist is not None and chosen != "restricted":
            raise InvalidArgument(
                "egress_allowlist applies to network 'restricted' only; pass "
                "network='restricted' with it, or leave it out.",
                field="egress_allowlist",
            )
        defaults = Limits()
        memory = seed.memory_mb(memory_limit) if memory_limit is not None else None
        request = CreateRequest(
            name=name,
            goal=seed.pick(("goal", goal), ("objective", objective)) or "",
            image=seed.pick(("image", image), ("base_image", base_image)),
            files=files,
            project_path=project_path,
            from_experiment=from_experiment,
            git_url=git.url if git else None,
            git_ref=git.ref if git else None,
            setup_commands=tuple(setup_commands),
            network=chosen,
            egress_allowlist=tuple(egress_allowlist) if egress_allowlist is not None else None,
            limits=Limits(
                cpus=seed.pick(("cpus", cpus), ("cpu_limit", cpu_limit)) or defaults.cpus,
                memory_mb=seed.pick(("memory_mb", memory_mb), ("memory_limit", memory))
                or defaults.memory_mb,
                pids=pids or defaults.pids,
            ),
            env=tuple(
                seed.pick(("env", env), ("environment_allowlist", environment_allowlist)) or ()
            ),
            timeout_s=seed.timeout(timeout_s, timeout),
            until_done=running_as_task(),
        )
        return await deps.manager.create(call, request)

    return await deps.runner.run("create_experiment", body, takes_slot=True, progress=progress(ctx))


@tool(
    title="Get experiment",
    meta=VIEW_TOOL_META,  # the MCP Apps view shows this result
    description=(
        "One experiment: its state, image, goal, the isolation and limits applied, and "
        "the newest commands run in it (without output; `jobs_skip` pages back).\n\n"
        "USE THIS to re-orient after a gap, or to check that an experiment is still "
        "alive before sending it more commands; destroyed experiments are kept, with the "
        "findings recorded at teardown.\n\n"
        "RETURNS state (READY, RUNNING, COMPLETED, FAILED, TIMEOUT, CANCELLED, "
        "DESTROYED...), isolation, warnings, jobs and findings.\n\n"
        "NEVER changes the experiment or takes a sandbox slot."
    ),
    annotations=READ_ONLY,
)
async def get_experiment(
    deps: ToolDeps,
    experiment_id: ExperimentId,
    jobs_skip: Annotated[
        int, Field(ge=0, description="Skip this many newest jobs (to page back).")
    ] = 0,
) -> Annotated[CallToolResult, enveloped(ExperimentView)]:
    return await deps.runner.run(
        "get_experiment",
        lambda call: deps.manager.get(call, experiment_id, jobs_skip),
        takes_slot=False,
    )


@tool(
    title="List experiments",
    description=(
        "Your experiments, newest first, destroyed ones included.\n\n"
        "USE THIS to find an experiment you created earlier, or to see which are still "
        "alive (and destroy the ones you no longer need) before creating more: a sandbox "
        "holds a limited number of live experiments (check_sandbox_runtime says how "
        "many).\n\n"
        "RETURNS up to `limit` experiments (default 20) with their state, filtered by "
        "`status` if given (e.g. 'running', 'destroyed'), and `total`, how many matched.\n\n"
        "NEVER shows another sandbox's experiments, changes anything, or takes a slot."
    ),
    annotations=READ_ONLY,
)
async def list_experiments(
    deps: ToolDeps,
    status: Annotated[
        str | None,
        Field(max_length=20, description="Only experiments in this state (any case)."),
    ] = None,
    limit: Annotated[ListLimit, Field(description="At most this many, newest first.")] = 20,
) -> Annotated[CallToolResult, enveloped(ExperimentList)]:
    async def body(call: CallContext) -> ExperimentList:
        wanted = seed.state_filter(status)
        found = [
            view
            for view in reversed(await deps.manager.list_all(call))
            if wanted is None or view.state == wanted.value
        ]
        listing = ExperimentList(experiments=found[:limit], total=len(found))
        if len(found) > limit:
            listing.notes.append(
                f"{len(found) - limit} more experiment(s) match; pass a larger limit "
                "(at most 200) or a status to see them."
            )
        return listing

    return await deps.runner.run("list_experiments", body, takes_slot=False)


@tool(
    title="Destroy experiment",
    description=(
        "Destroy an experiment: its container is killed and its files deleted; its record "
        "and findings stay, so it remains comparable.\n\n"
        "USE THIS as soon as an experiment has told you what you needed (first "
        "collect_artifacts for files to keep), and before creating more than your "
        "sandbox holds.\n\n"
        "RETURNS the final report: state DESTROYED, the commands run, and the findings "
        "(tests, exit codes) recorded before teardown; the change size is measured just "
        "after (`changes_pending` until then; get_experiment and compare_experiments "
        "show it). Idempotent: on an already destroyed experiment it returns the same "
        "report.\n\n"
        "NEVER touches your own project or other experiments."
    ),
    # Deletes the experiment's files for good; a second call changes nothing more.
    annotations=hints(read_only=False, destructive=True, idempotent=True),
)
async def destroy_experiment(
    deps: ToolDeps,
    experiment_id: ExperimentId,
) -> Annotated[CallToolResult, enveloped(DestroyReport)]:
    return await deps.runner.run(
        "destroy_experiment",
        lambda call: deps.manager.destroy(call, experiment_id),
        takes_slot=False,
    )


@tool(
    title="Check sandbox runtime",
    description=(
        "What this server's runtime offers: whether the container engine is reachable, "
        "the images you may use, the default image, the limits (ceilings on CPU, memory, "
        "processes, command time), how many live experiments a sandbox holds, and the "
        "network policy.\n\n"
        "USE THIS first, to pick an image, or when create_experiment fails, to tell a "
        "stopped engine from a refused request.\n\n"
        "RETURNS reachable, version, images, missing_images, default_image, "
        "network_default, network_modes, egress_allowlist, egress_allowed, "
        "max_experiments and ceilings.\n\n"
        "NEVER takes a sandbox slot or changes anything."
    ),
    annotations=READ_ONLY,
)
async def check_sandbox_runtime(
    deps: ToolDeps,
) -> Annotated[CallToolResult, enveloped(RuntimeView)]:
    return await deps.runner.run(
        "check_sandbox_runtime", lambda _call: deps.manager.runtime(), takes_slot=False
    )
