"""The view's ``ui://`` resource and app-only tools, as the SDK's MCP Apps extension.

The app-only tools (``_meta.ui.visibility: ["app"]``: a host lists them to its views,
never to the model) are how the view fetches what a pushed result does not carry. Each
runs through the same ``ToolRunner`` as every tool: the caller's identity, its own
sandbox only (another sandbox's experiment reads like one that never existed), the
calls-in-flight and thread shares, the audit row. There is no endpoint of the view's
own. Like any call, a view's call counts as activity for the idle clock; the view
never polls, so it never keeps a sandbox alive by itself.
"""

from __future__ import annotations

from typing import Annotated

from mcp.server.apps import Apps, Visibility
from mcp.types import CallToolResult
from pydantic import Field

from app.experiments.evidence.shelf import fingerprint
from app.experiments.manager import ExperimentManager
from app.experiments.views import MAX_LISTED_JOBS
from app.mcp.envelope import enveloped
from app.mcp.runner import ToolRunner
from app.mcp.tools.common import READ_ONLY, VIEW_URI, ExperimentId
from app.mcp.view import snapshot
from app.mcp.view.resource import VIEW_CSP, claude_domain, endpoint_url, page_html
from app.mcp.view.snapshot import ExperimentDetail, FileDiff, SandboxOverview
from jail import CallContext
from pool.leases import SlotPool

APP_ONLY: list[Visibility] = ["app"]


def build_view(
    runner: ToolRunner, manager: ExperimentManager, pool: SlotPool, *, public_url: str
) -> Apps:
    """The view as an ``Apps`` extension (``MCPServer(extensions=[...])``): its resource
    and its app-only tools. ``public_url`` is where clients reach the server."""
    apps = Apps()
    apps.add_html_resource(
        VIEW_URI,
        page_html(),
        name="sandbox-view",
        title="Your sandbox",
        description="Your experiments, their last commands and tests, changes and queue place.",
        csp=VIEW_CSP,
        domain=claude_domain(endpoint_url(public_url)),
        prefers_border=True,
    )

    @apps.tool(
        resource_uri=VIEW_URI,
        visibility=APP_ONLY,
        name="view_sandbox",
        title="Sandbox view: overview",
        description=(
            "For the sandbox view only: your newest experiments with their state, image, "
            "network and last commands (exit code, duration, test summary), your slot or "
            "queue place with the estimated wait, and the idle timeout."
        ),
        annotations=READ_ONLY,
    )
    async def view_sandbox() -> Annotated[CallToolResult, enveloped(SandboxOverview)]:
        async def body(call: CallContext) -> SandboxOverview:
            key = call.sandbox_key
            seen = await pool.view(key)
            found = await manager.list_all(call)  # oldest first
            newest = list(reversed(found))[: snapshot.MAX_EXPERIMENTS]
            experiments = []
            for listed in newest:
                # One page of at most MAX_LISTED_JOBS jobs (no output) per experiment.
                full = await manager.get(call, listed.experiment_id)
                experiments.append(snapshot.view_experiment(full, snapshot.JOBS_PER_EXPERIMENT))
            position = seen.queue_position
            overview = SandboxOverview(
                sandbox=fingerprint(key),
                holds_slot=seen.slot is not None,
                queue_position=position,
                estimated_wait_s=None if position is None else pool.estimated_wait_s(position),
                idle_timeout_s=int(pool.idle_timeout_s),
                experiments=experiments,
                experiments_total=len(found),
            )
            return snapshot.bounded(overview)

        return await runner.run("view_sandbox", body, takes_slot=False, sees_slot=False)

    @apps.tool(
        resource_uri=VIEW_URI,
        visibility=APP_ONLY,
        name="view_experiment",
        title="Sandbox view: experiment",
        description=(
            "For the sandbox view only: one experiment and its newest commands, with the "
            "end of their output and their test summaries."
        ),
        annotations=READ_ONLY,
    )
    async def view_experiment(
        experiment_id: ExperimentId,
    ) -> Annotated[CallToolResult, enveloped(ExperimentDetail)]:
        async def body(call: CallContext) -> ExperimentDetail:
            full = await manager.get(call, experiment_id)
            shown = snapshot.view_experiment(full, MAX_LISTED_JOBS)
            # The end of the output for the newest few: each read is one job's record.
            for job in shown.jobs[-snapshot.TAIL_JOBS :]:
                job.output_tail = snapshot.tail(await manager.job_record(call, job.job_id))
            return snapshot.bounded(ExperimentDetail(experiment=shown))

        return await runner.run("view_experiment", body, takes_slot=False, sees_slot=False)

    @apps.tool(
        resource_uri=VIEW_URI,
        visibility=APP_ONLY,
        name="view_file_diff",
        title="Sandbox view: one file's diff",
        description=(
            "For the sandbox view only: the unified diff of one changed file of a live "
            "experiment against its baseline."
        ),
        annotations=READ_ONLY,
    )
    async def view_file_diff(
        experiment_id: ExperimentId,
        path: Annotated[str, Field(min_length=1, max_length=4096)],
    ) -> Annotated[CallToolResult, enveloped(FileDiff)]:
        async def body(call: CallContext) -> FileDiff:
            report = await manager.inspect_changes(call, experiment_id, True)
            section = snapshot.file_section(report.diff or "", path)
            if section is None:
                return FileDiff(
                    experiment_id=experiment_id,
                    path=path,
                    diff="",
                    found=False,
                    notes=[
                        "No text diff of this file: it is binary, too large, unchanged, or "
                        "past the change report's limits (inspect_changes lists it)."
                    ],
                )
            head = snapshot.head_within(section[: snapshot.DIFF_CHARS])
            return FileDiff(
                experiment_id=experiment_id,
                path=path,
                diff=head,
                chars_left_out=len(section) - len(head),
            )

        return await runner.run("view_file_diff", body, takes_slot=False)

    return apps
