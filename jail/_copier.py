"""The copy loop of a snapshot: descriptor-relative, never following a link.

Every entry is opened relative to its parent's descriptor with O_NOFOLLOW, so
a link met in the project (or swapped in while copying) is never traversed:
it is recreated as a link when its target stays inside the project, and left
out otherwise. Special files are left out without being opened for I/O.
Content moves with copy_file_range(2) (in-kernel, no userspace buffer), or
sendfile(2) where the two trees are on file systems that refuse it; only data
segments move (SEEK_DATA/SEEK_HOLE), so sparse files stay sparse.

One walk may fill several destinations at once (an experiment's workspace and a
mirror of it), and a pack (jail/pack.py: an experiment's baseline as one file): each
entry is judged and read once, and written to each.
"""

from __future__ import annotations

import concurrent.futures
import errno
import os
import posixpath
import stat
from collections.abc import Callable
from dataclasses import dataclass, field, fields
from typing import Any, TypeVar

from jail._fdio import read_whole, write_whole
from jail._oserrors import translate
from jail._snapshot_rules import SnapshotFilter, Verdict
from jail.pack import PackWriter

T = TypeVar("T")

MAX_DEPTH = 256
MAX_LISTED_SECRETS = 200
# Files up to this size are copied whole, without looking for holes.
SMALL_FILE = 64 * 1024

_O_DIR = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC
_O_SRC_FILE = os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_NOCTTY | os.O_CLOEXEC
_O_DST_FILE = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC
_O_DST_FILE_READABLE = (_O_DST_FILE & ~os.O_WRONLY) | os.O_RDWR
# O_NOATIME keeps the copy from touching the host's access times; it is only
# allowed on files we own (EPERM otherwise), where we retry without it.
_O_NOATIME = getattr(os, "O_NOATIME", 0)
# An entry that vanished or changed type (e.g. became a link) while we copied.
_CHANGED = (errno.ENOENT, errno.ELOOP, errno.ENOTDIR)
_NO_COPY_RANGE = (errno.EXDEV, errno.ENOSYS, errno.EOPNOTSUPP, errno.EINVAL)


@dataclass
class CopyTally:
    """Running counts of one copy."""

    files_copied: int = 0
    bytes_copied: int = 0
    dirs_created: int = 0
    links_copied: int = 0
    secrets_skipped: int = 0
    build_skipped: int = 0
    excluded_skipped: int = 0
    links_skipped: int = 0
    special_skipped: int = 0
    unreadable_skipped: int = 0
    too_deep_skipped: int = 0
    secret_paths: list[str] = field(default_factory=list)

    def merge(self, other: CopyTally) -> None:
        """Add the counts of a walk of another part of the same tree."""
        for name in (f.name for f in fields(self) if f.name != "secret_paths"):
            setattr(self, name, getattr(self, name) + getattr(other, name))
        room = MAX_LISTED_SECRETS - len(self.secret_paths)
        self.secret_paths.extend(other.secret_paths[: max(room, 0)])


class Copier:
    """Copies one open folder into another, applying ``rules``.

    ``skip`` holds (st_dev, st_ino) of folders never to enter, such as the
    destination itself when it lies inside the project. ``owner`` (uid, gid) is
    given to every entry made in the first destination, through the descriptor
    (or, for a link, its parent's) that made it: no second walk, no path lookup.
    ``pack`` records every entry of the first destination as it was made (its
    facts read back from it, so the pack matches it to the nanosecond).
    """

    def __init__(
        self,
        rules: SnapshotFilter,
        *,
        skip: frozenset[tuple[int, int]],
        owner: tuple[int, int] | None = None,
        pack: PackWriter | None = None,
    ) -> None:
        self._rules = rules
        self._skip = skip
        self._owner = owner
        self._pack = pack
        self.tally = CopyTally()

    def copy_tree(self, src_fd: int, *dst_fds: int, workers: int = 1) -> CopyTally:
        """Copy the folder ``src_fd`` into each (empty) folder of ``dst_fds``.

        With ``workers`` > 1, the project's top-level folders are copied on that many
        threads, each its own walk with the same rules (descriptor-relative, as
        here): creating files is kernel (or FUSE daemon) time, which threads overlap.
        """
        if workers <= 1:
            self._copy_dir(src_fd, dst_fds, "", 0)
            return self.tally
        with concurrent.futures.ThreadPoolExecutor(
            workers, thread_name_prefix="snapshot-copy"
        ) as pool:
            forked = self._copy_dir(src_fd, dst_fds, "", 0, pool=pool)
            # Every folder is waited for before any error is raised: the caller empties
            # the destinations next, and no thread may still be writing into them.
            concurrent.futures.wait([future for _, future in forked])
        for path, future in forked:
            child = self._handled(path, future.result)
            if child is not None:
                self.tally.merge(child.tally)
        return self.tally

    def _copy_dir(
        self,
        src_fd: int,
        dsts: tuple[int, ...],
        folder: str,
        depth: int,
        pool: concurrent.futures.Executor | None = None,
    ) -> list[tuple[str, concurrent.futures.Future[Copier]]]:
        """Copy the listed entries; with ``pool``, subfolders are handed to it instead
        (returned with their paths, for the caller to wait for)."""
        with os.scandir(src_fd) as listing:
            entries = list(listing)
        forked: list[tuple[str, concurrent.futures.Future[Copier]]] = []
        for entry in entries:
            path = f"{folder}/{entry.name}" if folder else entry.name
            if pool is not None and entry.is_dir(follow_symlinks=False):
                forked.append((path, pool.submit(self._fork, src_fd, dsts, entry, path, depth)))
                continue
            self._handled(path, self._copy_entry, src_fd, dsts, entry, path, depth)
        return forked

    def _fork(
        self, src_fd: int, dsts: tuple[int, ...], entry: os.DirEntry[str], path: str, depth: int
    ) -> Copier:
        child = Copier(self._rules, skip=self._skip, owner=self._owner, pack=self._pack)
        child._handled(path, child._copy_entry, src_fd, dsts, entry, path, depth)
        return child

    def _handled(self, path: str, step: Callable[..., T], *args: Any) -> T | None:
        """Run one entry's copy: an unreadable entry is counted, a vanished one ignored."""
        try:
            return step(*args)
        except PermissionError:
            self.tally.unreadable_skipped += 1
        except OSError as exc:
            if exc.errno not in _CHANGED:
                raise translate(exc, path) from exc
        return None

    def _copy_entry(
        self, src_fd: int, dsts: tuple[int, ...], entry: os.DirEntry[str], path: str, depth: int
    ) -> None:
        st = entry.stat(follow_symlinks=False)  # fstatat(src_fd, name, AT_SYMLINK_NOFOLLOW)
        verdict = self._rules.classify(path, is_dir=stat.S_ISDIR(st.st_mode))
        if verdict != "copy":
            self._count_skip(verdict, path)
        elif stat.S_ISDIR(st.st_mode):
            self._copy_subdir(src_fd, dsts, entry.name, st, path, depth)
        elif stat.S_ISREG(st.st_mode):
            self._copy_file(src_fd, dsts, entry.name, path)
        elif stat.S_ISLNK(st.st_mode):
            self._copy_link(src_fd, dsts, entry.name, path)
        else:
            self.tally.special_skipped += 1

    def _count_skip(self, verdict: Verdict, path: str) -> None:
        if verdict == "secret":
            self.tally.secrets_skipped += 1
            if len(self.tally.secret_paths) < MAX_LISTED_SECRETS:
                self.tally.secret_paths.append(path)
        elif verdict == "build":
            self.tally.build_skipped += 1
        else:
            self.tally.excluded_skipped += 1

    def _copy_subdir(
        self,
        src_fd: int,
        dst_fds: tuple[int, ...],
        name: str,
        st: os.stat_result,
        path: str,
        depth: int,
    ) -> None:
        if (st.st_dev, st.st_ino) in self._skip:
            return
        if depth >= MAX_DEPTH:
            self.tally.too_deep_skipped += 1
            return
        src = os.open(name, _O_DIR, dir_fd=src_fd)
        try:
            if not os.path.samestat(os.fstat(src), st):
                return  # replaced since it was listed
            dsts: list[int] = []
            try:
                for dst_fd in dst_fds:
                    os.mkdir(name, 0o700, dir_fd=dst_fd)
                    dsts.append(os.open(name, _O_DIR, dir_fd=dst_fd))
                if self._owner is not None:
                    os.fchown(dsts[0], *self._owner)
                self.tally.dirs_created += 1
                self._copy_dir(src, tuple(dsts), path, depth + 1)
                for dst in dsts:
                    # Set last: adding entries would bump the mtime, a 0o555 mode block them.
                    os.fchmod(dst, stat.S_IMODE(st.st_mode) & 0o777)
                    os.utime(dst, ns=(st.st_atime_ns, st.st_mtime_ns))
                if self._pack is not None:
                    self._pack.add_dir(path, os.fstat(dsts[0]))
            finally:
                for dst in dsts:
                    os.close(dst)
        finally:
            os.close(src)

    def _copy_file(self, src_fd: int, dst_fds: tuple[int, ...], name: str, path: str) -> None:
        src = _open_source_file(src_fd, name)
        try:
            st = os.fstat(src)
            if not stat.S_ISREG(st.st_mode):
                self.tally.special_skipped += 1  # swapped for a FIFO or device
                return
            # The first copy is read back for the others: they are identical even if the
            # source changes meanwhile (another experiment's container may be running).
            # Made with its final mode: a chmod after is one round trip to a FUSE daemon
            # per file saved (zfs-fuse), needed only where the umask took bits away.
            # Nothing of the tenant's runs on a workspace being filled.
            mode = stat.S_IMODE(st.st_mode) & 0o777
            first = os.open(name, _O_DST_FILE_READABLE, mode, dir_fd=dst_fds[0])
            try:
                data = None
                if self._pack is not None and st.st_size <= SMALL_FILE:
                    # Read once into memory, written to the copy and to the pack: the
                    # same bytes in both, and no read back through a FUSE daemon.
                    data = read_whole(src, st.st_size)
                    write_whole(first, data)
                    self.tally.bytes_copied += len(data)
                else:
                    self.tally.bytes_copied += _transfer(src, first, st.st_size)
                if self._owner is not None:
                    os.fchown(first, *self._owner)  # before the mode: chown clears setgid
                os.utime(first, ns=(st.st_atime_ns, st.st_mtime_ns))
                made = os.fstat(first)  # the times as the file system keeps them
                if stat.S_IMODE(made.st_mode) != mode:
                    os.fchmod(first, mode)
                    made = os.fstat(first)
                if self._pack is not None:
                    if data is not None:
                        self._pack.add_data(path, made, data)
                    else:
                        self._pack.add_file(path, made, first)
                for dst_fd in dst_fds[1:]:
                    dst = os.open(name, _O_DST_FILE, 0o600, dir_fd=dst_fd)
                    try:
                        _transfer(first, dst, os.fstat(first).st_size)
                        _finish_file(dst, st)
                    finally:
                        os.close(dst)
            finally:
                os.close(first)
            self.tally.files_copied += 1
        finally:
            os.close(src)

    def _copy_link(self, src_fd: int, dst_fds: tuple[int, ...], name: str, path: str) -> None:
        target = os.readlink(name, dir_fd=src_fd)
        if _stays_inside(posixpath.dirname(path), target):
            for dst_fd in dst_fds:
                os.symlink(target, name, dir_fd=dst_fd)
            if self._owner is not None:
                os.chown(name, *self._owner, dir_fd=dst_fds[0], follow_symlinks=False)
            if self._pack is not None:
                made = os.lstat(name, dir_fd=dst_fds[0])
                self._pack.add_link(path, target, made)
            self.tally.links_copied += 1
        else:
            self.tally.links_skipped += 1


def _finish_file(fd: int, st: os.stat_result) -> None:
    # Permission bits without setuid/setgid/sticky; mtimes keep make & co. honest.
    os.fchmod(fd, stat.S_IMODE(st.st_mode) & 0o777)
    os.utime(fd, ns=(st.st_atime_ns, st.st_mtime_ns))


def _stays_inside(folder: str, target: str) -> bool:
    """Whether a link in ``folder`` with ``target`` names something in the project.

    Lexical, which is exact here: ``folder`` is a real path (the copy never
    descends through links). Only the link text is copied, never what it
    points at, and in the sandbox the jail judges it again at every use.
    """
    if not target or target.startswith("/"):
        return False
    resolved = posixpath.normpath(posixpath.join(folder, target))
    return resolved != ".." and not resolved.startswith("../")


def _open_source_file(dir_fd: int, name: str) -> int:
    try:
        return os.open(name, _O_SRC_FILE | _O_NOATIME, dir_fd=dir_fd)
    except PermissionError as exc:
        if exc.errno != errno.EPERM or not _O_NOATIME:
            raise
    return os.open(name, _O_SRC_FILE, dir_fd=dir_fd)


def _transfer(src: int, dst: int, size: int) -> int:
    """Copy ``size`` bytes (fewer if the file shrank; later growth is not copied), holes
    kept as holes: only the data segments move, so a sparse file (a tenant's 2 GB of
    nothing in a 16 KB slot) costs what it holds, not its apparent size. Returns the
    data bytes copied."""
    if size <= SMALL_FILE:
        # Most files of a project: no hole in them is worth two lseeks to find.
        copied = _copy_range(src, dst, 0, size)
        end = copied
    else:
        copied = end = 0
        for start, stop in _data_segments(src, size):
            moved = _copy_range(src, dst, start, stop)
            copied, end = copied + moved, start + moved
    if end < size:  # a trailing hole, or the file shrank: the size is not there yet
        os.ftruncate(dst, min(size, os.fstat(src).st_size))
    return copied


def _data_segments(fd: int, size: int) -> list[tuple[int, int]]:
    """The ``[start, end)`` ranges of ``fd`` that hold data, from SEEK_DATA/SEEK_HOLE (the
    whole file where the file system cannot tell)."""
    segments: list[tuple[int, int]] = []
    offset = 0
    while offset < size:
        try:
            start = os.lseek(fd, offset, os.SEEK_DATA)
        except OSError as exc:
            if exc.errno == errno.ENXIO:  # only a hole from here to the end
                break
            if exc.errno in (errno.EINVAL, errno.EOPNOTSUPP):
                return [(offset, size)]
            raise
        if start >= size:
            break
        end = min(os.lseek(fd, start, os.SEEK_HOLE), size)
        segments.append((start, end))
        offset = end
    return segments


def _copy_range(src: int, dst: int, start: int, end: int) -> int:
    copied = 0
    use_copy_range = True
    while start + copied < end:
        at, left = start + copied, end - start - copied
        if use_copy_range:
            try:
                sent = os.copy_file_range(src, dst, left, at, at)
            except OSError as exc:
                if exc.errno not in _NO_COPY_RANGE:
                    raise
                use_copy_range = False
                continue
        else:
            os.lseek(dst, at, os.SEEK_SET)
            sent = os.sendfile(dst, src, at, left)
        if sent == 0:
            break
        copied += sent
    return copied
