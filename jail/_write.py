"""Creating things beneath the root: atomic file replacement and ``mkdir -p``.

A file is never written in place. The new content goes to a fresh temporary
file (O_CREAT|O_EXCL, so not even a planted link is followed) in the target's
folder, which is then renamed over the target: readers see the old or the new
content, never a torn mix, and a hard link to some other inode is never written
through. Both steps use a descriptor of the folder, pinned when it was
resolved beneath the root, so swapping a path component mid-way cannot move
the write elsewhere.

There is no fsync: sandboxes are disposable, and ext4 and ZFS already order a
rename-over-existing after the data it replaces (ext4 ``auto_da_alloc``).
"""

from __future__ import annotations

import contextlib
import errno
import os
import secrets
import stat

from jail._anchor import Anchor
from jail._oserrors import for_errno, translate
from jail._paths import ROOT, join, quote, split_parent
from jail.errors import JailError
from jail.privilege import can_chown

_MAX_LINK_HOPS = 40  # path_resolution(7)
_NEW_FILE_MODE = 0o644
_NEW_DIR_MODE = 0o755
_O_NEW_DIR = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC


def write_atomic(anchor: Anchor, path: str, data: bytes) -> None:
    """Replace the file at normalised ``path`` with ``data``.

    A symbolic link as the final component is followed while it stays inside
    (it is the link's target that gets replaced, as ``echo >link`` would), by
    re-resolving ``<folder of the link>/<target>`` from the root, so the
    kernel's RESOLVE_BENEATH judges each hop. An absolute target is refused,
    as everywhere in the jail. A dangling link whose target folder exists
    creates its target, like the shell does.
    """
    if path == ROOT:
        raise for_errno(errno.EISDIR, path)
    parent, name = split_parent(path)
    for hop in range(_MAX_LINK_HOPS + 1):
        dir_fd = (
            _open_link_folder(anchor, parent, path) if hop else anchor.open_dir(parent, shown=path)
        )
        try:
            current = _lstat(dir_fd, name)
            if current is None or not stat.S_ISLNK(current.st_mode):
                _check_replaceable(current, path)
                _replace(dir_fd, name, data, current)
                return
            target = os.readlink(name, dir_fd=dir_fd)
        except OSError as exc:
            raise translate(exc, path) from exc
        finally:
            os.close(dir_fd)
        if target.startswith("/"):
            raise for_errno(errno.EXDEV, path)
        folder, _, name = target.rpartition("/")
        if name in ("", ".", ".."):
            # The link names a folder; resolving it tells an escape from EISDIR.
            os.close(anchor.open(join(parent, target), os.O_PATH, shown=path))
            raise for_errno(errno.EISDIR, path)
        parent = join(parent, folder) if folder else parent
    raise for_errno(errno.ELOOP, path)


def _open_link_folder(anchor: Anchor, folder: str, path: str) -> int:
    """Open the folder a link's target lives in; its absence makes the link dangling."""
    try:
        return anchor.open_dir(folder, shown=path)
    except JailError as err:
        if err.code == "NOT_FOUND":
            raise anchor.dangling(path) from err
        raise


def make_dirs(anchor: Anchor, path: str) -> None:
    """``mkdir -p`` for normalised ``path``; existing folders (and links to them) are fine."""
    if path == ROOT or _is_dir(anchor, path, path):
        return
    parts = path.split("/")
    for depth in range(1, len(parts) + 1):
        prefix = "/".join(parts[:depth])
        if _is_dir(anchor, prefix, path):
            continue
        dir_fd = anchor.open_dir("/".join(parts[: depth - 1]) or ROOT, shown=path)
        try:
            _mkdir(dir_fd, parts[depth - 1])
        except FileExistsError:
            pass  # a concurrent creator, or a dangling link: the re-check below decides
        except OSError as exc:
            raise translate(exc, path) from exc
        finally:
            os.close(dir_fd)
        if not _is_dir(anchor, prefix, path):
            raise JailError(
                "ALREADY_EXISTS",
                f"{quote(path)} cannot be created because {quote(prefix)} is not a folder.",
                {"path": path},
            )


def _mkdir(dir_fd: int, name: str) -> None:
    os.mkdir(name, _NEW_DIR_MODE, dir_fd=dir_fd)
    if can_chown():
        fd = os.open(name, _O_NEW_DIR, dir_fd=dir_fd)
        try:
            _inherit_owner(fd, os.fstat(dir_fd))
        finally:
            os.close(fd)


def _is_dir(anchor: Anchor, path: str, shown: str) -> bool:
    """Whether ``path`` resolves to a folder; False when it does not exist."""
    try:
        fd = anchor.open(path, os.O_PATH, shown=shown)
    except JailError as err:
        if err.code == "NOT_FOUND":
            return False
        raise
    try:
        return stat.S_ISDIR(os.fstat(fd).st_mode)
    finally:
        os.close(fd)


def _lstat(dir_fd: int, name: str) -> os.stat_result | None:
    try:
        return os.lstat(name, dir_fd=dir_fd)
    except FileNotFoundError:
        return None


def _check_replaceable(current: os.stat_result | None, path: str) -> None:
    if current is None or stat.S_ISREG(current.st_mode):
        return
    if stat.S_ISDIR(current.st_mode):
        raise for_errno(errno.EISDIR, path)
    raise for_errno(errno.ENXIO, path)


def _replace(dir_fd: int, name: str, data: bytes, current: os.stat_result | None) -> None:
    temp = f".sandbox-mcp-{secrets.token_hex(8)}.tmp"
    flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC
    fd = os.open(temp, flags, 0o600, dir_fd=dir_fd)
    try:
        try:
            view = memoryview(data)
            while view:
                view = view[os.write(fd, view) :]
            os.fchmod(fd, stat.S_IMODE(current.st_mode) if current else _NEW_FILE_MODE)
            if can_chown():
                _inherit_owner(fd, current or os.fstat(dir_fd))
        finally:
            os.close(fd)
        os.rename(temp, name, src_dir_fd=dir_fd, dst_dir_fd=dir_fd)
    except BaseException:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(temp, dir_fd=dir_fd)
        raise


def _inherit_owner(fd: int, owner: os.stat_result) -> None:
    """Give ``fd`` the owner of the file it replaces (or of its folder, when new).

    Only called when the server may chown (root, or CAP_CHOWN), which would otherwise leave
    root-owned files that the sandbox's own unprivileged user cannot edit.
    """
    now = os.fstat(fd)
    if (now.st_uid, now.st_gid) != (owner.st_uid, owner.st_gid):
        os.fchown(fd, owner.st_uid, owner.st_gid)
