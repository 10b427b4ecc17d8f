"""Where an experiment's files live inside its slot, and how a project gets there.

    <slot root>/exp-<id>/workspace       mounted read-write at /workspace, nothing else is
    <slot root>/exp-<id>/baseline.pack   the files as they were before any command ran

The baseline sits beside the workspace, never inside a mount, so no process in
a container can change what its changes are measured against. It is one file
(jail/pack.py), written in the walk that fills the workspace: a second tree of
copies cost as much again, on zfs-fuse more than the workspace itself (5,000
files: 3.4 s against 0.77 s on dir slots), and its destroy deleted twice the
files. Experiments made before packs keep a ``baseline`` folder, which the diff
still reads.
"""

from __future__ import annotations

import os
from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

import structlog

from app.experiments.core.errors import ProjectSourceError
from app.experiments.workspace import changes
from jail import Jail, snapshot_copy
from jail.context import InThread
from jail.pack import pack_tree
from jail.tree_delete import delete_tree
from pool.spread import spread_subfolders

log = structlog.get_logger(__name__)

# The baseline pack records what the changes are measured on: the contents of the folders
# they never walk (node_modules, .git, build output) would only cost time and disk.
_LEFT_OUT = changes.excluder(changes.EXCLUDED)

MAX_FILES = 2000
MAX_FILES_BYTES = 50 * 1024 * 1024


@dataclass(frozen=True)
class ExperimentDirs:
    root: Path
    workspace: Path
    baseline: Path  # a folder: experiments made before packs

    @classmethod
    def of(cls, slot_root: Path, experiment_id: str) -> ExperimentDirs:
        root = slot_root / f"exp-{experiment_id}"
        return cls(root, root / "workspace", root / "baseline")

    @property
    def pack(self) -> Path:
        """The baseline as one file (jail/pack.py)."""
        return self.root / "baseline.pack"

    def kept_baseline(self) -> Path:
        """What the changes are measured against: the pack, or an older experiment's
        folder."""
        return self.pack if self.pack.exists() else self.baseline


@dataclass(frozen=True)
class Owner:
    uid: int
    gid: int


@dataclass(frozen=True)
class WorkspaceReport:
    source: str
    files: int
    secrets_skipped: int = 0
    build_skipped: int = 0


Cloner = Callable[[Path], Awaitable[int]]


async def prepare(
    dirs: ExperimentDirs,
    *,
    files: Mapping[str, str] | None,
    project_path: Path | None,
    copy_from: ExperimentDirs | None,
    excludes: Sequence[str],
    owner: Owner | None,
    clone: Cloner | None = None,
    made: bool = False,
    in_thread: InThread,
) -> WorkspaceReport:
    """Create the folders, fill the workspace from one source, and capture the baseline.

    ``in_thread`` runs the copies: the creating sandbox's thread share.
    ``made``: the folders exist already (:func:`make_dirs`, or a warm container's
    renamed to this experiment's), the workspace empty; a container may have it
    mounted, but runs nothing of the tenant's yet.

    ``clone`` fills the (empty, owned by the sandbox user) workspace itself, in a
    helper container, and returns how many files it brought.

    Raises:
        ProjectSourceError: too many or too large ``files``, or a failed clone.
        JailError: a refused path (in ``files``) or project path.
    """
    if clone is None:
        return await in_thread(
            _prepare, dirs, files, project_path, copy_from, tuple(excludes), owner, made
        )
    if not made:
        await in_thread(_make_dirs, dirs, owner)
    count = await clone(dirs.workspace)
    await in_thread(_finish, dirs, owner)
    return WorkspaceReport("git", count)


# A cloned tree is packed (jail/pack.py, which stops at the same depth) and chowned
# with path-based calls (os.walk recurses once per level on Python 3.11), so it
# must stay well inside the recursion limit and PATH_MAX. The jail's snapshot
# copier stops at the same depth.
MAX_CLONE_DEPTH = 256
MAX_CLONE_PATH = 3000  # bytes, relative to the workspace


def count_cloned_files(root: Path) -> int:
    """Files in a fresh clone (``.git`` aside), checking its shape first, without recursing.

    Raises:
        ProjectSourceError: folders nested deeper than MAX_CLONE_DEPTH, or a path
            longer than MAX_CLONE_PATH.
    """
    count = 0
    pending: list[tuple[str, int]] = [("", 0)]
    while pending:
        relative, depth = pending.pop()
        try:
            with os.scandir(root / relative if relative else root) as entries:
                found = [(e.name, e.is_dir(follow_symlinks=False)) for e in entries]
        except OSError as exc:
            raise ProjectSourceError(
                f"The cloned repository could not be read ({exc.strerror})."
            ) from None
        for name, is_dir in found:
            path = f"{relative}/{name}" if relative else name
            if len(path.encode()) > MAX_CLONE_PATH:
                raise ProjectSourceError(
                    f"The repository holds a path longer than {MAX_CLONE_PATH} bytes; "
                    "such a tree cannot be used as a workspace."
                )
            if is_dir and depth + 1 > MAX_CLONE_DEPTH:
                raise ProjectSourceError(
                    f"The repository's folders nest more than {MAX_CLONE_DEPTH} levels deep; "
                    "such a tree cannot be used as a workspace."
                )
            if is_dir:
                pending.append((path, depth + 1))
            elif ".git" not in path.split("/"):
                count += 1
    return count


async def make_dirs(dirs: ExperimentDirs, owner: Owner | None, in_thread: InThread) -> None:
    """The experiment's folder and its empty workspace (the sandbox user's), for
    :func:`prepare` with ``made`` (a container may be started on it meanwhile)."""
    await in_thread(_make_dirs, dirs, owner)


def _make_dirs(dirs: ExperimentDirs, owner: Owner | None) -> None:
    # Slots made before the pool set this flag: a big create after a destroy in the
    # same ext4 block group takes seconds (pool/spread.py says why). One ioctl.
    spread_subfolders(dirs.root.parent)
    dirs.root.mkdir(mode=0o700)
    dirs.workspace.mkdir(mode=0o755)
    if owner is not None:
        os.chown(dirs.workspace, owner.uid, owner.gid)


def _finish(dirs: ExperimentDirs, owner: Owner | None) -> None:
    """The baseline of a clone or of given files, and the workspace the sandbox user's."""
    if not dirs.pack.exists():
        # A clone or files the server wrote: no tenant process has run on this
        # workspace (the clone helper is gone; a warm container runs only its
        # keep-alive), so packing it as it is is race-free. The walk never follows a
        # link (it records its text) and records the mtimes the files have (the diff
        # trusts equal size and mtime).
        pack_tree(dirs.workspace, dirs.pack, _LEFT_OUT)
    if owner is not None:
        _chown_tree(dirs.workspace, owner)


def _prepare(
    dirs: ExperimentDirs,
    files: Mapping[str, str] | None,
    project_path: Path | None,
    copy_from: ExperimentDirs | None,
    excludes: tuple[str, ...],
    owner: Owner | None,
    made: bool = False,
) -> WorkspaceReport:
    ids = (owner.uid, owner.gid) if owner is not None else None
    if not made:
        _make_dirs(dirs, None)
    # A project is read once: one walk fills the workspace and packs the baseline
    # (beside it, out of every mount); given files and a clone are packed by _finish.
    if project_path is not None:
        snap = snapshot_copy(
            project_path,
            dirs.workspace,
            extra_excludes=excludes,
            pack=dirs.pack,
            pack_leave_out=_LEFT_OUT,
            owner=ids,
        )
        report = WorkspaceReport(
            "project_path", snap.files_copied, snap.secrets_skipped, snap.build_skipped
        )
    elif copy_from is not None:
        # The other experiment's container may still run: snapshot_copy opens every
        # component relative to its parent with O_NOFOLLOW, so its links cannot lead out.
        snap = snapshot_copy(
            copy_from.workspace,
            dirs.workspace,
            include_build_output=True,
            pack=dirs.pack,
            pack_leave_out=_LEFT_OUT,
            owner=ids,
        )
        report = WorkspaceReport("from_experiment", snap.files_copied, snap.secrets_skipped, 0)
    elif files:
        _write_files(dirs.workspace, files)
        report = WorkspaceReport("files", len(files))
    else:
        report = WorkspaceReport("empty", 0)
    # A snapshot gave the workspace its owner as it copied (no second walk).
    _finish(dirs, None if project_path is not None or copy_from is not None else owner)
    return report


def _write_files(workspace: Path, files: Mapping[str, str]) -> None:
    if len(files) > MAX_FILES:
        raise ProjectSourceError(f"At most {MAX_FILES} files can be given; split the project.")
    total = sum(len(content.encode()) for content in files.values())
    if total > MAX_FILES_BYTES:
        raise ProjectSourceError(
            f"The files add up to {total} bytes; at most {MAX_FILES_BYTES} are accepted."
        )
    with Jail.open(workspace) as jail:
        for path, content in files.items():
            jail.write_bytes(path, content.encode(), make_parents=True)


def _chown_tree(top: Path, owner: Owner) -> None:
    # The container runs as an unprivileged user; it must own what it works on.
    os.chown(top, owner.uid, owner.gid)
    for base, folders, names in os.walk(top):
        for name in folders + names:
            os.chown(os.path.join(base, name), owner.uid, owner.gid, follow_symlinks=False)


async def remove(dirs: ExperimentDirs, in_thread: InThread) -> None:
    """Delete an experiment's folders (its container must be gone), in a thread of the
    caller's share."""
    try:
        # Iterative: a tenant's tree may be deeper than rmtree's recursion allows.
        await in_thread(delete_tree, dirs.root)
    except OSError:
        # As before (rmtree's ignore_errors): what is left stays until its slot is reset.
        log.exception("workspace.remove_failed", path=str(dirs.root))
