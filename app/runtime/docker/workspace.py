"""Which host folder may become a container's writable ``/workspace``.

The only writable host mount a sandbox gets is its own workspace, so the check
is strict: an absolute path, lexically inside the slots base, not the base
itself, every component below the base a real directory (``lstat``, never
followed: a link could point at another tenant's slot or at the host), and
nowhere near the Docker socket. Folders below the base are created by the
server, never by a container (a container sees only its own workspace), so no
tenant can swap a component for a link between this check and the mount.
"""

from __future__ import annotations

import os
import stat
from collections.abc import Iterable
from pathlib import Path

from app.runtime.errors import WorkspaceRefused

# Where a Docker engine's socket usually is; a mount must never expose one.
DOCKER_SOCKETS = ("/var/run/docker.sock", "/run/docker.sock")


def check_workspace(workspace: Path, slots_base: Path) -> Path:
    """Return the real path of ``workspace`` to bind-mount, or raise.

    Raises:
        WorkspaceRefused: not absolute, ``..`` in it, outside the slots base,
            the base itself, missing, not a directory, or a link on the way.
    """
    if not workspace.is_absolute():
        raise WorkspaceRefused("not an absolute path")
    if ".." in workspace.parts:
        raise WorkspaceRefused("'..' in its path")
    real_base = slots_base.resolve()
    for base in (slots_base, real_base):
        try:
            relative = workspace.relative_to(base)
            break
        except ValueError:
            continue
    else:
        raise WorkspaceRefused("outside the slots folder")
    if not relative.parts:
        raise WorkspaceRefused("it is the slots folder itself, not one slot's folder")
    current = real_base
    for part in relative.parts:
        current = current / part
        try:
            mode = os.lstat(current).st_mode
        except FileNotFoundError:
            raise WorkspaceRefused("the folder does not exist") from None
        except OSError as exc:
            raise WorkspaceRefused(f"the folder cannot be inspected ({exc.strerror})") from None
        if stat.S_ISLNK(mode):
            raise WorkspaceRefused("a symbolic link in its path")
        if not stat.S_ISDIR(mode):
            raise WorkspaceRefused("a path component is not a folder")
    if os.path.realpath(current) != str(current):
        # Defence in depth: the walk above should make this impossible.
        raise WorkspaceRefused("it does not resolve to itself")
    return current


def refuse_docker_socket(sources: Iterable[str], sockets: Iterable[str] = DOCKER_SOCKETS) -> None:
    """Raise if any mount source is, or contains, a Docker socket.

    Raises:
        WorkspaceRefused: a source names ``docker.sock``, is a socket, or is a
            folder that holds one of ``sockets``.
    """
    real_sockets = [os.path.realpath(s) for s in sockets]
    for source in sources:
        real = os.path.realpath(source)
        if Path(source).name == "docker.sock" or Path(real).name == "docker.sock":
            raise WorkspaceRefused("it is the Docker socket")
        try:
            if stat.S_ISSOCK(os.stat(real).st_mode):
                raise WorkspaceRefused("it is a socket")
        except FileNotFoundError:
            pass
        for sock in real_sockets:
            if sock == real or sock.startswith(real.rstrip("/") + "/"):
                raise WorkspaceRefused("it contains the Docker socket")
