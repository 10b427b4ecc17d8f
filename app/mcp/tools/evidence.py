"""The tools that turn a container into evidence: tests, changes, artifacts, comparison, map."""

from __future__ import annotations

import asyncio
from typing import Annotated, TypeVar

from mcp.server.mcpserver import Context, MCPServer
from mcp.types import CallToolResult, ToolAnnotations
from pydantic import Field

from app.experiments import project
from app.experiments.artifacts import ArtifactList
from app.experiments.compare import Comparison
from app.experiments.manager import ExperimentManager
from app.experiments.views import ChangesView, JobView
from app.mcp.envelope import enveloped
from app.mcp.runner import Progress, ToolRunner
from app.mcp.tasks import running_as_task
from jail import CallContext

READ_ONLY = ToolAnnotations(read_only_hint=True, open_world_hint=False)
ExperimentId = Annotated[str, Field(max_length=64, description="An id from create_experiment.")]
T = TypeVar("T")


def register_evidence_tools(
    server: MCPServer, runner: ToolRunner, manager: ExperimentManager
) -> None:
    """Add run_tests, inspect_changes, collect_artifacts, compare_experiments, map_project."""

    @server.tool(
        description=(
            "Run the project's tests and parse the results: passed, failed, skipped, total and "
            "the failing tests' names. The runner is detected (pytest, unittest, node --test, "
            "jest, vitest, mocha, cargo, go, make) unless `command` is given. If `tests.detected` "
            "is false, trust the exit code."
        )
    )
    async def run_tests(
        experiment_id: ExperimentId,
        command: Annotated[str | None, Field(max_length=10_000)] = None,
        timeout_s: Annotated[float | None, Field(gt=0)] = None,
        ctx: Context | None = None,
    ) -> Annotated[CallToolResult, enveloped(JobView)]:
        async def body(call: CallContext) -> JobView:
            return await manager.run_tests(
                call, experiment_id, command, timeout_s=timeout_s, until_done=running_as_task()
            )

        return await runner.run("run_tests", body, takes_slot=True, progress=_progress(ctx))

    @server.tool(
        description=(
            "What changed in the workspace since the experiment was created (before any "
            "command ran): created, modified and deleted files, symlink and mode changes, "
            "insertions and deletions, and optionally the unified diff (capped). Build output "
            "and dependency folders are left out."
        ),
        annotations=READ_ONLY,
    )
    async def inspect_changes(
        experiment_id: ExperimentId, include_diff: bool = False
    ) -> Annotated[CallToolResult, enveloped(ChangesView)]:
        async def body(call: CallContext) -> ChangesView:
            return await manager.inspect_changes(call, experiment_id, include_diff)

        return await runner.run("inspect_changes", body, takes_slot=False)

    @server.tool(
        description=(
            "Copy workspace files out as artifacts (kept after the sandbox is emptied, for a "
            "day by default), with sizes and SHA-256. Patterns are workspace-relative globs; "
            "`**/name` searches every folder. Read them back as resources (`uri`)."
        )
    )
    async def collect_artifacts(
        experiment_id: ExperimentId,
        patterns: Annotated[
            list[Annotated[str, Field(max_length=500)]], Field(min_length=1, max_length=20)
        ],
    ) -> Annotated[CallToolResult, enveloped(ArtifactList)]:
        async def body(call: CallContext) -> ArtifactList:
            return await manager.collect_artifacts(call, experiment_id, patterns)

        return await runner.run("collect_artifacts", body, takes_slot=False)

    @server.tool(
        description=(
            "Compare experiments (destroyed ones too): test results, failing tests, exit codes, "
            "change size, duration, artifacts; and a recommendation with its reason when the "
            "evidence supports one (fewest failures, then a clean exit, then the smallest "
            "change, then the fastest)."
        ),
        annotations=READ_ONLY,
    )
    async def compare_experiments(
        experiment_ids: Annotated[list[ExperimentId], Field(min_length=2, max_length=10)],
    ) -> Annotated[CallToolResult, enveloped(Comparison)]:
        async def body(call: CallContext) -> Comparison:
            return await manager.compare(call, experiment_ids)

        return await runner.run("compare_experiments", body, takes_slot=False)

    @server.tool(
        description=(
            "Map the project: languages, manifests, the test runner run_tests would use, and "
            "entry points. Cached until a file is written or a command runs."
        ),
        annotations=READ_ONLY,
    )
    async def map_project(
        experiment_id: ExperimentId,
    ) -> Annotated[CallToolResult, enveloped(project.ProjectMap)]:
        async def body(call: CallContext) -> project.ProjectMap:
            cached = call.project_map.value
            if cached is not None and cached.get("experiment_id") == experiment_id:
                return project.ProjectMap.model_validate(cached["map"])
            workspace = await manager.workspace(call, experiment_id)
            mapped = await asyncio.to_thread(project.project_map, workspace)
            call.project_map.value = {"experiment_id": experiment_id, "map": mapped.model_dump()}
            return mapped

        return await runner.run("map_project", body, takes_slot=False)


def _progress(ctx: Context | None) -> Progress | None:
    # Queue position updates reach the client only if it asked for progress, and
    # never from a task: the response that would carry them has been sent.
    return ctx.report_progress if ctx is not None and not running_as_task() else None
