"""How a running daemon was started, read from /proc: what a test needs to start it
again exactly the same way after stopping it (dockerd_control, zfs_control)."""

from __future__ import annotations

import os
from pathlib import Path


def started_as(pid: int) -> tuple[list[str], dict[str, str], str]:
    """The process's command line, environment and working directory."""
    proc = Path(f"/proc/{pid}")
    argv = [a.decode() for a in (proc / "cmdline").read_bytes().split(b"\0") if a]
    env = dict(
        entry.decode().split("=", 1)
        for entry in (proc / "environ").read_bytes().split(b"\0")
        if b"=" in entry
    )
    return argv, env, os.readlink(proc / "cwd")
