"""Listing, walking, removing and renaming beneath the root."""

from __future__ import annotations

import errno
import os
import stat
from collections.abc import Iterator

from jail import _syscalls
from jail._anchor import Anchor
from jail._info import PathInfo
from jail._oserrors import translate
from jail._paths import ROOT, join, quote, split_parent
from jail.errors import JailError
from jail.tree_delete import delete_tree_at

_O_LIST = os.O_RDONLY | os.O_DIRECTORY
# An entry that disappears or changes type between readdir and fstatat/readlinkat.
_VANISHED = (errno.ENOENT, errno.ENOTDIR, errno.EINVAL)


def list_dir(anchor: Anchor, path: str, max_entries: int) -> list[PathInfo]:
    """The entries of folder ``path`` (links to folders inside are followed), by name."""
    infos, truncated = _scan_and_close(anchor.open(path, _O_LIST), path, max_entries)
    if truncated:
        raise _too_many(path, max_entries)
    return infos


def walk(anchor: Anchor, path: str, max_entries: int) -> Iterator[PathInfo]:
    """Every entry beneath folder ``path``, top-down, each folder's entries by name.

    ``path`` itself may be reached through links inside the sandbox; below it,
    links are reported but never descended into. Each sub-folder is re-opened
    from ``path``'s descriptor with RESOLVE_NO_SYMLINKS, so a folder swapped for
    a link after it was listed is skipped rather than followed, and at most two
    descriptors are open at any time whatever the depth.

    After ``max_entries`` entries, raises TOO_MANY_ENTRIES if more remain.
    """
    start = anchor.open_dir(path)
    try:
        # (path relative to ``start``, sandbox-relative path) of folders to list
        pending = [(ROOT, path)]
        remaining = max_entries
        while pending:
            relative, folder = pending.pop()
            try:
                fd = anchor.resolver.open(start, relative, _O_LIST, no_symlinks=True)
            except OSError:
                continue  # removed, or swapped for a link, since it was listed
            infos, truncated = _scan_and_close(fd, folder, remaining)
            yield from infos
            remaining -= len(infos)
            if truncated:
                raise _too_many(path, max_entries)
            pending.extend(
                (join(relative, info.path.rpartition("/")[2]), info.path)
                for info in reversed(infos)
                if info.kind == "dir"
            )
    finally:
        os.close(start)


def remove(anchor: Anchor, path: str, *, recursive: bool) -> None:
    """Remove a file, a link (never its target) or a folder (recursively if asked)."""
    if path == ROOT:
        raise JailError(
            "INVALID_PATH",
            "The sandbox root itself cannot be removed; remove the entries inside it.",
            {"path": path},
        )
    parent, name = split_parent(path)
    dir_fd = anchor.open_dir(parent, shown=path)
    try:
        if not stat.S_ISDIR(os.lstat(name, dir_fd=dir_fd).st_mode):
            os.unlink(name, dir_fd=dir_fd)
        elif recursive:
            # Opens each level relative to its parent, checked against a prior lstat,
            # and loops instead of recursing (rmtree fails on a 1,500-deep tree).
            delete_tree_at(dir_fd, name)
        else:
            os.rmdir(name, dir_fd=dir_fd)
    except OSError as exc:
        raise translate(exc, path) from exc
    finally:
        os.close(dir_fd)


def rename(anchor: Anchor, src: str, dst: str, *, overwrite: bool) -> None:
    """Move ``src`` to ``dst``; links at either end are moved or replaced, not followed."""
    if ROOT in (src, dst):
        raise JailError("INVALID_PATH", "The sandbox root itself cannot be moved.", {"path": ROOT})
    src_parent, src_name = split_parent(src)
    dst_parent, dst_name = split_parent(dst)
    src_fd = anchor.open_dir(src_parent, shown=src)
    try:
        dst_fd = anchor.open_dir(dst_parent, shown=dst)
        try:
            _rename_at(src_fd, src_name, dst_fd, dst_name, overwrite=overwrite)
        except OSError as exc:
            raise _rename_error(exc, src, dst) from exc
        finally:
            os.close(dst_fd)
    finally:
        os.close(src_fd)


def _rename_at(src_fd: int, src: str, dst_fd: int, dst: str, *, overwrite: bool) -> None:
    if overwrite:
        os.rename(src, dst, src_dir_fd=src_fd, dst_dir_fd=dst_fd)
        return
    try:
        _syscalls.renameat2(
            src_fd, os.fsencode(src), dst_fd, os.fsencode(dst), _syscalls.RENAME_NOREPLACE
        )
    except OSError as exc:
        # ENOSYS: no renameat2 wrapper; EINVAL: a file system without
        # RENAME_NOREPLACE (or a folder moved into itself, which plain rename
        # reports again). The fallback only risks clobbering, never escaping.
        if exc.errno not in (errno.ENOSYS, errno.EINVAL):
            raise
        try:
            os.lstat(dst, dir_fd=dst_fd)
        except FileNotFoundError:
            os.rename(src, dst, src_dir_fd=src_fd, dst_dir_fd=dst_fd)
        else:
            raise OSError(errno.EEXIST, os.strerror(errno.EEXIST)) from None


def _rename_error(exc: OSError, src: str, dst: str) -> JailError:
    if exc.errno == errno.EINVAL:
        return JailError(
            "INVALID_PATH",
            f"{quote(src)} cannot be moved into itself ({quote(dst)}).",
            {"path": src, "destination": dst},
        )
    if exc.errno == errno.EXDEV:  # from rename(2) itself: a different mount
        return JailError(
            "INVALID_PATH",
            f"{quote(src)} and {quote(dst)} are on different file systems; copy instead.",
            {"path": src, "destination": dst},
        )
    if exc.errno in (errno.EEXIST, errno.ENOTEMPTY, errno.EISDIR, errno.ENOTDIR):
        return translate(exc, dst)
    return translate(exc, src)


def _scan_and_close(fd: int, path: str, max_entries: int) -> tuple[list[PathInfo], bool]:
    """``_scan`` of the open folder ``fd`` (``path``), which it closes; errors as JailError."""
    try:
        return _scan(fd, path, max_entries)
    except OSError as exc:
        raise translate(exc, path) from exc
    finally:
        os.close(fd)


def _scan(fd: int, folder: str, limit: int) -> tuple[list[PathInfo], bool]:
    """Up to ``limit`` entries of the open folder ``fd``, sorted by name.

    Reads at most ``limit + 1`` names, so a folder with millions of entries
    costs no more than the caller allowed; the flag says some were left out.
    """
    with os.scandir(fd) as listing:
        entries: list[os.DirEntry[str]] = []
        for entry in listing:
            if len(entries) == limit:
                return _infos(fd, folder, entries), True
            entries.append(entry)
    return _infos(fd, folder, entries), False


def _infos(fd: int, folder: str, entries: list[os.DirEntry[str]]) -> list[PathInfo]:
    infos = []
    for entry in sorted(entries, key=lambda e: e.name):
        try:
            # Both calls are relative to ``fd`` (fstatat/readlinkat), never a path.
            st = entry.stat(follow_symlinks=False)
            target = os.readlink(entry.name, dir_fd=fd) if stat.S_ISLNK(st.st_mode) else None
        except OSError as exc:
            if exc.errno in _VANISHED:
                continue
            raise
        infos.append(PathInfo.from_stat(join(folder, entry.name), st, target))
    return infos


def _too_many(path: str, limit: int) -> JailError:
    return JailError(
        "TOO_MANY_ENTRIES",
        f"{quote(path)} holds more than {limit} entries; list a narrower folder.",
        {"path": path, "limit": limit},
    )
