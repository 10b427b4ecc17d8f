"""A tree kept as one file: an experiment's baseline, written once, read by the diff.

An experiment's baseline used to be a second copy of its project, file by file.
On zfs-fuse every file costs several round trips to a daemon in user space (create,
write, chmod, utime, close), so a 5,000-file project paid for 10,000 files, and its
destroy left 10,000 to delete. The pack keeps the same facts in one file:

    "SMCPACK1"  the data of every regular file, back to back (only its data
                segments: a sparse file stays sparse), then the index, then
    trailer     index offset, index length, entry count (u64 each), "SMCPACK1"

Each index record holds an entry's kind, mode, size, mtime (ns) and, for a file,
where its data segments sit in the pack; for a link, its target text. The facts are
those of the workspace copy the pack was written beside (read back with fstat after
its times were set), so equal size and mtime still mean "unchanged, not read".

Hostile input: the tree a pack is made of may be a tenant's, but the pack is the
server's, in a folder no container can see (beside the workspace, never in a
mount). Nothing in it is ever followed: a link is its target's text, and reading
is ``pread`` on the pack alone. Bounds: at most ``MAX_PACK_ENTRIES`` entries and
``MAX_PACK_INDEX_BYTES`` of index, checked while writing (a larger tree is refused
with TOO_MANY_ENTRIES) and again while reading; data bytes cost what the
workspace copy beside it costs (the slot's quota or disk budget counts both).
"""

from __future__ import annotations

import errno
import os
import stat
import struct
import threading
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

from jail._fdio import read_whole, write_whole
from jail._info import Kind, PathInfo
from jail._oserrors import translate
from jail._paths import quote
from jail.errors import JailError

__all__ = ["MAX_PACK_ENTRIES", "MAX_PACK_INDEX_BYTES", "Pack", "PackWriter", "pack_tree"]

MAGIC = b"SMCPACK1"
# As many entries as inspect_changes walks on one side (app/experiments/workspace/changes.py):
# a bigger baseline could never be compared whole anyway.
MAX_PACK_ENTRIES = 200_000
# The index is built in memory (and read whole by the diff): 200,000 entries of paths
# up to about 300 bytes. Deep trees of long names hit this before MAX_PACK_ENTRIES.
MAX_PACK_INDEX_BYTES = 64 * 1024 * 1024
MAX_DEPTH = 256  # as the snapshot copier

_FLUSH = 1024 * 1024  # small files' data is written in pieces of about this size
_SMALL = 64 * 1024  # files up to this size are read whole into memory
_TRAILER = struct.Struct("<QQQ8s")
# kind, mode, size, mtime_ns, data offset, segment count, path length, target length
_RECORD = struct.Struct("<BIqqQIII")
_SEGMENT = struct.Struct("<QQ")  # start in the file, length
_KINDS: dict[str, int] = {"file": 1, "dir": 2, "symlink": 3}
_KIND_NAMES: dict[int, Kind] = {1: "file", 2: "dir", 3: "symlink"}
_O_DIR = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC
_O_FILE = os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_NOCTTY | os.O_CLOEXEC
_NO_COPY_RANGE = (errno.EXDEV, errno.ENOSYS, errno.EOPNOTSUPP, errno.EINVAL)


def _too_many(what: str) -> JailError:
    return JailError(
        "TOO_MANY_ENTRIES",
        f"The project holds more than {what}; an experiment's baseline keeps at most "
        f"{MAX_PACK_ENTRIES} files, folders and links. Leave build output and dependencies out.",
    )


class PackWriter:
    """Writes one pack; safe to feed from several threads (the copier's workers).

    Every ``add_*`` takes the facts to record; :meth:`close` writes the index and the
    trailer. ``leave_out`` names folders (by name) whose contents are not recorded,
    only the folder itself: what the diff never walks (node_modules, .git, build
    output) costs the baseline nothing and counts toward none of its bounds.

    A writer closed without :meth:`close` (an error) leaves a pack without a trailer,
    which :class:`Pack` refuses; its caller deletes the experiment's folder.
    """

    def __init__(self, path: Path, leave_out: Callable[[str], bool] | None = None) -> None:
        self._leave_out = leave_out
        # O_EXCL|O_NOFOLLOW: a new file of the server's, never something already there.
        self._fd = os.open(
            path, os.O_RDWR | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600
        )
        self._lock = threading.Lock()
        self._end = len(MAGIC)  # where the next data goes
        self._buffer = bytearray(MAGIC)
        self._buffer_at = 0  # the pack offset of the buffer's first byte
        self._index = bytearray()
        self._entries = 0
        self._closed = False

    def left_out(self, path: str) -> bool:
        """Whether ``path`` lies in a folder whose contents are not recorded."""
        if self._leave_out is None:
            return False
        return any(map(self._leave_out, path.split("/")[:-1]))

    def add_dir(self, path: str, st: os.stat_result) -> None:
        self._record("dir", path, st.st_mode, st.st_size, st.st_mtime_ns)

    def add_link(self, path: str, target: str, st: os.stat_result) -> None:
        self._record("symlink", path, st.st_mode, st.st_size, st.st_mtime_ns, target)

    def add_data(self, path: str, st: os.stat_result, data: bytes) -> None:
        """A regular file whose whole content is ``data`` (a small one, read whole)."""
        if self.left_out(path):
            return
        with self._lock:
            offset = self._end
            self._buffer += data
            self._end += len(data)
            self._add(
                "file", path, st.st_mode, st.st_size, st.st_mtime_ns, "", offset, [(0, len(data))]
            )
            if len(self._buffer) >= _FLUSH:
                self._flush()

    def add_file(self, path: str, st: os.stat_result, fd: int) -> None:
        """A regular file read from ``fd`` (the caller's own descriptor: its offset moves),
        its data segments only."""
        if self.left_out(path):
            return
        size = st.st_size
        if size <= _SMALL:
            self.add_data(path, st, read_whole(fd, size))
            return
        segments = _data_segments(fd, size)
        length = sum(n for _, n in segments)
        with self._lock:
            self._flush()
            offset = self._end
            self._end += length
            self._buffer_at = self._end  # the buffer (empty) goes on after the reservation
        at = offset
        kept: list[tuple[int, int]] = []
        for start, count in segments:
            moved = _copy(fd, self._fd, start, at, count)
            kept.append((start, moved))
            at += count
            if moved < count:
                break  # the file shrank since its fstat: what is there is what it holds
        with self._lock:
            self._add("file", path, st.st_mode, size, st.st_mtime_ns, "", offset, kept)

    def close(self) -> None:
        """Write the index and the trailer; the pack is complete."""
        with self._lock:
            self._flush()
            index_at = self._end
            write_whole(self._fd, bytes(self._index), index_at)
            trailer = _TRAILER.pack(index_at, len(self._index), self._entries, MAGIC)
            write_whole(self._fd, trailer, index_at + len(self._index))
            self._closed = True
        self.release()

    def release(self) -> None:
        """Close the file (an unfinished pack, after an error, or after ``close``)."""
        if self._fd >= 0:
            os.close(self._fd)
            self._fd = -1

    def _record(
        self, kind: str, path: str, mode: int, size: int, mtime_ns: int, target: str = ""
    ) -> None:
        if self.left_out(path):
            return
        with self._lock:
            self._add(kind, path, mode, size, mtime_ns, target, 0, [])

    def _add(
        self,
        kind: str,
        path: str,
        mode: int,
        size: int,
        mtime_ns: int,
        target: str,
        offset: int,
        segments: list[tuple[int, int]],
    ) -> None:
        """Append one index record (the caller holds the lock)."""
        if self._entries >= MAX_PACK_ENTRIES:
            raise _too_many(f"{MAX_PACK_ENTRIES} entries")
        name, link = os.fsencode(path), os.fsencode(target)
        record = _RECORD.pack(
            _KINDS[kind],
            stat.S_IMODE(mode),
            size,
            mtime_ns,
            offset,
            len(segments),
            len(name),
            len(link),
        )
        if len(self._index) + len(record) + len(name) + len(link) > MAX_PACK_INDEX_BYTES:
            raise _too_many(f"{MAX_PACK_INDEX_BYTES} bytes of file names")
        self._index += record + name + link
        for segment in segments:
            self._index += _SEGMENT.pack(*segment)
        self._entries += 1

    def _flush(self) -> None:
        if self._buffer:
            write_whole(self._fd, bytes(self._buffer), self._buffer_at)
        self._buffer.clear()
        self._buffer_at = self._end


@dataclass(frozen=True, slots=True)
class _Data:
    size: int
    offset: int
    segments: tuple[tuple[int, int], ...]


class Pack:
    """A pack opened for reading: the listing and bounded reads of what it recorded.

    Offers what the diff asks of a ``Jail`` (``list_dir``, ``read_bytes``) and
    :meth:`chunks`; paths are those the pack was written with, never looked up on disk.
    :meth:`open` raises JailError: NOT_FOUND for a missing, incomplete or damaged pack,
    TOO_MANY_ENTRIES for one past the bounds.
    """

    def __init__(self, fd: int, infos: dict[str, list[PathInfo]], data: dict[str, _Data]) -> None:
        self._fd = fd
        self._children = infos
        self._data = data

    @classmethod
    def open(cls, path: Path) -> Pack:
        try:
            fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC)
        except OSError as exc:
            raise translate(exc, "baseline") from None
        try:
            children, data = _read_index(fd)
        except BaseException:
            os.close(fd)
            raise
        return cls(fd, children, data)

    def close(self) -> None:
        if self._fd >= 0:
            os.close(self._fd)
            self._fd = -1

    def __enter__(self) -> Pack:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def list_dir(self, path: str = ".", *, max_entries: int) -> list[PathInfo]:
        """The entries recorded in folder ``path``, by name; TOO_MANY_ENTRIES past the cap."""
        found = self._children.get(path)
        if found is None:
            raise JailError("NOT_FOUND", f"{quote(path)} is not in the baseline.", {"path": path})
        if len(found) > max_entries:
            raise JailError(
                "TOO_MANY_ENTRIES",
                f"{quote(path)} holds more than {max_entries} entries.",
                {"path": path},
            )
        return found

    def entries(self) -> Iterator[PathInfo]:
        """Every recorded entry, folder by folder."""
        for listing in self._children.values():
            yield from listing

    def read_bytes(self, path: str, *, max_bytes: int) -> bytes:
        """A recorded file's content; TOO_LARGE beyond ``max_bytes``."""
        data, size = self._file(path)
        if size > max_bytes:
            raise JailError("TOO_LARGE", f"{quote(path)} is over {max_bytes} bytes.")
        return b"".join(self._pieces(data, size, size))

    def chunks(self, path: str, chunk: int) -> Iterator[bytes]:
        """A recorded file's content in pieces of at most ``chunk`` bytes (holes as zeros)."""
        data, size = self._file(path)
        return self._pieces(data, size, chunk)

    def _file(self, path: str) -> tuple[_Data, int]:
        data = self._data.get(path)
        if data is None:
            raise JailError("NOT_FOUND", f"{quote(path)} is not a file of the baseline.")
        return data, data.size

    def _pieces(self, data: _Data, size: int, chunk: int) -> Iterator[bytes]:
        at, stored = 0, data.offset  # position in the file, in the pack
        for start, length in data.segments:
            while at < start:  # a hole
                step = min(chunk, start - at)
                yield bytes(step)
                at += step
            end = start + length
            while at < end:
                step = min(chunk, end - at)
                piece = os.pread(self._fd, step, stored)
                if len(piece) != step:
                    raise JailError("NOT_FOUND", "The baseline pack is cut short.")
                yield piece
                at, stored = at + step, stored + step
        while at < size:  # a trailing hole
            step = min(chunk, size - at)
            yield bytes(step)
            at += step


def _read_index(fd: int) -> tuple[dict[str, list[PathInfo]], dict[str, _Data]]:
    broken = JailError("NOT_FOUND", "The baseline pack is incomplete or damaged.")
    end = os.fstat(fd).st_size
    if end < len(MAGIC) + _TRAILER.size:
        raise broken
    index_at, length, entries, magic = _TRAILER.unpack(
        os.pread(fd, _TRAILER.size, end - _TRAILER.size)
    )
    if magic != MAGIC or index_at + length + _TRAILER.size != end or index_at < len(MAGIC):
        raise broken
    if entries > MAX_PACK_ENTRIES or length > MAX_PACK_INDEX_BYTES:
        raise _too_many(f"{MAX_PACK_ENTRIES} entries")
    index = os.pread(fd, length, index_at)
    if len(index) != length:
        raise broken
    children: dict[str, list[PathInfo]] = {".": []}
    data: dict[str, _Data] = {}
    at = 0
    try:
        for _ in range(entries):
            kind, mode, size, mtime, offset, count, name_len, link_len = _RECORD.unpack_from(
                index, at
            )
            at += _RECORD.size
            path = os.fsdecode(index[at : at + name_len])
            at += name_len
            target = os.fsdecode(index[at : at + link_len]) if kind == 3 else None
            at += link_len
            segments = tuple(
                _SEGMENT.unpack_from(index, at + i * _SEGMENT.size) for i in range(count)
            )
            at += count * _SEGMENT.size
            if at > length or kind not in _KIND_NAMES:
                raise broken
            if offset + sum(n for _, n in segments) > index_at:
                raise broken
            info = PathInfo(path, _KIND_NAMES[kind], size, mode, mtime, target)
            children.setdefault(path.rpartition("/")[0] or ".", []).append(info)
            if kind == 2:
                children.setdefault(path, [])
            elif kind == 1:
                data[path] = _Data(size, offset, segments)
    except struct.error:
        raise broken from None
    for listing in children.values():
        listing.sort(key=lambda info: info.path)
    return children, data


def pack_tree(root: Path, pack: Path, leave_out: Callable[[str], bool] | None = None) -> int:
    """Write the pack of the folder ``root`` (files, folders and links as they are,
    special files left out, the contents of ``leave_out`` folders not entered) and
    return the files it holds.

    A walk of descriptors opened with O_NOFOLLOW, a loop (no recursion), never
    deeper than MAX_DEPTH. For a tree no tenant process changes meanwhile: a clone,
    or files the server has just written.

    Raises:
        JailError: TOO_MANY_ENTRIES past the pack's bounds; NO_SPACE, ... from the disk.
    """
    try:
        writer = PackWriter(pack, leave_out)
    except OSError as exc:
        raise translate(exc, ".") from None
    try:
        top = os.open(root, _O_DIR)
    except OSError as exc:
        writer.release()
        raise translate(exc, ".") from None
    files = 0
    # (folder descriptor, its path, the names left to visit in it), one per level
    stack: list[tuple[int, str, list[str]]] = [(top, "", [])]
    path = "."
    try:
        stack[0][2].extend(sorted(os.listdir(top), reverse=True))
        while stack:
            fd, folder, names = stack[-1]
            if not names:
                stack.pop()
                os.close(fd)
                continue
            name = names.pop()
            path = f"{folder}/{name}" if folder else name
            try:
                st = os.stat(name, dir_fd=fd, follow_symlinks=False)
            except FileNotFoundError:
                continue
            if stat.S_ISDIR(st.st_mode):
                if len(stack) > MAX_DEPTH:
                    raise JailError(
                        "INVALID_PATH", f"{quote(path)} is nested over {MAX_DEPTH} deep."
                    )
                sub = os.open(name, _O_DIR, dir_fd=fd)
                stack.append((sub, path, []))
                writer.add_dir(path, os.fstat(sub))
                if not writer.left_out(f"{path}/-"):  # its contents are recorded
                    stack[-1][2].extend(sorted(os.listdir(sub), reverse=True))
            elif stat.S_ISREG(st.st_mode):
                file_fd = os.open(name, _O_FILE, dir_fd=fd)
                try:
                    writer.add_file(path, os.fstat(file_fd), file_fd)
                finally:
                    os.close(file_fd)
                files += 1
            elif stat.S_ISLNK(st.st_mode):
                writer.add_link(path, os.readlink(name, dir_fd=fd), st)
        path = "."
        writer.close()
    except OSError as exc:
        raise translate(exc, path) from None
    finally:
        for fd, _, _ in stack:
            os.close(fd)
        writer.release()
    return files


def _copy(src: int, dst: int, src_at: int, dst_at: int, count: int) -> int:
    """Copy ``count`` bytes by offsets (in the kernel where it can); fewer at EOF."""
    done = 0
    use_range = True
    while done < count:
        if use_range:
            try:
                moved = os.copy_file_range(src, dst, count - done, src_at + done, dst_at + done)
            except OSError as exc:
                if exc.errno not in _NO_COPY_RANGE:
                    raise
                use_range = False
                continue
        else:
            piece = os.pread(src, min(count - done, _FLUSH), src_at + done)
            moved = len(piece)
            if moved:
                write_whole(dst, piece, dst_at + done)
        if moved == 0:
            break
        done += moved
    return done


def _data_segments(fd: int, size: int) -> list[tuple[int, int]]:
    """The (start, length) data ranges of ``fd`` (the whole file where holes are unknown)."""
    segments: list[tuple[int, int]] = []
    offset = 0
    while offset < size:
        try:
            start = os.lseek(fd, offset, os.SEEK_DATA)
        except OSError as exc:
            if exc.errno == errno.ENXIO:
                break
            if exc.errno in (errno.EINVAL, errno.EOPNOTSUPP):
                return [(offset, size - offset)]
            raise
        if start >= size:
            break
        end = min(os.lseek(fd, start, os.SEEK_HOLE), size)
        segments.append((start, end - start))
        offset = end
    return segments
