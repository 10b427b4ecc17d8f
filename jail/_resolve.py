"""Race-free resolution of a sandbox-relative path against the root's descriptor.

The kernel walks the path (openat2(2) with ``RESOLVE_BENEATH``), so there is no
window between checking a path and opening it: a folder swapped for a link
mid-walk is either seen as the folder or as the link, and a link is honoured
only while it stays beneath the root. Where openat2 is missing, ``WalkResolver``
emulates the same rules one component at a time.

Resolvers raise plain ``OSError``; ``_anchor`` maps errnos to ``JailError``.
"""

from __future__ import annotations

import errno
import os
from typing import Protocol

from jail import _syscalls
from jail._walk_resolver import WalkResolver

# openat2(2): RESOLVE_BENEATH fails with EAGAIN when a concurrent rename makes it
# unsure whether ".." stayed beneath the root, and "the caller may choose to retry".
_EAGAIN_ATTEMPTS = 8


class Resolver(Protocol):
    """Opens ``path`` beneath ``dir_fd``; every descriptor returned is O_CLOEXEC."""

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
        """Open ``path`` relative to ``dir_fd`` without ever leaving it.

        Args:
            dir_fd: the folder the path must stay beneath.
            path: a relative path; it may contain ``..`` only from link targets.
            flags: ``os.O_*`` flags for the final component.
            mode: permission bits when the flags create a file.
            follow: follow a symbolic link in the final component.
            no_symlinks: refuse any symbolic link on the way (ELOOP).

        Raises:
            OSError: EXDEV for a link leading outside or an absolute link target,
                ELOOP for loops, chains over 40 links and magic links, plus the
                usual open(2) errnos.
        """
        ...


class KernelResolver:
    """openat2(2) with RESOLVE_BENEATH | RESOLVE_NO_MAGICLINKS.

    Absolute link targets: RESOLVE_BENEATH refuses them (EXDEV) even when they
    would name something inside under RESOLVE_IN_ROOT. We keep that on purpose.
    Links in a sandbox are written by containers that see the workspace at
    their own mount point, and by tools (venvs, package managers) that point at
    the image's ``/usr``; IN_ROOT would silently re-read ``/usr/bin/python3`` as
    ``<sandbox>/usr/bin/python3``, a different file. A link leaving the root in
    any spelling is an escape attempt and is refused as SYMLINK_ESCAPE.

    RESOLVE_NO_MAGICLINKS keeps ``/proc/<pid>/{root,cwd,fd/N}``-style links from
    jumping anywhere, should procfs ever be reachable beneath a root.
    """

    _RESOLVE = _syscalls.RESOLVE_BENEATH | _syscalls.RESOLVE_NO_MAGICLINKS

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
        resolve = self._RESOLVE | (_syscalls.RESOLVE_NO_SYMLINKS if no_symlinks else 0)
        flags |= os.O_CLOEXEC | (0 if follow else os.O_NOFOLLOW)
        encoded = os.fsencode(path)
        for _ in range(_EAGAIN_ATTEMPTS - 1):
            try:
                return _syscalls.openat2(dir_fd, encoded, flags, mode, resolve)
            except OSError as exc:
                if exc.errno != errno.EAGAIN:
                    raise
        return _syscalls.openat2(dir_fd, encoded, flags, mode, resolve)


def make_resolver(use_openat2: bool | None = None) -> Resolver:
    """The kernel resolver when available (or asked for), else the userspace walk."""
    if use_openat2 is None:
        use_openat2 = _syscalls.openat2_available()
    return KernelResolver() if use_openat2 else WalkResolver()
