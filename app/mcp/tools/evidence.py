"""The tools that turn a container into evidence: tests, changes, artifacts, comparison, map."""

from __future__ import annotations

from typing import Annotated

from mcp.server.mcpserver import Context
from mcp.types import CallToolResult
from pydantic import Field

from app.experiments.evidence import project
from app.experiments.evidence.artifacts import ArtifactList
from app.experiments.evidence.compare import Comparison
from app.experiments.views import ChangesView, JobView
from app.mcp.envelope import enveloped
from app.mcp.tools import seed_names as seed
from app.mcp.tools.common import (
    READ_ONLY,
    VIEW_TOOL_META,
    ExperimentId,
    Seconds,
    SeedTimeout,
    ToolDeps,
    hints,
    in_workspace,
    run_job,
    tool,
)
from jail import CallContext


@tool(
    title="Run tests",
    description=(
        "Run the project's tests in an experiment and parse the results.\n\n"
        "USE THIS instead of execute_experiment to learn whether the project works: "
        "before a change (the baseline) and after it. The runner is detected from what "
        "is in the workspace (pytest, unittest, node --test, jest, vitest, mocha, cargo, "
        "go, make) unless `command` is given.\n\n"
        "RETURNS exit code, output (capped), duration and `tests` (also as "
        "`test_summary`): passed, failed, skipped, errors, total and the failing tests' "
        "names. If `detected` is false the results could not be read: trust the exit "
        "code, not the zeros.\n\n"
        "NEVER runs outside the experiment's container."
    ),
    # Runs the project's own tests: they may write reports and caches in the copy, but
    # do not aim to delete; each run is a new job on record.
    annotations=lambda deps: hints(
        read_only=False, destructive=False, idempotent=False, open_world=deps.egress
    ),
)
async def run_tests(
    deps: ToolDeps,
    experiment_id: ExperimentId,
    command: Annotated[str | None, Field(max_length=10_000)] = None,
    timeout_s: Annotated[Seconds | None, Field(description="Seconds before it is killed.")] = None,
    timeout: SeedTimeout = None,  # noqa: ASYNC109 (the seed's name)
    ctx: Context | None = None,
) -> Annotated[CallToolResult, enveloped(JobView)]:
    async def start(call: CallContext, until_done: bool) -> JobView:
        seconds = seed.timeout(timeout_s, timeout)
        return await deps.manager.run_tests(
            call, experiment_id, command, timeout_s=seconds, until_done=until_done
        )

    return await run_job(deps, "run_tests", ctx, start)


@tool(
    title="Inspect changes",
    meta=VIEW_TOOL_META,  # the MCP Apps view shows this result
    description=(
        "What changed in an experiment's workspace since it was created (before any "
        "command ran).\n\n"
        "USE THIS before you report what you found or destroy the experiment: it is the "
        "evidence for your conclusion, and the change to show the user.\n\n"
        "RETURNS created, modified and deleted files (also as plain path lists), symlink "
        "and mode changes, insertions and deletions, and with `include_diff` the unified "
        "diff of at most `max_files_with_diff` files (default 50), capped in size. Build "
        "output and dependency folders (node_modules, .venv, dist...) are left out.\n\n"
        "NEVER changes the workspace or applies anything to your project."
    ),
    annotations=READ_ONLY,
)
async def inspect_changes(
    deps: ToolDeps,
    experiment_id: ExperimentId,
    include_diff: bool = False,
    max_files_with_diff: Annotated[
        int, Field(ge=1, le=500, description="At most this many files' diffs are included.")
    ] = 50,
) -> Annotated[CallToolResult, enveloped(ChangesView)]:
    async def body(call: CallContext) -> ChangesView:
        return await deps.manager.inspect_changes(
            call, experiment_id, include_diff, max_files_with_diff
        )

    return await deps.runner.run("inspect_changes", body, takes_slot=False)


@tool(
    title="Collect artifacts",
    description=(
        "Copy files out of an experiment's workspace as artifacts, kept after the "
        "experiment and the sandbox are gone (for a day by default).\n\n"
        "USE THIS for build output, test reports, coverage or logs you want to keep or "
        "quote, before destroy_experiment. Patterns are workspace-relative globs "
        "('dist/*.js'); '**/name' searches every folder.\n\n"
        "RETURNS each artifact's path, size, SHA-256 and a `uri` to read it back as a "
        "resource.\n\n"
        "NEVER copies from outside the workspace, and never writes to your machine."
    ),
    # Adds copies to the artifact shelf and leaves the workspace as it was; a repeat
    # makes new copies.
    annotations=hints(read_only=False, destructive=False, idempotent=False),
)
async def collect_artifacts(
    deps: ToolDeps,
    experiment_id: ExperimentId,
    patterns: Annotated[
        list[Annotated[str, Field(max_length=500)]], Field(min_length=1, max_length=20)
    ],
) -> Annotated[CallToolResult, enveloped(ArtifactList)]:
    return await deps.runner.run(
        "collect_artifacts",
        lambda call: deps.manager.collect_artifacts(call, experiment_id, patterns),
        takes_slot=False,
    )


@tool(
    title="Compare experiments",
    meta=VIEW_TOOL_META,  # the MCP Apps view shows this result
    description=(
        "Compare 2 to 10 experiments side by side, destroyed ones too (their findings "
        "were recorded before teardown).\n\n"
        "USE THIS when you tried several approaches (candidate fixes, runtime versions, "
        "dependency upgrades), each in its own experiment, and must recommend one.\n\n"
        "RETURNS per experiment (with your `labels`): tests passed and failed, failing "
        "tests, exit codes, change size, duration, artifacts; and `recommended` with its "
        "`reason` when the evidence supports one (fewest failures, then a clean exit, "
        "then the smallest change, then the fastest).\n\n"
        "NEVER runs anything or changes an experiment."
    ),
    annotations=READ_ONLY,
)
async def compare_experiments(
    deps: ToolDeps,
    experiment_ids: Annotated[list[ExperimentId], Field(min_length=2, max_length=10)],
    labels: Annotated[
        dict[ExperimentId, Annotated[str, Field(max_length=200)]] | None,
        Field(max_length=10, description="Experiment id -> your label for it."),
    ] = None,
) -> Annotated[CallToolResult, enveloped(Comparison)]:
    async def body(call: CallContext) -> Comparison:
        seed.check_labels(labels or {}, experiment_ids)
        return await deps.manager.compare(call, experiment_ids, labels)

    return await deps.runner.run("compare_experiments", body, takes_slot=False)


@tool(
    title="Map project",
    description=(
        "Map the project in an experiment's workspace: languages, manifests, the test "
        "runner run_tests would use, and entry points.\n\n"
        "USE THIS first in an experiment whose project you do not know, to decide what "
        "to build and how to test it.\n\n"
        "RETURNS languages with file counts, manifests (package.json, pyproject.toml, "
        "Cargo.toml...), the detected test runner and entry points. Cached until a file "
        "is written or a command runs.\n\n"
        "NEVER runs anything or changes the workspace."
    ),
    annotations=READ_ONLY,
)
async def map_project(
    deps: ToolDeps,
    experiment_id: ExperimentId,
) -> Annotated[CallToolResult, enveloped(project.ProjectMap)]:
    async def body(call: CallContext) -> project.ProjectMap:
        cached = call.project_map.value
        if cached is not None and cached.get("experiment_id") == experiment_id:
            return project.ProjectMap.model_validate(cached["map"])
        mapped = await in_workspace(deps, call, experiment_id, project.project_map)
        call.project_map.value = {"experiment_id": experiment_id, "map": mapped.model_dump()}
        return mapped

    return await deps.runner.run("map_project", body, takes_slot=False)
