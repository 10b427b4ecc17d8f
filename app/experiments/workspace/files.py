"""Reading, writing, editing, listing and searching an experiment's files, through the jail.

The workspace is shared with a hostile container, so every access goes through a
``Jail`` rooted at it (race-free against links swapped in meanwhile). These work
whether or not the container runs. Edits are checked against the edit state:
an edit of a file changed since the agent last read it is refused.
"""

from __future__ import annotations

import hashlib
import os
import stat
import time
from collections.abc import Iterator
from pathlib import Path

from pydantic import BaseModel, Field

from app.experiments.core.errors import EditNotFound, EditNotUnique, ProjectSourceError
from app.experiments.core.result import Result
from app.experiments.workspace.patterns import compile_search
from jail import EditState, Jail, JailError, PathInfo

MAX_READ_BYTES = 1_048_576
MAX_WRITE_BYTES = 10 * 1_048_576
MAX_SEARCH_FILE_BYTES = 2 * 1_048_576
SEARCH_BUDGET_S = 10.0
SKIPPED_DIRS = frozenset(
    {".git", "node_modules", "__pycache__", ".venv", "venv", ".sandbox-reports"}
)


def _sha(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def _edit_key(experiment_id: str, path: str) -> str:
    return f"{experiment_id}/{path}"


def is_binary(data: bytes) -> bool:
    if b"\x00" in data[:8192]:
        return True
    try:
        data.decode("utf-8")
    except UnicodeDecodeError as exc:
        # A multi-byte character cut by a size cap is not binary.
        return exc.start < len(data) - 4
    return False


class FileContent(Result):
    path: str
    size: int
    binary: bool = Field(description="True for non-text files: no content is returned then.")
    content: str | None = None
    start_line: int = 1
    end_line: int = 0
    total_lines: int = 0
    truncated: bool = Field(default=False, description="The file was larger than the read cap.")


class FileWritten(Result):
    path: str
    bytes_written: int
    replacements: int = 0


class FileEntry(BaseModel):
    path: str
    kind: str
    size: int
    link_target: str | None = None


class FileTree(Result):
    root: str
    entries: list[FileEntry]
    truncated: bool = False


class SearchMatch(BaseModel):
    path: str
    line: int
    text: str


class SearchResult(Result):
    pattern: str
    matches: list[SearchMatch]
    files_searched: int
    truncated: bool = False


def read_file(
    workspace: Path,
    path: str,
    edits: EditState,
    experiment_id: str,
    *,
    start_line: int = 1,
    end_line: int | None = None,
    max_bytes: int = MAX_READ_BYTES,
) -> FileContent:
    with Jail.open(workspace) as jail:
        size, data = _read_prefix(jail, path, min(max_bytes, MAX_READ_BYTES) + 1)
    truncated = len(data) > max_bytes
    data = data[:max_bytes]
    if not truncated:
        edits.record_read(_edit_key(experiment_id, path), _sha(data))
    if is_binary(data):
        return FileContent(path=path, size=size, binary=True, truncated=truncated)
    lines = data.decode("utf-8", errors="replace").splitlines(keepends=True)
    first = max(1, start_line)
    last = min(len(lines), end_line or len(lines))
    return FileContent(
        path=path,
        size=size,
        binary=False,
        content="".join(lines[first - 1 : last]),
        start_line=first,
        end_line=last,
        total_lines=len(lines),
        truncated=truncated,
    )


def _read_prefix(jail: Jail, path: str, limit: int) -> tuple[int, bytes]:
    """The file's size and its first ``limit`` bytes (a big file is cut, not refused)."""
    fd = jail.open_fd(path, os.O_RDONLY)
    try:
        st = os.fstat(fd)
        if stat.S_ISDIR(st.st_mode):
            raise ProjectSourceError(f"{path!r} is a folder; list it with list_sandbox_files.")
        return st.st_size, os.pread(fd, limit, 0)
    finally:
        os.close(fd)


def write_file(
    workspace: Path, path: str, content: str, edits: EditState, experiment_id: str
) -> FileWritten:
    data = content.encode()
    if len(data) > MAX_WRITE_BYTES:
        raise ProjectSourceError(f"A file may hold at most {MAX_WRITE_BYTES} bytes.")
    with Jail.open(workspace) as jail:
        jail.write_bytes(path, data, make_parents=True)
    # The agent knows what it wrote: it may edit it next without reading it again.
    edits.record_read(_edit_key(experiment_id, path), _sha(data))
    return FileWritten(path=path, bytes_written=len(data))


def edit_file(
    workspace: Path,
    path: str,
    old_text: str,
    new_text: str,
    edits: EditState,
    experiment_id: str,
    *,
    replace_all: bool = False,
) -> FileWritten:
    if not old_text:
        raise ProjectSourceError("old_text is empty; use write_sandbox_file to write a whole file.")
    with Jail.open(workspace) as jail:
        data = jail.read_bytes(path, max_bytes=MAX_WRITE_BYTES)
        edits.check_fresh(_edit_key(experiment_id, path), _sha(data))
        if is_binary(data):
            raise ProjectSourceError("The file is binary; write it whole with write_sandbox_file.")
        text = data.decode("utf-8", errors="replace")
        count = text.count(old_text)
        if count == 0:
            raise EditNotFound(
                "old_text does not occur in the file; read it again and copy the text exactly.",
                path=path,
            )
        if count > 1 and not replace_all:
            raise EditNotUnique(
                f"old_text occurs {count} times; add surrounding lines to make it unique, "
                "or pass replace_all=true.",
                path=path,
                occurrences=count,
            )
        updated = (
            text.replace(old_text, new_text) if replace_all else text.replace(old_text, new_text, 1)
        )
        encoded = updated.encode()
        jail.write_bytes(path, encoded)
    edits.record_read(_edit_key(experiment_id, path), _sha(encoded))
    return FileWritten(
        path=path, bytes_written=len(encoded), replacements=count if replace_all else 1
    )


def _entries(jail: Jail, top: str, max_entries: int) -> Iterator[PathInfo]:
    for info in jail.walk(top, max_entries=max_entries):
        parts = info.path.split("/")
        if any(part in SKIPPED_DIRS for part in parts[:-1]):
            continue
        yield info


def list_files(workspace: Path, path: str = ".", *, max_entries: int = 500) -> FileTree:
    entries: list[FileEntry] = []
    truncated = False
    with Jail.open(workspace) as jail:
        try:
            for info in _entries(jail, path, max_entries * 4):
                if len(entries) >= max_entries:
                    truncated = True
                    break
                entries.append(
                    FileEntry(
                        path=info.path, kind=info.kind, size=info.size, link_target=info.link_target
                    )
                )
        except JailError as exc:
            if exc.code != "TOO_MANY_ENTRIES":
                raise
            truncated = True
    return FileTree(root=path, entries=entries, truncated=truncated)


def search(
    workspace: Path, pattern: str, path: str = ".", *, max_results: int = 200
) -> SearchResult:
    matcher = compile_search(pattern)  # RE2: linear time, so the budget below holds
    matches: list[SearchMatch] = []
    searched = 0
    truncated = False
    deadline = time.monotonic() + SEARCH_BUDGET_S
    with Jail.open(workspace) as jail:
        try:
            walked = list(_entries(jail, path, 50_000))
        except JailError as exc:
            if exc.code != "TOO_MANY_ENTRIES":
                raise
            walked, truncated = [], True
        for info in walked:
            if info.kind != "file" or info.size > MAX_SEARCH_FILE_BYTES:
                continue
            if time.monotonic() > deadline or len(matches) >= max_results:
                truncated = True
                break
            try:
                data = jail.read_bytes(info.path, max_bytes=MAX_SEARCH_FILE_BYTES)
            except JailError:
                continue  # vanished or swapped for a link meanwhile
            if is_binary(data):
                continue
            searched += 1
            for number, line in enumerate(data.decode("utf-8", "replace").splitlines(), start=1):
                if matcher.search(line):
                    matches.append(SearchMatch(path=info.path, line=number, text=line[:500]))
                    if len(matches) >= max_results:
                        break
                if time.monotonic() > deadline:  # one file can hold a million lines
                    truncated = True
                    break
    return SearchResult(
        pattern=pattern, matches=matches, files_searched=searched, truncated=truncated
    )
