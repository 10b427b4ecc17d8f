"""Restarting the real zfs-fuse under a running server (fault tests).

DISRUPTIVE: every ZFS mount is dead while the daemon is down, whoever uses it
(zfs-fuse is one daemon per machine: its socket is compiled in); such tests carry
the ``restarts_shared_daemon`` mark, which runs them last in the session.

``zfs_fuse_restart`` stops the zfs-fuse serving this machine (found by its process),
lazily unmounts the FUSE mounts it leaves dead (deepest first), and starts it again
with the same argv, environment and log, detached, as ``.ci/lib/services.sh``
starts it, then waits until ``zpool list`` answers; a services.sh pid file naming
the old daemon is pointed at the new one. What the new daemon mounts by itself is
what the server under test gets. Afterwards (``restore_others``) the datasets that
were mounted before and are not now are mounted again, and the mounts that were
``nosuid,nodev`` sealed again, so other users of the pool find it as it was.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
from pathlib import Path

from daemon_proc import Daemon, repoint_pid_files, wait_until

from pool.mount_flags import seal

STOP_TIMEOUT_S = 30
START_TIMEOUT_S = 60


def current_daemon() -> tuple[Daemon, Path]:
    """The zfs-fuse process, and the log its output goes to."""
    found = [
        int(entry.name)
        for entry in Path("/proc").iterdir()
        if entry.name.isdigit() and _comm(entry) == "zfs-fuse"
    ]
    assert len(found) == 1, f"expected one zfs-fuse, found {found}"
    return Daemon.of(found[0]), Path(os.readlink(f"/proc/{found[0]}/fd/1"))


def _comm(proc: Path) -> str:
    try:
        return (proc / "comm").read_text().strip()
    except OSError:
        return ""


def answers() -> bool:
    done = subprocess.run(["zpool", "list", "-H"], capture_output=True, timeout=15, check=False)
    return done.returncode == 0


def zfs_mounts() -> dict[str, tuple[str, bool]]:
    """The zfs-fuse mounts now: mount point -> (dataset, sealed nosuid,nodev)."""
    mounts = {}
    for line in Path("/proc/self/mounts").read_text().splitlines():
        source, point, kind, options = line.split(" ")[:4]
        if kind == "fuse.zfs":
            flags = set(options.split(","))
            mounts[point.replace("\\040", " ")] = (source, {"nosuid", "nodev"} <= flags)
    return mounts


def _alive(pid: int) -> bool:
    return Path(f"/proc/{pid}").exists() and _comm(Path(f"/proc/{pid}")) == "zfs-fuse"


def _unmount_dead(points: list[str]) -> None:
    for point in sorted(points, reverse=True):  # deepest first
        try:
            os.stat(point)
        except OSError:
            subprocess.run(["umount", "-l", point], capture_output=True, timeout=15, check=False)


def zfs_fuse_restart() -> dict[str, tuple[str, bool]]:
    """Restart zfs-fuse; returns the mounts there were before (for ``restore_others``)."""
    daemon, log = current_daemon()
    before = zfs_mounts()
    os.kill(daemon.pid, signal.SIGTERM)
    try:
        wait_until(lambda: not _alive(daemon.pid), STOP_TIMEOUT_S, "zfs-fuse did not stop")
    finally:
        if _alive(daemon.pid):
            os.kill(daemon.pid, signal.SIGKILL)
            wait_until(lambda: not _alive(daemon.pid), STOP_TIMEOUT_S, "zfs-fuse did not die")
        _unmount_dead(list(before))
        new_pid = daemon.start_again(log)
        wait_until(answers, START_TIMEOUT_S, f"zfs-fuse did not answer again (log: {log})")
        repoint_pid_files("zfs-fuse", daemon.pid, new_pid)
    return before


def restore_others(before: dict[str, tuple[str, bool]]) -> None:
    """Mount again what was mounted before the restart, and seal again what was sealed."""
    now = zfs_mounts()
    for point in sorted(before):  # parents first
        dataset, sealed = before[point]
        if point not in now:
            subprocess.run(["zfs", "mount", dataset], capture_output=True, timeout=60, check=False)
        if sealed and Path(point).is_dir():
            with contextlib.suppress(Exception):
                seal(Path(point))
