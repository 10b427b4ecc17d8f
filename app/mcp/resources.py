"""The ``sandbox://`` resources: every one is read through the tool runner, scoped to the
caller's sandbox key (another key's experiment reads like one that never existed)."""

from __future__ import annotations

import json

from mcp.server.mcpserver import MCPServer

from app.errors import InvalidArgument
from app.experiments.core.records import JobEnds
from app.experiments.manager import ExperimentManager
from app.experiments.views import excerpt_of
from app.mcp.fit import MAX_RESULT_CHARS
from app.mcp.runner import ToolRunner
from jail import CallContext

# The logs resource is every job's command and output (up to 2 MB a job, and an
# experiment runs any number of jobs over its life: 500 of them made a 1 GB string). A
# client that reads it into the model's context (Claude Code's @-mention) has the same
# window as for a tool's result: it keeps the newest jobs that fit in as many characters
# as a tool's result may have, each job's output shown as the views show it (head and
# tail excerpts, cut by the database: a job's whole output is never read for them);
# get_job_result reads any job whole, page by page.
MAX_LOG_CHARS = MAX_RESULT_CHARS


def register_resources(server: MCPServer, runner: ToolRunner, manager: ExperimentManager) -> None:
    """The sandbox:// resources; every one is scoped to the caller's sandbox key."""

    @server.resource("sandbox://experiments", mime_type="application/json")
    async def experiments() -> str:
        async def work(call: CallContext) -> str:
            found = await manager.list_all(call)
            return json.dumps([e.model_dump(mode="json") for e in found], indent=2)

        return await runner.read("resource:sandbox://experiments", work)

    @server.resource("sandbox://experiments/{experiment_id}", mime_type="application/json")
    async def experiment(experiment_id: str) -> str:
        async def work(call: CallContext) -> str:
            return (await manager.get(call, experiment_id)).model_dump_json(indent=2)

        return await runner.read("resource:sandbox://experiments/{id}", work)

    @server.resource("sandbox://experiments/{experiment_id}/logs", mime_type="text/plain")
    async def logs(experiment_id: str) -> str:
        async def work(call: CallContext) -> str:
            return await experiment_log(manager, call, experiment_id)

        return await runner.read("resource:sandbox://experiments/{id}/logs", work)

    @server.resource("sandbox://experiments/{experiment_id}/diff", mime_type="text/x-diff")
    async def diff(experiment_id: str) -> str:
        async def work(call: CallContext) -> str:
            return (await manager.inspect_changes(call, experiment_id, True)).diff or ""

        return await runner.read("resource:sandbox://experiments/{id}/diff", work)

    @server.resource(
        "sandbox://experiments/{experiment_id}/artifacts", mime_type="application/json"
    )
    async def artifacts(experiment_id: str) -> str:
        async def work(call: CallContext) -> str:
            return (await manager.list_artifacts(call, experiment_id)).model_dump_json(indent=2)

        return await runner.read("resource:sandbox://experiments/{id}/artifacts", work)

    @server.resource(
        "sandbox://experiments/{experiment_id}/artifacts/{artifact_id}",
        mime_type="application/octet-stream",
    )
    async def artifact(experiment_id: str, artifact_id: str) -> bytes:
        async def work(call: CallContext) -> bytes:
            _, data = await manager.read_artifact(call, experiment_id, artifact_id)
            return data

        return await runner.read("resource:sandbox://experiments/{id}/artifacts/{artifact}", work)

    @server.resource(
        "sandbox://experiments/{experiment_id}/artifacts/{artifact_id}/parts/{part}",
        mime_type="application/octet-stream",
    )
    async def artifact_part(experiment_id: str, artifact_id: str, part: str) -> bytes:
        async def work(call: CallContext) -> bytes:
            if not part.isdigit() or len(part) > 9:
                raise InvalidArgument(f"A part is a number from 0; {part[:20]!r} is not one.")
            _, data = await manager.read_artifact(call, experiment_id, artifact_id, int(part))
            return data

        return await runner.read(
            "resource:sandbox://experiments/{id}/artifacts/{artifact}/parts/{part}", work
        )


async def experiment_log(manager: ExperimentManager, call: CallContext, experiment_id: str) -> str:
    """The experiment's jobs, oldest first: the newest that fit in ``MAX_LOG_CHARS``, and
    a line saying how many older ones were left out. Read a page of jobs at a time,
    newest first."""
    parts: list[str] = []
    room = MAX_LOG_CHARS
    shown = 0
    while True:
        view = await manager.get(call, experiment_id, jobs_skip=shown)
        for job in reversed(view.jobs):
            part = _logged(await manager.job_ends(call, job.job_id))
            if len(part) > room:
                parts.append(
                    f"[{view.jobs_total - shown} earlier jobs not shown: this log keeps the "
                    f"newest {MAX_LOG_CHARS:,} characters; get_job_result reads any job]\n"
                )
                return "\n".join(reversed(parts))
            room -= len(part)
            parts.append(part)
            shown += 1
        if not view.jobs_not_listed:
            return "\n".join(reversed(parts))


def _logged(job: JobEnds) -> str:
    """One job in the log: its command (cut as the listings cut it) and the excerpts of
    its output, at most about 21,000 characters, so the newest job always fits."""
    command = job.command
    if job.command_length > len(command):
        command += f" [... {job.command_length - len(command)} characters of the command]"
    stdout, _ = excerpt_of(job.stdout)
    stderr, _ = excerpt_of(job.stderr)
    return f"$ {command}\n{stdout}{stderr}[{job.status}, exit {job.exit_code}] {job.job_id}\n"
