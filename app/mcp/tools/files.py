"""The file tools: read, write, edit, list and search an experiment's workspace.

They work whether or not the experiment's container runs; every access goes
through the jail (see app/experiments/workspace/files.py).
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Annotated

from mcp.types import CallToolResult
from pydantic import Field

from app.experiments.workspace import files
from app.mcp.envelope import enveloped
from app.mcp.tools.common import READ_ONLY, ExperimentId, ToolDeps, hints, in_workspace, tool
from jail import CallContext

WorkspacePath = Annotated[
    str, Field(min_length=1, max_length=4096, description="Relative to /workspace.")
]


async def changed(
    deps: ToolDeps,
    call: CallContext,
    experiment_id: str,
    change: Callable[[Path], files.FileWritten],
) -> files.FileWritten:
    """``change`` applied to the experiment's workspace (in a thread of the sandbox's
    share): the project's map is stale from then on."""
    written = await in_workspace(deps, call, experiment_id, change)
    call.project_map.invalidate()
    return written


@tool(
    title="Read sandbox file",
    description=(
        "Read a text file of an experiment's workspace, optionally a line range "
        "(1-based, inclusive).\n\n"
        "USE THIS to investigate a failure (the source, a config, a log) instead of "
        "guessing from a stack trace, and before edit_sandbox_file, which needs a read "
        "of the file first.\n\n"
        "RETURNS the content (up to `max_bytes`), its line range and total line count; "
        "a binary file is reported as such, without content.\n\n"
        "NEVER reads outside the experiment's /workspace (paths are relative; links "
        "that leave it are refused) and never your own machine's files."
    ),
    annotations=READ_ONLY,
)
async def read_sandbox_file(
    deps: ToolDeps,
    experiment_id: ExperimentId,
    path: WorkspacePath,
    start_line: Annotated[int, Field(ge=1)] = 1,
    end_line: Annotated[int | None, Field(ge=1)] = None,
    max_bytes: Annotated[int, Field(ge=1, le=files.MAX_READ_BYTES)] = 262_144,
) -> Annotated[CallToolResult, enveloped(files.FileContent)]:
    async def body(call: CallContext) -> files.FileContent:
        return await in_workspace(
            deps,
            call,
            experiment_id,
            files.read_file,
            path,
            call.edit_state,
            experiment_id,
            start_line=start_line,
            end_line=end_line,
            max_bytes=max_bytes,
        )

    return await deps.runner.run("read_sandbox_file", body, takes_slot=False)


@tool(
    title="Write sandbox file",
    description=(
        "Write a whole text file in an experiment's workspace, creating its folders, "
        "replacing the file if it exists.\n\n"
        "USE THIS to apply a candidate fix or add a file; prefer it to shell heredocs "
        "(no quoting to get wrong). For a small change to a long file, edit_sandbox_file "
        "is cheaper.\n\n"
        "RETURNS the path written and the bytes written.\n\n"
        "NEVER writes outside the experiment's /workspace, and never to your own "
        "project: to keep a change, show the diff from inspect_changes and apply it "
        "yourself."
    ),
    # Changes one named file of the disposable copy; the original stays in the baseline
    # (inspect_changes shows it) and the user's project is never written.
    annotations=hints(read_only=False, destructive=False, idempotent=True),
)
async def write_sandbox_file(
    deps: ToolDeps,
    experiment_id: ExperimentId,
    path: WorkspacePath,
    content: Annotated[str, Field(max_length=files.MAX_WRITE_BYTES)],
) -> Annotated[CallToolResult, enveloped(files.FileWritten)]:
    async def body(call: CallContext) -> files.FileWritten:
        return await changed(
            deps,
            call,
            experiment_id,
            lambda workspace: files.write_file(
                workspace, path, content, call.edit_state, experiment_id
            ),
        )

    return await deps.runner.run("write_sandbox_file", body, takes_slot=False)


@tool(
    title="Edit sandbox file",
    description=(
        "Replace exact text in a file of an experiment's workspace that you have read "
        "with read_sandbox_file.\n\n"
        "USE THIS for a targeted change to an existing file: `old_text` must occur "
        "exactly once (or pass `replace_all`).\n\n"
        "RETURNS the path, the bytes written and the number of replacements. Refused, "
        "with nothing written, if old_text is missing or ambiguous, or if the file "
        "changed since you last read it (read it again).\n\n"
        "NEVER writes outside the experiment's /workspace, and never to your own project."
    ),
    # As write_sandbox_file: one file of the disposable copy, the original kept in the
    # baseline. Not idempotent: once replaced, the old text is gone and a repeat fails.
    annotations=hints(read_only=False, destructive=False, idempotent=False),
)
async def edit_sandbox_file(
    deps: ToolDeps,
    experiment_id: ExperimentId,
    path: WorkspacePath,
    old_text: Annotated[str, Field(min_length=1, max_length=files.MAX_WRITE_BYTES)],
    new_text: Annotated[str, Field(max_length=files.MAX_WRITE_BYTES)],
    replace_all: bool = False,
) -> Annotated[CallToolResult, enveloped(files.FileWritten)]:
    async def body(call: CallContext) -> files.FileWritten:
        return await changed(
            deps,
            call,
            experiment_id,
            lambda workspace: files.edit_file(
                workspace,
                path,
                old_text,
                new_text,
                call.edit_state,
                experiment_id,
                replace_all=replace_all,
            ),
        )

    return await deps.runner.run("edit_sandbox_file", body, takes_slot=False)


@tool(
    title="List sandbox files",
    description=(
        "List the files and folders under a folder of an experiment's workspace, with "
        "sizes, bounded by `max_entries`.\n\n"
        "USE THIS to find your way around a project you have not seen, or to check what "
        "a build produced before collect_artifacts.\n\n"
        "RETURNS each entry's path, kind (file, dir, symlink) and size, and whether the "
        "listing was cut.\n\n"
        "NEVER lists outside the experiment's /workspace or changes anything."
    ),
    annotations=READ_ONLY,
)
async def list_sandbox_files(
    deps: ToolDeps,
    experiment_id: ExperimentId,
    path: WorkspacePath = ".",
    max_entries: Annotated[int, Field(ge=1, le=5000)] = 500,
) -> Annotated[CallToolResult, enveloped(files.FileTree)]:
    async def body(call: CallContext) -> files.FileTree:
        return await in_workspace(
            deps, call, experiment_id, files.list_files, path, max_entries=max_entries
        )

    return await deps.runner.run("list_sandbox_files", body, takes_slot=False)


@tool(
    title="Search sandbox",
    description=(
        "Search the text files of an experiment's workspace with a regular expression "
        "(RE2 syntax: like Python's, without backreferences or lookaround).\n\n"
        "USE THIS to find where something is defined or used (a function, a removed API, "
        "an error message) without reading every file.\n\n"
        "RETURNS matching file, line number and line, at most `max_results`, and whether "
        "more were left out.\n\n"
        "NEVER searches outside the experiment's /workspace or changes anything."
    ),
    annotations=READ_ONLY,
)
async def search_sandbox(
    deps: ToolDeps,
    experiment_id: ExperimentId,
    pattern: Annotated[str, Field(min_length=1, max_length=1000)],
    path: WorkspacePath = ".",
    max_results: Annotated[int, Field(ge=1, le=2000)] = 200,
) -> Annotated[CallToolResult, enveloped(files.SearchResult)]:
    async def body(call: CallContext) -> files.SearchResult:
        return await in_workspace(
            deps, call, experiment_id, files.search, pattern, path, max_results=max_results
        )

    return await deps.runner.run("search_sandbox", body, takes_slot=False)
