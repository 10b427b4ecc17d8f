"""Delete a tenant's folder tree however deep it is, never following a link.

``shutil.rmtree`` (Python 3.11 and 3.12) recurses once per level and keeps one
descriptor open per level: a 1,500-deep tree raises RecursionError, a tree
deeper than the descriptor limit fails with EMFILE, and neither is an OSError
a caller expects. This walk is a loop: it holds at most three descriptors
whatever the depth and remembers only the names still to visit and the
(device, inode) of each folder on the way down.

Links are never followed: every folder is opened relative to its parent with
O_NOFOLLOW and checked against the lstat that listed it, and the way back up
(``..``) is checked against the remembered identity, so a folder moved or
swapped while the walk runs stops it with an OSError instead of deleting
elsewhere. Folders a tenant left at mode 0000/0500 are given rwx for their
owner first (when this process owns them or is root).
"""

from __future__ import annotations

import contextlib
import errno
import os
import stat
import threading
from dataclasses import dataclass, field

_O_DIR = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC
_O_PATH_DIR = os.O_PATH | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC
_OWNER_RWX = 0o700


class DeleteStopped(Exception):
    """``stop`` was set before the tree was gone; what is left stays on disk."""


@dataclass
class _Level:
    name: str  # this folder's name in its parent
    identity: tuple[int, int]  # (st_dev, st_ino)
    subdirs: list[str] = field(default_factory=list)


def delete_tree(path: str | os.PathLike[str], *, stop: threading.Event | None = None) -> None:
    """Delete ``path`` (a file, a link or a folder tree). A missing path is fine."""
    parent, name = os.path.split(os.path.abspath(os.fspath(path)))
    parent_fd = os.open(parent, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    try:
        delete_tree_at(parent_fd, name, stop=stop)
    finally:
        os.close(parent_fd)


def delete_tree_at(dir_fd: int, name: str, *, stop: threading.Event | None = None) -> None:
    """Delete entry ``name`` of the open folder ``dir_fd`` and everything below it.

    Entries that vanish meanwhile are skipped. Raises OSError when an entry
    cannot be deleted or the tree changed shape under the walk, and
    :class:`DeleteStopped` when ``stop`` is set (checked once per folder).
    """
    try:
        st = os.lstat(name, dir_fd=dir_fd)
    except FileNotFoundError:
        return
    if not stat.S_ISDIR(st.st_mode):
        with contextlib.suppress(FileNotFoundError):
            os.unlink(name, dir_fd=dir_fd)
        return
    fd = _open_subdir(dir_fd, name, st)
    if fd is None:
        return
    chain = [_Level(name, _identity(st))]
    try:
        chain[-1].subdirs = _clear_files(fd)
        while True:
            if stop is not None and stop.is_set():
                raise DeleteStopped(name)
            level = chain[-1]
            if level.subdirs:
                child = level.subdirs.pop()
                opened = _descend(fd, child)
                if opened is None:
                    continue  # vanished or became a file (already unlinked)
                child_fd, child_st = opened
                os.close(fd)
                fd = child_fd
                chain.append(_Level(child, _identity(child_st)))
                chain[-1].subdirs = _clear_files(fd)
                continue
            # ``fd`` holds no more entries: go back up and remove it.
            chain.pop()
            if not chain:
                break
            parent_fd = os.open("..", _O_DIR & ~os.O_NOFOLLOW, dir_fd=fd)
            if _identity(os.fstat(parent_fd)) != chain[-1].identity:
                os.close(parent_fd)
                raise OSError(errno.ESTALE, "a folder was moved while its tree was deleted")
            os.close(fd)
            fd = parent_fd
            _rmdir(fd, level.name)
    finally:
        os.close(fd)
    # Not _rmdir: the caller's folder keeps its mode.
    with contextlib.suppress(FileNotFoundError):
        os.rmdir(name, dir_fd=dir_fd)


def _identity(st: os.stat_result) -> tuple[int, int]:
    return (st.st_dev, st.st_ino)


def _descend(fd: int, name: str) -> tuple[int, os.stat_result] | None:
    """Open subfolder ``name`` of ``fd``; a non-folder found there is unlinked instead."""
    try:
        st = os.lstat(name, dir_fd=fd)
    except FileNotFoundError:
        return None
    if not stat.S_ISDIR(st.st_mode):
        _unlink(fd, name)
        return None
    child = _open_subdir(fd, name, st)
    return None if child is None else (child, st)


def _open_subdir(dir_fd: int, name: str, st: os.stat_result) -> int | None:
    if stat.S_IMODE(st.st_mode) & _OWNER_RWX != _OWNER_RWX:
        _grant_owner_rwx(dir_fd, name)
    try:
        fd = os.open(name, _O_DIR, dir_fd=dir_fd)
    except FileNotFoundError:
        return None
    if not os.path.samestat(os.fstat(fd), st):
        os.close(fd)
        raise OSError(errno.ESTALE, "a folder was replaced while its tree was deleted", name)
    return fd


def _grant_owner_rwx(dir_fd: int, name: str) -> None:
    """chmod u+rwx a folder without following a link (an O_PATH descriptor needs no read right)."""
    try:
        path_fd = os.open(name, _O_PATH_DIR, dir_fd=dir_fd)
    except OSError:
        return  # the open that follows reports what is wrong
    try:
        mode = stat.S_IMODE(os.fstat(path_fd).st_mode)
        # fchmod refuses O_PATH descriptors; the /proc link names the folder itself.
        os.chmod(f"/proc/self/fd/{path_fd}", mode | _OWNER_RWX)
    except PermissionError:
        pass  # not ours: the delete reports EACCES if it matters
    finally:
        os.close(path_fd)


def _clear_files(fd: int) -> list[str]:
    """Unlink every non-folder entry of ``fd``; return the names of its subfolders."""
    subdirs: list[str] = []
    with os.scandir(fd) as entries:
        names = [(e.name, e.is_dir(follow_symlinks=False)) for e in entries]
    for name, is_dir in names:
        if is_dir:
            subdirs.append(name)
        else:
            _unlink(fd, name)
    return subdirs


def _unlink(dir_fd: int, name: str) -> None:
    try:
        os.unlink(name, dir_fd=dir_fd)
    except FileNotFoundError:
        pass
    except IsADirectoryError:
        # Became a folder since it was listed: delete it as a tree.
        delete_tree_at(dir_fd, name)
    except PermissionError:
        # The folder holding it is not writable (mode 0500): open it up and retry.
        _make_writable(dir_fd)
        os.unlink(name, dir_fd=dir_fd)


def _rmdir(dir_fd: int, name: str) -> None:
    try:
        os.rmdir(name, dir_fd=dir_fd)
    except FileNotFoundError:
        pass
    except PermissionError:
        _make_writable(dir_fd)
        os.rmdir(name, dir_fd=dir_fd)


def _make_writable(fd: int) -> None:
    mode = stat.S_IMODE(os.fstat(fd).st_mode)
    with contextlib.suppress(PermissionError):
        os.fchmod(fd, mode | _OWNER_RWX)
