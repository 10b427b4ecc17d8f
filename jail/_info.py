"""PathInfo: what the jail reports about one entry."""

from __future__ import annotations

import os
import stat
from dataclasses import dataclass
from typing import Literal

Kind = Literal["file", "dir", "symlink", "other"]


@dataclass(frozen=True, slots=True)
class PathInfo:
    """One entry of the sandbox.

    Attributes:
        path: sandbox-relative POSIX path ("." for the root).
        kind: "file", "dir", "symlink", or "other" (FIFO, socket, device).
        size: size in bytes (for a link: the length of its target).
        mode: permission bits only (``stat.S_IMODE``); the type is in ``kind``.
        mtime_ns: modification time in nanoseconds since the epoch.
        link_target: the link's target text, for a symbolic link; else None.
    """

    path: str
    kind: Kind
    size: int
    mode: int
    mtime_ns: int
    link_target: str | None = None

    @classmethod
    def from_stat(cls, path: str, st: os.stat_result, link_target: str | None = None) -> PathInfo:
        return cls(
            path=path,
            kind=kind_of(st.st_mode),
            size=st.st_size,
            mode=stat.S_IMODE(st.st_mode),
            mtime_ns=st.st_mtime_ns,
            link_target=link_target,
        )


def kind_of(mode: int) -> Kind:
    if stat.S_ISREG(mode):
        return "file"
    if stat.S_ISDIR(mode):
        return "dir"
    if stat.S_ISLNK(mode):
        return "symlink"
    return "other"
