"""The ``sandbox://`` resources: every one is read through the tool runner, scoped to the
caller's sandbox key (another key's experiment reads like one that never existed)."""

from __future__ import annotations

import json

from mcp.server.mcpserver import MCPServer

from app.experiments.manager import ExperimentManager
from app.mcp.runner import ToolRunner
from jail import CallContext


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
            view = await manager.get(call, experiment_id)
            parts = []
            for job in view.jobs:
                result = await manager.job_record(call, job.job_id)
                parts.append(
                    f"$ {result.command}\n{result.stdout or ''}{result.stderr or ''}"
                    f"[{result.status}, exit {result.exit_code}]\n"
                )
            return "\n".join(parts)

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
