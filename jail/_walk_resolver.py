"""Userspace emulation of openat2(RESOLVE_BENEATH), for kernels without openat2.

Each component is opened with ``O_NOFOLLOW`` relative to the descriptor of the
folder before it, so a concurrent swap can only show us the old folder (we hold
its descriptor) or the new link (which we then read and judge ourselves). ``..``
pops our own stack of descriptors rather than asking the kernel, so a rename
cannot carry the walk above the root: popping the root itself is EXDEV, as is
any absolute link target. Link counting follows path_resolution(7): more than
40 links in one lookup is ELOOP.
"""

from __future__ import annotations

import errno
import os
import stat

_MAX_LINKS = 40
_O_PATH = os.O_PATH | os.O_CLOEXEC


def _error(code: int) -> OSError:
    return OSError(code, os.strerror(code))


class WalkResolver:
    """Component-by-component resolver; same contract as ``KernelResolver``."""

    def open(
        self,
        dir_fd: int,
        path: str,
        flags: int,
        mode: int = 0,
        *,
        follow: bool = True,
        no_symlinks: bool = False,
    ) -> int:
        flags |= os.O_CLOEXEC
        pending = [part for part in reversed(path.split("/")) if part not in ("", ".")]
        stack = [dir_fd]  # stack[0] is borrowed from the caller and never closed
        links = 0
        try:
            while pending:
                part = pending.pop()
                if part == "..":
                    if len(stack) == 1:
                        raise _error(errno.EXDEV)
                    os.close(stack.pop())
                    continue
                if pending:
                    step = self._enter(stack[-1], part)
                    if isinstance(step, int):
                        stack.append(step)
                        continue
                else:
                    step = self._open_final(stack[-1], part, flags, mode, follow=follow)
                    if isinstance(step, int):
                        return step
                links += 1
                if no_symlinks or links > _MAX_LINKS:
                    raise _error(errno.ELOOP)
                if step.startswith("/"):
                    raise _error(errno.EXDEV)
                if not step:
                    raise _error(errno.ENOENT)
                pending.extend(p for p in reversed(step.split("/")) if p not in ("", "."))
            # The path ended in "." or ".." (possibly via a link): open that folder.
            return os.open(".", flags, mode, dir_fd=stack[-1])
        finally:
            for fd in stack[1:]:
                os.close(fd)

    @staticmethod
    def _enter(dir_fd: int, name: str) -> int | str:
        """A descriptor of folder ``name``, or the text of the link ``name`` is."""
        fd = os.open(name, _O_PATH | os.O_NOFOLLOW, dir_fd=dir_fd)
        keep = False
        try:
            kind = stat.S_IFMT(os.fstat(fd).st_mode)
            if kind == stat.S_IFDIR:
                keep = True
                return fd
            if kind != stat.S_IFLNK:
                raise _error(errno.ENOTDIR)
            # Read the link we hold, not whatever the name points at by now.
            return os.readlink("", dir_fd=fd)
        finally:
            if not keep:
                os.close(fd)

    @staticmethod
    def _open_final(dir_fd: int, name: str, flags: int, mode: int, *, follow: bool) -> int | str:
        """Open the final component with the caller's flags, or return its link text.

        The component is first looked at through an O_PATH|O_NOFOLLOW descriptor,
        because O_NOFOLLOW combined with O_DIRECTORY reports a link as ENOTDIR
        rather than ELOOP. If it turns into a link between the two opens, the
        second open (also O_NOFOLLOW) fails instead of following it.
        """
        try:
            probe = os.open(name, _O_PATH | os.O_NOFOLLOW, dir_fd=dir_fd)
        except FileNotFoundError:
            if not flags & os.O_CREAT:
                raise
        else:
            keep = False
            try:
                if stat.S_ISLNK(os.fstat(probe).st_mode):
                    if flags & os.O_CREAT and flags & os.O_EXCL:
                        raise _error(errno.EEXIST)  # open(2): O_EXCL never follows a link
                    if follow:
                        return os.readlink("", dir_fd=probe)
                    if flags & os.O_PATH:
                        keep = True  # openat2 semantics: O_PATH|O_NOFOLLOW opens the link
                        return probe
                    raise _error(errno.ELOOP)
            finally:
                if not keep:
                    os.close(probe)
        return os.open(name, flags | os.O_NOFOLLOW, mode, dir_fd=dir_fd)
