"""What changed in an experiment's workspace since its baseline: files, links, modes, a diff.

Both trees are read only through a ``Jail``. The workspace is shared with a
container that may plant links and FIFOs or swap folders for links while we
read; the jail keeps every open beneath the root and refuses special files, so
the worst such a race can do is make this report describe the workspace wrongly.

The baseline is a pack (jail/pack.py: one file the server wrote as it copied the
project), or, for an experiment made before packs, a folder beside the workspace.
A file whose size and modification time both equal the baseline's is taken as
unchanged without being read (the baseline keeps the copy's mtimes). Content
changed by something that restores both, such as ``cp -p`` or ``touch -r`` over a
same-size edit, is therefore missed: that is the price of not reading 5,000 files.
"""

from __future__ import annotations

import contextlib
import fnmatch
import os
import re
import stat
from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Literal

from pydantic import BaseModel, ConfigDict

from app.experiments.core.result import Result
from app.experiments.workspace import diff as _diff
from jail import Jail, JailError, PathInfo
from jail.pack import Pack

DEFAULT_EXCLUDED = frozenset(
    {
        "node_modules", "bower_components", ".git", ".hg", ".svn", "__pycache__", ".venv",
        "venv", "dist", "build", "target", ".pytest_cache", ".mypy_cache", ".ruff_cache",
        ".tox", ".nox", ".eggs", "*.egg-info", ".next", ".nuxt", ".svelte-kit", ".turbo",
        ".parcel-cache", ".gradle", ".cache", "coverage", "htmlcov",
    }
)  # fmt: skip
# What an experiment's changes leave out (inspect_changes, its evidence), and so what its
# baseline pack need not hold: dependencies, build output and test reports.
EXCLUDED = DEFAULT_EXCLUDED | {".sandbox-reports"}
READ_LIMIT = 2 * 1024 * 1024  # larger files are compared, never diffed or line-counted
COMPARE_LIMIT = 64 * 1024 * 1024  # same-size large files past this count as changed, unread
READ_BUDGET = 256 * 1024 * 1024  # bytes read for one report, both trees together
MAX_NOTES = 50

_Info = PathInfo | None
_Lines = Iterator[str] | None


class FileChange(BaseModel):
    """One created, modified or deleted entry; line counts are 0 for binary and large
    files, and sizes are given for regular files only."""

    model_config = ConfigDict(frozen=True)

    path: str
    kind: Literal["file", "symlink", "dir"]
    insertions: int = 0
    deletions: int = 0
    binary: bool = False
    mode_change: str | None = None  # "100644 -> 100755"
    link_change: str | None = None  # "old-target -> new-target"; "(none)" or "(file)" if not a link
    size_before: int | None = None
    size_after: int | None = None


class ChangeReport(Result):
    """Changes since the baseline; ``files_changed`` counts files and links, not folders.
    (``inspect_changes`` returns it as it is, with the experiment's id: ``ChangesView``.)"""

    model_config = ConfigDict(frozen=True)

    created: list[FileChange]
    modified: list[FileChange]
    deleted: list[FileChange]
    insertions: int
    deletions: int
    files_changed: int
    diff: str | None = None
    diff_truncated: bool = False


def inspect(
    workspace: Path,
    baseline: Path,
    *,
    include_diff: bool,
    max_diff_bytes_per_file: int = 64_000,
    max_diff_bytes_total: int = 512_000,
    max_files_with_diff: int | None = None,
    max_entries: int = 200_000,
    excluded_dirs: frozenset[str] = DEFAULT_EXCLUDED,
) -> ChangeReport:
    """Compare ``workspace`` with ``baseline``, a folder or a pack (blocking: run it in
    a thread).

    Folders named in ``excluded_dirs`` (names or globs) are neither walked nor
    reported. ``max_files_with_diff`` caps the files whose diff is included (all
    changes are still listed). Entries that vanish or cannot be read mid-way become notes.

    Raises:
        JailError: the workspace or baseline folder itself cannot be opened.
    """
    notes = _Notes()
    skip = _excluder(excluded_dirs)
    with Jail.open(workspace) as ws, _open_baseline(baseline) as base:
        after = _walk(ws, "workspace", skip, max_entries, notes)
        before = _walk(base, "baseline", skip, max_entries, notes)
        writer = _diff.DiffWriter(
            max_diff_bytes_per_file, max_diff_bytes_total, max_files_with_diff
        )
        reader = _diff.ContentReader(READ_LIMIT, COMPARE_LIMIT, READ_BUDGET, notes.add)
        cmp = _Comparer(base, ws, writer if include_diff else None, notes, reader)
        for path in sorted(after.entries.keys() | before.entries.keys()):
            old, new = before.entries.get(path), after.entries.get(path)
            if old and new and (old.kind == "dir") == (new.kind == "dir"):
                cmp.both(path, old, new)
                continue
            # Absent on one side, or a folder on one side only: deleted and/or created.
            if old and (new or after.covers(path)):
                cmp.one_side(path, old, created=False, empty=path in before.empty)
            if new and (old or before.covers(path)):
                cmp.one_side(path, new, created=True, empty=path in after.empty)
    changes = cmp.created + cmp.modified + cmp.deleted
    return ChangeReport(
        created=cmp.created,
        modified=cmp.modified,
        deleted=cmp.deleted,
        insertions=sum(c.insertions for c in changes),
        deletions=sum(c.deletions for c in changes),
        files_changed=sum(c.kind != "dir" for c in changes),
        diff=writer.text() if include_diff else None,
        diff_truncated=include_diff and writer.truncated,
        notes=notes.lines(),
    )


def _open_baseline(baseline: Path) -> AbstractContextManager[_diff.Side]:
    """The baseline's reader: a pack file, or a folder (experiments made before packs)."""
    with contextlib.suppress(FileNotFoundError):
        if stat.S_ISREG(os.lstat(baseline).st_mode):
            return Pack.open(baseline)
    return Jail.open(baseline)


class _Notes:
    def __init__(self) -> None:
        self._lines: list[str] = []
        self._dropped = 0

    def add(self, text: str) -> None:
        # A hostile workspace can hold a million FIFOs; the report stays small.
        if len(self._lines) < MAX_NOTES:
            self._lines.append(_diff.display(text))
        else:
            self._dropped += 1

    def lines(self) -> list[str]:
        extra = [f"... and {self._dropped} more notes"] if self._dropped else []
        return self._lines + extra


def excluder(names: frozenset[str]) -> Callable[[str], bool]:
    """Whether a folder name is one of ``names`` (names or globs)."""
    return _excluder(names)


def _excluder(names: frozenset[str]) -> Callable[[str], bool]:
    globs = [n for n in names if any(ch in n for ch in "*?[")]
    plain = names.difference(globs)
    pattern = re.compile("|".join(map(fnmatch.translate, globs)) or "(?!)")
    return lambda name: name in plain or pattern.match(name) is not None


@dataclass
class _Tree:
    entries: dict[str, PathInfo] = field(default_factory=dict)
    listed: set[str] = field(default_factory=set)  # folders whose every entry was seen
    empty: set[str] = field(default_factory=set)

    def covers(self, path: str) -> bool:
        """Whether the walk saw enough of this tree to say that ``path`` is not in it."""
        parent = path
        while True:
            parent = parent.rpartition("/")[0] or "."
            if parent == ".":
                return parent in self.listed
            info = self.entries.get(parent)
            if info is not None:
                return info.kind != "dir" or parent in self.listed


def _walk(
    jail: _diff.Side, side: str, skip: Callable[[str], bool], max_entries: int, notes: _Notes
) -> _Tree:
    # Folder by folder, so excluded folders are never entered: jail.walk cannot
    # prune, and node_modules alone would eat the entry budget. list_dir follows
    # a link only while it stays inside, so a folder swapped for a link mid-walk
    # can at most show us another folder of the same tree.
    tree, pending, left = _Tree(), ["."], max_entries  # FIFOs and excluded folders count too
    while pending:
        folder = pending.pop()
        try:
            infos = jail.list_dir(folder, max_entries=left)
        except JailError as exc:
            if exc.code == "TOO_MANY_ENTRIES":
                notes.add(f"{side}: over {max_entries} entries, the rest not compared")
                break
            notes.add(f"{side}: folder {_diff.shown_path(folder)} not compared ({exc.code})")
            continue
        tree.listed.add(folder)
        left -= len(infos)
        if not infos:
            tree.empty.add(folder)
        for info in infos:
            if info.kind == "other":
                notes.add(f"{side}: special file {_diff.shown_path(info.path)} skipped")
            elif info.kind != "dir" or not skip(info.path.rpartition("/")[2]):
                tree.entries[info.path] = info
                if info.kind == "dir":
                    pending.append(info.path)
    return tree


@dataclass
class _Comparer:
    base: _diff.Side
    ws: Jail
    writer: _diff.DiffWriter | None
    notes: _Notes
    reader: _diff.ContentReader
    created: list[FileChange] = field(default_factory=list)
    modified: list[FileChange] = field(default_factory=list)
    deleted: list[FileChange] = field(default_factory=list)

    def one_side(self, path: str, info: PathInfo, *, created: bool, empty: bool) -> None:
        listing = self.created if created else self.deleted
        if info.kind != "dir":
            change = self._change(path, None, info) if created else self._change(path, info, None)
            if change is not None:
                listing.append(change)
        elif empty:
            listing.append(FileChange(path=_diff.display(path), kind="dir"))

    def both(self, path: str, old: PathInfo, new: PathInfo) -> None:
        if old.kind == "dir":
            return  # both folders: their entries speak for them
        if old.kind != new.kind:
            became = "a symbolic link" if new.kind == "symlink" else "a regular file"
            self.notes.add(f"{_diff.shown_path(path)} became {became}")
        change = self._change(path, old, new)
        if change is not None:
            self.modified.append(change)

    def _change(self, path: str, old: _Info, new: _Info) -> FileChange | None:
        old_file = old if old is not None and old.kind == "file" else None
        new_file = new if new is not None and new.kind == "file" else None
        text = self._content(path, old_file, new_file)
        mode = None
        if old_file and new_file and old_file.mode != new_file.mode:
            mode = f"{0o100000 | old_file.mode:o} -> {0o100000 | new_file.mode:o}"
        link = None
        if _target(old) != _target(new) and "symlink" in (_kind(old), _kind(new)):
            link = _diff.display(f"{_target(old)} -> {_target(new)}")
        if text is None and mode is None and link is None:
            return None
        return FileChange(
            path=_diff.display(path),
            kind="symlink" if _kind(new or old) == "symlink" else "file",
            insertions=text.insertions if text else 0,
            deletions=text.deletions if text else 0,
            binary=text.binary if text else False,
            mode_change=mode,
            link_change=link,
            size_before=old_file.size if old_file else None,
            size_after=new_file.size if new_file else None,
        )

    def _content(self, path: str, old: _Info, new: _Info) -> _diff.TextChange | None:
        """How the regular-file content at ``path`` changed; None if it did not."""
        if old is None and new is None:
            return None
        if old and new and (old.size, old.mtime_ns) == (new.size, new.mtime_ns):
            return None
        before = self.reader.read(self.base, old) if old else b""
        after = self.reader.read(self.ws, new) if new else b""
        if before is None or after is None:
            return self._unread(path, old, new)
        if old and new and before == after:
            return None
        text = _diff.compare_bytes(before, after)
        if not text.exact:
            self.notes.add(f"{_diff.shown_path(path)}: too many scattered edits, counts are high")
        self._emit(path, old, new, text.hunks, "Binary files {} and {} differ")
        return text

    def _unread(self, path: str, old: _Info, new: _Info) -> _diff.TextChange | None:
        """A file too large (or unreadable) to diff: compared if need be, never counted."""
        large = max(old.size if old else 0, new.size if new else 0) > READ_LIMIT
        if large and old and new and self.reader.same(self.base, self.ws, old, new):
            return None
        if large:
            self.notes.add(f"{_diff.shown_path(path)}: over {READ_LIMIT} bytes, not line-counted")
        side, jail = (new, self.ws) if new is not None else (old, self.base)
        binary = side is not None and self.reader.looks_binary(jail, side)
        self._emit(path, old, new, None, "Files {} and {} differ (not diffed)")
        return _diff.TextChange(0, 0, binary, None)

    def _emit(self, path: str, old: _Info, new: _Info, hunks: _Lines, summary: str) -> None:
        if self.writer is not None:
            self.writer.add(path, old is None, new is None, hunks, summary)


def _kind(info: _Info) -> str | None:
    return info.kind if info is not None else None


def _target(info: _Info) -> str:
    if info is None:
        return "(none)"
    return (info.link_target or "") if info.kind == "symlink" else f"({info.kind})"
