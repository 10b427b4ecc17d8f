"""A real daemon's process, for the fault tests that stop one and start it again
exactly as it was (zfs_control): how it was started (read from /proc), how to start
it again detached, and the services.sh pid files naming it; and ``wait_until``."""

from __future__ import annotations

import contextlib
import os
import subprocess
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

# Where .ci/lib/services.sh keeps its pid files (CI, an intermediate run, dev).
_SERVICE_ROOTS = ("/tmp/sandbox-mcp-ci", "/tmp/sandbox-mcp-dev")


@dataclass
class Daemon:
    pid: int
    argv: list[str]
    env: dict[str, str]
    cwd: str

    @classmethod
    def of(cls, pid: int) -> Daemon:
        """The process's command line, environment and working directory."""
        proc = Path(f"/proc/{pid}")
        argv = [a.decode() for a in (proc / "cmdline").read_bytes().split(b"\0") if a]
        env = dict(
            entry.decode().split("=", 1)
            for entry in (proc / "environ").read_bytes().split(b"\0")
            if b"=" in entry
        )
        return cls(pid, argv, env, os.readlink(proc / "cwd"))

    def start_again(self, log: Path) -> int:
        """Start the same command detached, its output appended to ``log``; its pid.

        Through a shell that backgrounds it and exits: the daemon outlives this test
        run (as the original did) and is no child of ours."""
        shell = 'exec 0</dev/null; "$@" >>"$DAEMON_LOG" 2>&1 & echo $!'
        spawned = subprocess.run(
            ["/bin/sh", "-c", shell, Path(self.argv[0]).name, *self.argv],
            env={**self.env, "DAEMON_LOG": str(log)},
            cwd=self.cwd,
            capture_output=True,
            text=True,
            start_new_session=True,
            check=True,
        )
        return int(spawned.stdout.strip())


def wait_until(condition: Callable[[], bool], timeout_s: float, what: str) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if condition():
            return
        time.sleep(0.2)
    raise AssertionError(f"{what} within {timeout_s} s")


def repoint_pid_files(name: str, old: int, new: int) -> None:
    """Point a services.sh pid file ``run/<name>.pid`` naming ``old`` at ``new``, so
    ``stop_services`` still stops the daemon it started."""
    roots = {os.environ.get("CI_WORK_DIR", ""), *_SERVICE_ROOTS}
    for root in filter(None, roots):
        path = Path(root) / "run" / f"{name}.pid"
        with contextlib.suppress(OSError, ValueError):
            if int(path.read_text().strip()) == old:
                path.write_text(f"{new}\n")
