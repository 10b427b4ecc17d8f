"""Where an experiment's files live inside its slot, and how a project gets there.

    <slot root>/exp-<id>/workspace   mounted read-write at /workspace, nothing else is
    <slot root>/exp-<id>/baseline    the files as they were before any command ran

The baseline sits beside the workspace, never inside a mount, so no process in
a container can change what its changes are measured against.
"""

from __future__ import annotations

import os
import shutil
import subprocess
from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

import structlog

from app.experiments.core.errors import ProjectSourceError
from jail import Jail, snapshot_copy
from jail.context import InThread
from jail.tree_delete import delete_tree
from pool.spread import spread_subfolders

log = structlog.get_logger(__name__)

_CP = shutil.which("cp") or "/bin/cp"  # GNU coreutils

MAX_FILES = 2000
MAX_FILES_BYTES = 50 * 1024 * 1024


@dataclass(frozen=True)
class ExperimentDirs:
    root: Path
    workspace: Path
    baseline: Path

    @classmethod
    def of(cls, slot_root: Path, experiment_id: str) -> ExperimentDirs:
        root = slot_root / f"exp-{experiment_id}"
        return cls(root, root / "workspace", root / "baseline")


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


# A cloned tree is copied into the baseline (cp -a) and chowned with path-based calls
# (os.walk recurses once per level on Python 3.11), so it
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
    """The baseline of a clone, and the workspace the sandbox user's."""
    if not dirs.baseline.exists():
        # A clone: no tenant process has run on this workspace (the clone helper is
        # gone; a warm container runs only its keep-alive), so a plain copy is
        # race-free. cp -a copies links as links (never follows one), keeps mtimes
        # (the diff trusts equal size and mtime) and is native code.
        subprocess.run(  # noqa: S603 - argv of our own paths, no shell
            [_CP, "-a", "--no-target-directory", "--", str(dirs.workspace), str(dirs.baseline)],
            check=True,
            capture_output=True,
        )
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
    # A project is read once: one walk fills the workspace and the baseline (beside
    # it, out of every mount); given files are written to both (no cp process on the
    # warm path); a clone is copied to the baseline by _finish.
    dirs.baseline.mkdir(mode=0o755)
    if project_path is not None:
        snap = snapshot_copy(
            project_path, dirs.workspace, extra_excludes=excludes, mirror=dirs.baseline, owner=ids
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
            mirror=dirs.baseline,
            owner=ids,
        )
        report = WorkspaceReport("from_experiment", snap.files_copied, snap.secrets_skipped, 0)
    elif files:
        _write_files(dirs.workspace, files, dirs.baseline)
        report = WorkspaceReport("files", len(files))
    else:
        report = WorkspaceReport("empty", 0)
    # A snapshot gave the workspace its owner as it copied (no second walk).
    _finish(dirs, None if project_path is not None or copy_from is not None else owner)
    return report


def _write_files(workspace: Path, files: Mapping[str, str], baseline: Path) -> None:
    if len(files) > MAX_FILES:
        raise ProjectSourceError(f"At most {MAX_FILES} files can be given; split the project.")
    total = sum(len(content.encode()) for content in files.values())
    if total > MAX_FILES_BYTES:
        raise ProjectSourceError(
            f"The files add up to {total} bytes; at most {MAX_FILES_BYTES} are accepted."
        )
    with Jail.open(workspace) as jail, Jail.open(baseline) as base:
        for path, content in files.items():
            data = content.encode()
            jail.write_bytes(path, data, make_parents=True)
            base.write_bytes(path, data, make_parents=True)
            _same_times(jail, base, path)


def _same_times(workspace: Jail, baseline: Jail, path: str) -> None:
    # The diff takes equal size and mtime as unchanged (app/experiments/workspace/changes.py).
    src = workspace.open_fd(path, os.O_RDONLY)
    try:
        st = os.fstat(src)
    finally:
        os.close(src)
    dst = baseline.open_fd(path, os.O_RDONLY)
    try:
        os.utime(dst, ns=(st.st_atime_ns, st.st_mtime_ns))
    finally:
        os.close(dst)


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
