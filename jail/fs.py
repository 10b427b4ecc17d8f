"""The path jail: every file a tool touches is reached through a ``Jail``.

A ``Jail`` holds the sandbox root as an O_PATH directory descriptor, and each
method resolves its sandbox-relative path in the kernel relative to that
descriptor (openat2(2) with RESOLVE_BENEATH | RESOLVE_NO_MAGICLINKS; see
``_resolve``). Nothing is checked as a string and opened afterwards.

Policies, in one place:

* Paths are relative to the root and normalised lexically (``a/../b`` is
  ``b``); absolute paths and ``..`` above the root are PATH_OUTSIDE_SANDBOX.
  ``%2e%2e``, backslashes and Unicode look-alikes are literal names.
* A link is followed only while it stays inside. A link that leads outside,
  in any spelling, is SYMLINK_ESCAPE; an absolute target always counts as
  leading outside (RESOLVE_BENEATH semantics, chosen over RESOLVE_IN_ROOT;
  see ``KernelResolver``). Loops, chains over 40 links, magic links and
  dangling links are SYMLINK_UNRESOLVABLE.
* Only regular files are read or written. FIFOs, sockets and devices are
  opened with O_NONBLOCK | O_NOCTTY, recognised by fstat and refused as
  NOT_A_REGULAR_FILE, so they can neither block a call nor become its tty.
* Reads are capped by the caller; an over-size file is refused from its
  fstat size before any byte is read.
"""

from __future__ import annotations

import os
import stat
from collections.abc import Iterator
from types import TracebackType

from jail import _tree, _write
from jail._anchor import O_DIR_PATH, Anchor
from jail._info import PathInfo
from jail._oserrors import translate
from jail._paths import normalize, quote
from jail._resolve import make_resolver
from jail.errors import JailError

__all__ = ["Jail", "PathInfo"]

_O_READ = os.O_RDONLY | os.O_NONBLOCK | os.O_NOCTTY
_MIN_READ = 8192
DEFAULT_MAX_LIST_ENTRIES = 10_000


class Jail:
    """A sandbox folder and the only way tools reach the files inside it.

    Methods take sandbox-relative ``str`` paths and raise ``JailError``. A Jail
    may be shared by threads; close it only once no call is using it.
    """

    def __init__(self, anchor: Anchor) -> None:
        self._anchor = anchor

    @classmethod
    def open(cls, root: str | os.PathLike[str], *, use_openat2: bool | None = None) -> Jail:
        """Open the sandbox folder ``root`` (a trusted, server-side path).

        Args:
            root: the sandbox folder; links in this path are the server's own.
            use_openat2: None picks openat2 when the kernel has it; False forces
                the userspace walk (used by tests to exercise both resolvers).
        """
        try:
            fd = os.open(root, O_DIR_PATH | os.O_CLOEXEC)
        except FileNotFoundError as exc:
            raise JailError(
                "NOT_FOUND", "The sandbox folder no longer exists; retry the call."
            ) from exc
        except OSError as exc:
            raise translate(exc, ".") from exc
        return cls(Anchor(fd, make_resolver(use_openat2)))

    def close(self) -> None:
        self._anchor.close()

    @property
    def closed(self) -> bool:
        return self._anchor.closed

    def __enter__(self) -> Jail:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()

    def open_fd(self, path: str, flags: int, mode: int = 0o644) -> int:
        """A raw O_CLOEXEC descriptor for ``path``; the caller must close it.

        Links are followed while inside (add ``os.O_NOFOLLOW`` to refuse a final
        link). Only regular files and folders are handed out, except with
        ``os.O_PATH``. The open itself never blocks; O_NONBLOCK is then cleared
        unless the caller asked for it.
        """
        path = normalize(path)
        fd = self._anchor.open(path, flags | os.O_NONBLOCK | os.O_NOCTTY, mode)
        try:
            if not flags & os.O_PATH:
                st = os.fstat(fd)
                if not stat.S_ISDIR(st.st_mode):
                    _require_regular(st, path)
                if not flags & os.O_NONBLOCK:
                    os.set_blocking(fd, True)
        except BaseException:
            os.close(fd)
            raise
        return fd

    def read_bytes(self, path: str, *, max_bytes: int) -> bytes:
        """The content of the regular file ``path``; TOO_LARGE beyond ``max_bytes``."""
        path = normalize(path)
        fd = self._anchor.open(path, _O_READ)
        try:
            st = os.fstat(fd)
            _require_regular(st, path)
            if st.st_size > max_bytes:
                raise _too_large(path, max_bytes)
            return _read_capped(fd, st.st_size, max_bytes, path)
        except OSError as exc:
            raise translate(exc, path) from exc
        finally:
            os.close(fd)

    def write_bytes(self, path: str, data: bytes, *, make_parents: bool = False) -> None:
        """Atomically replace (or create) the file ``path`` with ``data``."""
        path = normalize(path)
        if make_parents:
            parent = path.rpartition("/")[0]
            if parent:
                _write.make_dirs(self._anchor, parent)
        _write.write_atomic(self._anchor, path, data)

    def stat(self, path: str, *, follow_symlinks: bool = False) -> PathInfo:
        """What ``path`` is; a final link is described itself unless followed."""
        path = normalize(path)
        fd = self._anchor.open(path, os.O_PATH, follow=follow_symlinks)
        try:
            st = os.fstat(fd)
            # readlinkat(fd, "") reads the link an O_PATH|O_NOFOLLOW fd refers to.
            target = os.readlink("", dir_fd=fd) if stat.S_ISLNK(st.st_mode) else None
        except OSError as exc:
            raise translate(exc, path) from exc
        finally:
            os.close(fd)
        return PathInfo.from_stat(path, st, target)

    def list_dir(
        self, path: str = ".", *, max_entries: int = DEFAULT_MAX_LIST_ENTRIES
    ) -> list[PathInfo]:
        """The entries of folder ``path`` sorted by name; TOO_MANY_ENTRIES past the cap."""
        path = normalize(path)
        return _tree.list_dir(self._anchor, path, max_entries)

    def make_dirs(self, path: str) -> None:
        """Create folder ``path`` and any missing parents; existing folders are fine."""
        _write.make_dirs(self._anchor, normalize(path))

    def remove(self, path: str, *, recursive: bool = False) -> None:
        """Remove a file, a link (never its target) or an empty folder (any, if recursive)."""
        _tree.remove(self._anchor, normalize(path), recursive=recursive)

    def rename(self, src: str, dst: str, *, overwrite: bool = False) -> None:
        """Move ``src`` to ``dst``; ALREADY_EXISTS if ``dst`` exists unless ``overwrite``."""
        _tree.rename(self._anchor, normalize(src), normalize(dst), overwrite=overwrite)

    def walk(self, path: str = ".", *, max_entries: int) -> Iterator[PathInfo]:
        """Entries beneath folder ``path``, top-down; links are listed, never descended.

        Yields at most ``max_entries`` entries, then raises TOO_MANY_ENTRIES if
        the tree holds more (catch it to report a truncated listing).
        """
        return _tree.walk(self._anchor, normalize(path), max_entries)


def _require_regular(st: os.stat_result, path: str) -> None:
    if stat.S_ISREG(st.st_mode):
        return
    if stat.S_ISDIR(st.st_mode):
        raise JailError("IS_A_DIRECTORY", f"{quote(path)} is a folder, not a file.", {"path": path})
    raise JailError(
        "NOT_A_REGULAR_FILE",
        f"{quote(path)} is a special file (FIFO, socket or device); only regular files are used.",
        {"path": path},
    )


def _read_capped(fd: int, size: int, max_bytes: int, path: str) -> bytes:
    # The file may grow after fstat, so read until EOF but never past the cap.
    chunks: list[bytes] = []
    total = 0
    while True:
        chunk = os.read(fd, min(max(size + 1, _MIN_READ), max_bytes + 1 - total))
        if not chunk:
            return chunks[0] if len(chunks) == 1 else b"".join(chunks)
        total += len(chunk)
        if total > max_bytes:
            raise _too_large(path, max_bytes)
        chunks.append(chunk)


def _too_large(path: str, max_bytes: int) -> JailError:
    return JailError(
        "TOO_LARGE",
        f"{quote(path)} is larger than the {max_bytes}-byte limit for this call; "
        "inspect it with a command (head, tail, grep) instead.",
        {"path": path, "limit": max_bytes},
    )
