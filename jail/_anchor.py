"""The sandbox root held as a directory descriptor, and errno translation for it."""

from __future__ import annotations

import errno
import os
import stat

from jail._oserrors import translate
from jail._paths import ROOT, join, quote
from jail._resolve import Resolver
from jail.errors import JailError

O_DIR_PATH = os.O_PATH | os.O_DIRECTORY


class Anchor:
    """Opens sandbox-relative paths beneath the root descriptor, raising JailError."""

    def __init__(self, root_fd: int, resolver: Resolver) -> None:
        self._fd = root_fd
        self._resolver = resolver

    @property
    def fd(self) -> int:
        if self._fd < 0:
            raise JailError("JAIL_CLOSED", "This sandbox handle is closed; start a new call.")
        return self._fd

    @property
    def resolver(self) -> Resolver:
        return self._resolver

    @property
    def closed(self) -> bool:
        return self._fd < 0

    def close(self) -> None:
        fd, self._fd = self._fd, -1
        if fd >= 0:
            os.close(fd)

    def open(
        self,
        path: str,
        flags: int,
        mode: int = 0,
        *,
        follow: bool = True,
        no_symlinks: bool = False,
        shown: str | None = None,
    ) -> int:
        """Resolve ``path`` beneath the root; errors name ``shown`` (default: path)."""
        try:
            return self._resolver.open(
                self.fd, path, flags, mode, follow=follow, no_symlinks=no_symlinks
            )
        except OSError as exc:
            raise self.explain(exc, path, shown=shown) from exc

    def open_dir(self, path: str, *, shown: str | None = None) -> int:
        """An O_PATH descriptor of the folder ``path``, usable as a ``dir_fd``."""
        return self.open(path, O_DIR_PATH, shown=shown)

    def explain(self, exc: OSError, path: str, *, shown: str | None = None) -> JailError:
        """Translate ``exc``; ENOENT caused by a dangling link becomes SYMLINK_UNRESOLVABLE.

        Dangling links are reported as unresolvable links rather than NOT_FOUND:
        the name the agent passed does exist, and "list the folder" would show it,
        so NOT_FOUND would send the agent in circles.
        """
        shown = path if shown is None else shown
        if exc.errno == errno.ENOENT and self._has_dangling_link(path):
            return self.dangling(shown)
        return translate(exc, shown)

    @staticmethod
    def dangling(shown: str) -> JailError:
        return JailError(
            "SYMLINK_UNRESOLVABLE",
            f"{quote(shown)} goes through a symbolic link whose target does not exist; "
            "fix or remove the link.",
            {"path": shown},
        )

    def _has_dangling_link(self, path: str) -> bool:
        # Error path only: re-walk the prefixes to find the one that failed.
        prefix = ROOT
        for part in path.split("/"):
            prefix = join(prefix, part)
            try:
                fd = self._resolver.open(self.fd, prefix, os.O_PATH, follow=False)
            except OSError:
                return False
            try:
                is_link = stat.S_ISLNK(os.fstat(fd).st_mode)
            finally:
                os.close(fd)
            if is_link:
                try:
                    os.close(self._resolver.open(self.fd, prefix, os.O_PATH))
                except OSError as exc:
                    return exc.errno == errno.ENOENT
        return False
