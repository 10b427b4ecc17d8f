"""The file tools: read, write, edit, list and search an experiment's workspace.

They work whether or not the experiment's container runs; every access goes
through the jail (see app/experiments/files.py).
"""

from __future__ import annotations

import asyncio
from typing import Annotated

from mcp.server.mcpserver import MCPServer
from mcp.types import CallToolResult, ToolAnnotations
from pydantic import Field

from app.experiments import files
from app.experiments.manager import ExperimentManager
from app.mcp.envelope import enveloped
from app.mcp.runner import ToolRunner
from jail import CallContext

READ_ONLY = ToolAnnotations(read_only_hint=True, open_world_hint=False)
ExperimentId = Annotated[str, Field(max_length=64, description="An id from create_experiment.")]
WorkspacePath = Annotated[
    str, Field(min_length=1, max_length=4096, description="Relative to /workspace.")
]


def register_file_tools(server: MCPServer, runner: ToolRunner, manager: ExperimentManager) -> None:
    """Add the file tools to ``server``. Called once, by the composition root."""

    @server.tool(
        description=(
            "Read a text file of an experiment's workspace, optionally a line range "
            "(1-based, inclusive). Binary files are reported as such, without content."
        ),
        annotations=READ_ONLY,
    )
    async def read_sandbox_file(
        experiment_id: ExperimentId,
        path: WorkspacePath,
        start_line: Annotated[int, Field(ge=1)] = 1,
        end_line: Annotated[int | None, Field(ge=1)] = None,
        max_bytes: Annotated[int, Field(ge=1, le=files.MAX_READ_BYTES)] = 262_144,
    ) -> Annotated[CallToolResult, enveloped(files.FileContent)]:
        async def body(call: CallContext) -> files.FileContent:
            workspace = await manager.workspace(call, experiment_id)
            return await asyncio.to_thread(
                files.read_file,
                workspace,
                path,
                call.edit_state,
                experiment_id,
                start_line=start_line,
                end_line=end_line,
                max_bytes=max_bytes,
            )

        return await runner.run("read_sandbox_file", body, takes_slot=False)

    @server.tool(description="Write a whole text file (parents are created), replacing it.")
    async def write_sandbox_file(
        experiment_id: ExperimentId,
        path: WorkspacePath,
        content: Annotated[str, Field(max_length=files.MAX_WRITE_BYTES)],
    ) -> Annotated[CallToolResult, enveloped(files.FileWritten)]:
        async def body(call: CallContext) -> files.FileWritten:
            workspace = await manager.workspace(call, experiment_id)
            written = await asyncio.to_thread(
                files.write_file, workspace, path, content, call.edit_state, experiment_id
            )
            call.project_map.invalidate()
            return written

        return await runner.run("write_sandbox_file", body, takes_slot=False)

    @server.tool(
        description=(
            "Replace exact text in a file you have read: old_text must occur exactly once "
            "(or pass replace_all). Refused if the file changed since you last read it."
        )
    )
    async def edit_sandbox_file(
        experiment_id: ExperimentId,
        path: WorkspacePath,
        old_text: Annotated[str, Field(min_length=1, max_length=files.MAX_WRITE_BYTES)],
        new_text: Annotated[str, Field(max_length=files.MAX_WRITE_BYTES)],
        replace_all: bool = False,
    ) -> Annotated[CallToolResult, enveloped(files.FileWritten)]:
        async def body(call: CallContext) -> files.FileWritten:
            workspace = await manager.workspace(call, experiment_id)
            written = await asyncio.to_thread(
                files.edit_file,
                workspace,
                path,
                old_text,
                new_text,
                call.edit_state,
                experiment_id,
                replace_all=replace_all,
            )
            call.project_map.invalidate()
            return written

        return await runner.run("edit_sandbox_file", body, takes_slot=False)

    @server.tool(
        description="List files and folders (with sizes) under a workspace folder, bounded.",
        annotations=READ_ONLY,
    )
    async def list_sandbox_files(
        experiment_id: ExperimentId,
        path: WorkspacePath = ".",
        max_entries: Annotated[int, Field(ge=1, le=5000)] = 500,
    ) -> Annotated[CallToolResult, enveloped(files.FileTree)]:
        async def body(call: CallContext) -> files.FileTree:
            workspace = await manager.workspace(call, experiment_id)
            return await asyncio.to_thread(
                files.list_files, workspace, path, max_entries=max_entries
            )

        return await runner.run("list_sandbox_files", body, takes_slot=False)

    @server.tool(
        description=(
            "Search the workspace's text files with a regular expression (RE2 syntax: like "
            "Python's, without backreferences or lookaround); returns file, line number and "
            "line, bounded."
        ),
        annotations=READ_ONLY,
    )
    async def search_sandbox(
        experiment_id: ExperimentId,
        pattern: Annotated[str, Field(min_length=1, max_length=1000)],
        path: WorkspacePath = ".",
        max_results: Annotated[int, Field(ge=1, le=2000)] = 200,
    ) -> Annotated[CallToolResult, enveloped(files.SearchResult)]:
        async def body(call: CallContext) -> files.SearchResult:
            workspace = await manager.workspace(call, experiment_id)
            return await asyncio.to_thread(
                files.search, workspace, pattern, path, max_results=max_results
            )

        return await runner.run("search_sandbox", body, takes_slot=False)
